// Dump-time Python introspection: everything here runs with the GIL held (see RunWithGil)
// and uses only the public C API, except PythonThreadsWithoutGil (the GIL cannot be had).
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "common/thread_id.h"
#include "python_api.h"

namespace ncclwatch {
namespace stacks {
namespace detail {
namespace {

// Owns one reference.
class PyRef {
 public:
  PyRef(const PythonApi& api, PyObject* object) : api_(api), object_(object) {}
  ~PyRef() {
    if (object_ != nullptr) api_.Py_DecRef(object_);
  }
  PyRef(const PyRef&) = delete;
  PyRef& operator=(const PyRef&) = delete;
  PyObject* get() const { return object_; }
  explicit operator bool() const { return object_ != nullptr; }

 private:
  const PythonApi& api_;
  PyObject* object_;
};

// Takes a reference on a borrowed object, so that Python code we call cannot free it under us.
PyRef Borrowed(const PythonApi& api, PyObject* object) {
  if (object != nullptr) api.Py_IncRef(object);
  return PyRef(api, object);
}

// str attribute as UTF-8; empty (and no exception left) when absent or not a str.
std::string StringAttr(const PythonApi& api, PyObject* object, const char* name) {
  PyRef value(api, api.PyObject_GetAttrString(object, name));
  const char* utf8 = value ? api.PyUnicode_AsUTF8(value.get()) : nullptr;
  if (utf8 == nullptr) {
    api.PyErr_Clear();
    return std::string();
  }
  return utf8;
}

// int attribute; false (and no exception left) when absent or not an int (e.g. None).
bool IntAttr(const PythonApi& api, PyObject* object, const char* name, long long* out) {
  PyRef value(api, api.PyObject_GetAttrString(object, name));
  if (!value) {
    api.PyErr_Clear();
    return false;
  }
  *out = api.PyLong_AsLongLong(value.get());
  if (*out == -1 && api.PyErr_Occurred() != nullptr) {
    api.PyErr_Clear();
    return false;
  }
  return true;
}

// Whether a directory named `component` appears in `path` ("a/torch/b.py", "torch/b.py").
bool PathHasComponent(const std::string& path, const char* component) {
  const std::string directory = std::string(component) + "/";
  return path.compare(0, directory.size(), directory) == 0 || path.find("/" + directory) != std::string::npos;
}

void AddNativeId(const PythonApi& api, PyObject* thread, std::unordered_map<unsigned long long, long long>* ids) {
  long long ident, native_id;
  if (IntAttr(api, thread, "ident", &ident) && IntAttr(api, thread, "native_id", &native_id)) {
    (*ids)[static_cast<unsigned long long>(ident)] = native_id;
  }
}

// A new list of the threading module's Thread objects, or null. A list of our own: reading
// their attributes runs bytecode, which may let other threads run (and change `_active`).
PyObject* ThreadObjects(const PythonApi& api, PyObject* threading) {
  PyRef active(api, api.PyObject_GetAttrString(threading, "_active"));
  if (PyObject* threads = active ? api.PyDict_Values(active.get()) : nullptr) return threads;
  api.PyErr_Clear();
  PyRef enumerate(api, api.PyObject_GetAttrString(threading, "enumerate"));
  return enumerate ? api.PyObject_CallObject(enumerate.get(), nullptr) : nullptr;
}

// ident -> native_id for the threads the threading module knows. threading is looked up in
// sys.modules, never imported (an import at dump time runs arbitrary code and takes locks).
// Its `_active` dict is read directly: threading.enumerate() takes a Python lock, which could
// block a caller that holds the GIL itself; enumerate() is only the fallback for interpreters
// without `_active`.
std::unordered_map<unsigned long long, long long> NativeIdsByIdent(const PythonApi& api) {
  std::unordered_map<unsigned long long, long long> ids;
  PyObject* modules = api.PySys_GetObject("modules");
  PyRef threading = Borrowed(api, modules != nullptr ? api.PyDict_GetItemString(modules, "threading") : nullptr);
  if (!threading) return ids;
  PyRef threads(api, ThreadObjects(api, threading.get()));
  const ssize_t count = threads ? api.PyList_Size(threads.get()) : 0;
  for (ssize_t i = 0; i < count; ++i) AddNativeId(api, api.PyList_GetItem(threads.get(), i), &ids);
  api.PyErr_Clear();
  return ids;
}

// Walks from `frame` (borrowed) outwards.
std::vector<PythonFrame> WalkFrames(const PythonApi& api, PyObject* frame, int max_frames,
                                    const std::string& stdlib_dir) {
  std::vector<PythonFrame> frames;
  PyObject* current = frame;
  api.Py_IncRef(current);
  while (current != nullptr && static_cast<int>(frames.size()) < max_frames) {
    PyRef code(api, api.PyFrame_GetCode(current));
    CodeNames names = NamesOfCode(api, code.get());
    PythonFrame out;
    out.line = api.PyFrame_GetLineNumber(current);
    out.library = IsLibraryFile(names.file, stdlib_dir);
    out.file = std::move(names.file);
    out.function = std::move(names.function);
    frames.push_back(std::move(out));
    PyObject* back = api.PyFrame_GetBack(current);  // new reference or null
    api.Py_DecRef(current);
    current = back;
  }
  if (current != nullptr) api.Py_DecRef(current);
  return frames;
}

}  // namespace

CodeNames NamesOfCode(const PythonApi& api, PyObject* code) {
  return CodeNames{StringAttr(api, code, "co_filename"), StringAttr(api, code, "co_name")};
}

std::string StandardLibraryDir(const PythonApi& api) {
  PyObject* modules = api.PySys_GetObject("modules");
  PyRef os = Borrowed(api, modules != nullptr ? api.PyDict_GetItemString(modules, "os") : nullptr);
  if (!os) return std::string();
  const std::string file = StringAttr(api, os.get(), "__file__");
  const size_t slash = file.rfind('/');
  return slash == std::string::npos ? std::string() : file.substr(0, slash);
}

bool IsLibraryFile(const std::string& file, const std::string& stdlib_dir) {
  if (file.compare(0, 8, "<frozen ") == 0) return true;  // frozen standard-library modules
  if (!stdlib_dir.empty() && file.size() > stdlib_dir.size() && file.compare(0, stdlib_dir.size(), stdlib_dir) == 0 &&
      file[stdlib_dir.size()] == '/') {
    return true;
  }
  for (const char* component : {"site-packages", "dist-packages", "torch", "deepspeed", "megatron"}) {
    if (PathHasComponent(file, component)) return true;
  }
  return false;
}

std::vector<PythonThread> CollectPythonThreads(const PythonApi& api, int max_frames) {
  std::vector<PythonThread> threads;
  const std::string stdlib_dir = StandardLibraryDir(api);
  const auto native_ids = NativeIdsByIdent(api);
  PyRef current_frames = Borrowed(api, api.PySys_GetObject("_current_frames"));
  PyRef frames(api, current_frames ? api.PyObject_CallObject(current_frames.get(), nullptr) : nullptr);
  if (!frames) {
    api.PyErr_Clear();
    return threads;
  }
  ssize_t position = 0;
  PyObject *ident, *frame;  // borrowed from `frames`
  while (api.PyDict_Next(frames.get(), &position, &ident, &frame)) {
    PythonThread thread;
    thread.ident = api.PyLong_AsUnsignedLongLong(ident);
    if (api.PyErr_Occurred() != nullptr) {
      api.PyErr_Clear();
      continue;
    }
    const auto native = native_ids.find(thread.ident);
    if (native != native_ids.end()) thread.native_id = native->second;
    thread.frames = WalkFrames(api, frame, max_frames, stdlib_dir);
    threads.push_back(std::move(thread));
  }
  return threads;
}

std::vector<PythonThread> PythonThreadsWithoutGil(const PythonApi& api, int max_frames) {
  std::vector<PythonThread> threads;
  const FrameWalker& walker = api.walker;
  if (walker.layout == nullptr || api.PyInterpreterState_Main == nullptr ||
      api.PyInterpreterState_ThreadHead == nullptr || !api.InterpreterUsable()) {
    return threads;
  }
  void* interp = api.PyInterpreterState_Main();
  if (interp == nullptr) return threads;
  constexpr int kMaxThreadStates = 1024;  // bounded: a longer list is a corrupt one
  std::vector<uintptr_t> tstates(kMaxThreadStates);
  std::vector<uint64_t> idents(kMaxThreadStates);
  const int count = OtherThreadStates(walker, reinterpret_cast<uintptr_t>(api.PyInterpreterState_ThreadHead(interp)),
                                      tstates.data(), idents.data(), kMaxThreadStates);
  std::vector<uintptr_t> code(max_frames);
  std::vector<int32_t> offset(max_frames);
  for (int i = 0; i < count; ++i) {
    const int frames = WalkOtherThreadFrames(walker, tstates[i], code.data(), offset.data(), max_frames);
    if (frames == 0) continue;
    PythonThread thread;
    thread.ident = idents[i];
    for (int f = 0; f < frames; ++f) {
      PythonFrame out;
      // Checked live first: the thread runs on, and a code object it no longer uses may be gone.
      if (IsLiveCodeObject(walker.code_type, code[f]) &&
          CodeNamesWithoutGil(walker, code[f], &out.file, &out.function)) {
        // The line table belongs to the live code object and is only read.
        out.line = api.PyCode_Addr2Line(reinterpret_cast<PyObject*>(code[f]), offset[f]);
        out.library = IsLibraryFile(out.file, std::string());
      }
      thread.frames.push_back(std::move(out));
    }
    threads.push_back(std::move(thread));
  }
  return threads;
}

// ---- the uncaught exception a Python job ends with ----
//
// CPython prints an uncaught exception with PyErr_Print, which raises the audit event
// "sys.excepthook" (type, value, traceback) right before it calls sys.excepthook, then it
// finalizes the interpreter and exits with status 1. A C audit hook of ours (PySys_AddAuditHook)
// sees that event: nothing Python code can list or count (no atexit callback, no sys.excepthook
// of ours), and it runs with the GIL before anything is torn down. Only the interpreter's own
// top-level report counts: on the main thread, with no Python frame left on it. An exception
// that a program handled itself and left in sys.last_value (code.interact does) never passes
// there. ExitPath keeps it only for an exit with a non-zero status (an interactive session that
// printed one and went on to exit 0 did not end because of it).

namespace {

// The few functions beyond PythonApi this needs, looked up when registering.
struct ExitApi {
  int (*PySys_AddAuditHook)(int (*)(const char*, PyObject*, void*), void*) = nullptr;
  PyObject* (*PyObject_Str)(PyObject*) = nullptr;
  PyObject* (*PyObject_Type)(PyObject*) = nullptr;
  ssize_t (*PyTuple_Size)(PyObject*) = nullptr;
  PyObject* (*PyTuple_GetItem)(PyObject*, ssize_t) = nullptr;
  unsigned long (*PyType_GetFlags)(PyObject*) = nullptr;
  int (*PyMapping_HasKeyString)(PyObject*, const char*) = nullptr;
  PyObject* none = nullptr;  // &_Py_NoneStruct
  PyObject* type_type = nullptr;   // &PyType_Type
  PyObject* tuple_type = nullptr;  // &PyTuple_Type
  std::vector<PyObject*> plain_types;  // str, int, float, bool, bytes: their str() and repr() run no Python code
};
ExitApi g_exit_api;  // written once, before the hook is added

std::mutex g_exception_mu;
std::optional<trace::UncaughtException> g_exception;  // guarded by g_exception_mu
std::atomic<bool> g_exit_watched{false};

// The message of an exception, cut (at a character boundary) to what a report line can hold.
constexpr size_t kMaxExceptionMessage = 512;

std::string Cut(std::string text) {
  if (text.size() <= kMaxExceptionMessage) return text;
  size_t end = kMaxExceptionMessage;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;  // not inside a character
  text.resize(end);
  return text + "...";
}

constexpr unsigned long kHeapTypeFlag = 1ul << 9;  // Py_TPFLAGS_HEAPTYPE: a class defined in Python (or like one)

bool IsPlain(const PythonApi& api, PyObject* value, int depth = 0) {
  const ExitApi& x = g_exit_api;
  if (value == x.none) return true;
  PyRef type(api, x.PyObject_Type(value));
  if (!type) return false;
  for (PyObject* plain : x.plain_types)
    if (type.get() == plain) return true;
  if (type.get() != x.tuple_type || depth > 1) return false;  // SyntaxError's (msg, (file, line, ...))
  const ssize_t n = x.PyTuple_Size(value);
  for (ssize_t i = 0; i < n; ++i)
    if (!IsPlain(api, x.PyTuple_GetItem(value, i), depth + 1)) return false;
  return true;
}

// Whether str(exception) runs no Python code: the class and its metaclass are built-in or
// defined without __str__, __getattribute__, __getattr__ or args of their own, and what the built-in __str__
// formats (args; OSError's file names) holds only plain values. Then its text is the one the
// interpreter printed, made again without anything the program could see.
bool StrRunsNoPythonCode(const PythonApi& api, PyObject* exception, PyObject* type) {
  const ExitApi& x = g_exit_api;
  PyRef metatype(api, x.PyObject_Type(type));
  if (metatype.get() != x.type_type) return false;  // a metaclass of its own: even attribute lookups may run code
  PyRef mro(api, api.PyObject_GetAttrString(type, "__mro__"));
  const ssize_t classes = mro ? x.PyTuple_Size(mro.get()) : -1;
  if (classes < 0) return false;
  for (ssize_t i = 0; i < classes; ++i) {
    PyObject* base = x.PyTuple_GetItem(mro.get(), i);  // borrowed
    if ((x.PyType_GetFlags(base) & kHeapTypeFlag) == 0) break;  // a built-in class: what it inherits is too
    PyRef dict(api, api.PyObject_GetAttrString(base, "__dict__"));
    if (!dict) return false;
    for (const char* name : {"__str__", "__getattribute__", "__getattr__", "args", "filename", "filename2", "__repr__"})
      if (x.PyMapping_HasKeyString(dict.get(), name)) return false;
  }
  for (const char* field : {"args", "filename", "filename2"}) {
    PyRef value(api, api.PyObject_GetAttrString(exception, field));
    if (!value) {
      api.PyErr_Clear();  // OSError's file names only
      if (std::strcmp(field, "args") == 0) return false;
      continue;
    }
    if (!IsPlain(api, value.get())) return false;
  }
  return true;
}

// The exception's message without running its class's own code a second time (the interpreter
// ran it once, to print it): str() where that runs no Python code, else its first argument when
// that is a str, else none.
std::string MessageOf(const PythonApi& api, PyObject* exception, PyObject* type) {
  const ExitApi& x = g_exit_api;
  std::string message;
  if (StrRunsNoPythonCode(api, exception, type)) {
    PyRef text(api, x.PyObject_Str(exception));
    const char* utf8 = text ? api.PyUnicode_AsUTF8(text.get()) : nullptr;
    if (utf8 != nullptr) message = utf8;
  } else {
    api.PyErr_Clear();
    PyRef args(api, api.PyObject_GetAttrString(exception, "args"));
    PyRef args_type(api, args ? x.PyObject_Type(args.get()) : nullptr);
    if (args_type.get() == x.tuple_type && x.PyTuple_Size(args.get()) >= 1) {
      PyObject* first = x.PyTuple_GetItem(args.get(), 0);
      PyRef first_type(api, x.PyObject_Type(first));
      if (!x.plain_types.empty() && first_type.get() == x.plain_types[0]) {  // exactly a str
        const char* utf8 = api.PyUnicode_AsUTF8(first);
        if (utf8 != nullptr) message = utf8;
      }
    }
  }
  api.PyErr_Clear();
  return Cut(std::move(message));
}

// Type, message and innermost traceback frame of `exception` (GIL held).
trace::UncaughtException DescribeException(const PythonApi& api, PyObject* exception, PyObject* traceback) {
  trace::UncaughtException e;
  PyRef type(api, g_exit_api.PyObject_Type(exception));
  if (type) {
    e.type = StringAttr(api, type.get(), "__qualname__");
    const std::string module = StringAttr(api, type.get(), "__module__");
    if (!module.empty() && module != "builtins" && module != "__main__") e.type = module + "." + e.type;
    e.message = MessageOf(api, exception, type.get());
  }
  api.PyErr_Clear();
  // The traceback's last entry is the innermost frame: where it was raised. Bounded walk.
  PyObject* tb = traceback;
  if (tb != nullptr) api.Py_IncRef(tb);  // new references from here
  for (int depth = 0; tb != nullptr && tb != g_exit_api.none && depth < 100000; ++depth) {
    PyObject* next = api.PyObject_GetAttrString(tb, "tb_next");
    if (next != nullptr && next != g_exit_api.none) {
      api.Py_DecRef(tb);
      tb = next;
      continue;
    }
    if (next != nullptr) api.Py_DecRef(next);
    PyRef frame(api, api.PyObject_GetAttrString(tb, "tb_frame"));
    PyRef code(api, frame ? api.PyFrame_GetCode(frame.get()) : nullptr);
    if (code) {
      CodeNames names = NamesOfCode(api, code.get());
      e.file = std::move(names.file);
      e.function = std::move(names.function);
    }
    long long line = 0;
    if (IntAttr(api, tb, "tb_lineno", &line)) e.line = line;
    break;
  }
  if (tb != nullptr) api.Py_DecRef(tb);
  api.PyErr_Clear();
  return e;
}

// The audit hook (any thread that holds the GIL, for every audited event: the event's name is
// all it looks at, unless it is the top-level report of an exception). Never fails the event.
int OnAuditEvent(const char* event, PyObject* args, void*) {
  if (event[0] != 's' || std::strcmp(event, "sys.excepthook") != 0) return 0;
  const PythonApi* api = GetPythonApi();
  // The interpreter's own report of what ends it: the main thread, no Python frame under it.
  // (A C extension that prints an error with PyErr_Print and goes on has its caller's frames.)
  if (api == nullptr || CurrentTid() != getpid() || api->PyEval_GetFrame() != nullptr) return 0;
  const ExitApi& x = g_exit_api;
  if (x.PyTuple_Size(args) != 4) return 0;  // (hook, type, value, traceback)
  PyObject* value = x.PyTuple_GetItem(args, 2);
  PyObject* traceback = x.PyTuple_GetItem(args, 3);
  if (value == nullptr || value == x.none) {
    api->PyErr_Clear();
    return 0;
  }
  PyRef held = Borrowed(*api, value);
  trace::UncaughtException e = DescribeException(*api, held.get(), traceback);
  {
    std::lock_guard<std::mutex> lock(g_exception_mu);
    g_exception = std::move(e);
  }
  api->PyErr_Clear();
  return 0;
}

// PySys_AddAuditHook(our hook) (GIL held); false when something is missing.
bool AddAuditHook() {
  ExitApi& x = g_exit_api;
  x.none = static_cast<PyObject*>(dlsym(RTLD_DEFAULT, "_Py_NoneStruct"));
  x.type_type = static_cast<PyObject*>(dlsym(RTLD_DEFAULT, "PyType_Type"));
  x.tuple_type = static_cast<PyObject*>(dlsym(RTLD_DEFAULT, "PyTuple_Type"));
  for (const char* name : {"PyUnicode_Type", "PyLong_Type", "PyFloat_Type", "PyBool_Type", "PyBytes_Type"}) {
    if (auto* type = static_cast<PyObject*>(dlsym(RTLD_DEFAULT, name))) x.plain_types.push_back(type);
    else return false;
  }
  if (!Lookup(&x.PySys_AddAuditHook, "PySys_AddAuditHook") || !Lookup(&x.PyObject_Str, "PyObject_Str") ||
      !Lookup(&x.PyObject_Type, "PyObject_Type") || !Lookup(&x.PyTuple_Size, "PyTuple_Size") ||
      !Lookup(&x.PyTuple_GetItem, "PyTuple_GetItem") || !Lookup(&x.PyType_GetFlags, "PyType_GetFlags") ||
      !Lookup(&x.PyMapping_HasKeyString, "PyMapping_HasKeyString") || !x.none || !x.type_type || !x.tuple_type) {
    return false;
  }
  return x.PySys_AddAuditHook(&OnAuditEvent, nullptr) == 0;
}

}  // namespace

}  // namespace detail

bool WatchPythonExit(int gil_timeout_ms) {
  using namespace detail;
  if (g_exit_watched.load() || GetPythonApi() == nullptr) return true;
  const GilResult r = RunWithGil(
      [](const PythonApi& api) {
        if (!g_exit_watched.exchange(true)) AddAuditHook();  // once, even if a caller gave up waiting
        api.PyErr_Clear();
      },
      gil_timeout_ms);
  return r != GilResult::kTimedOut;  // no interpreter (yet) or no helper: nothing to retry for
}

bool LastUncaughtException(trace::UncaughtException* out) {
  std::lock_guard<std::mutex> lock(detail::g_exception_mu);
  if (!detail::g_exception) return false;
  *out = *detail::g_exception;
  return true;
}

}  // namespace stacks
}  // namespace ncclwatch
