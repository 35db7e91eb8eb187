// Dump-time Python introspection: everything here runs with the GIL held (see RunWithGil)
// and uses only the public C API, except PythonThreadsWithoutGil (the GIL cannot be had).
#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <unordered_map>

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
// CPython prints an uncaught exception and keeps it on `sys` (sys.last_exc from 3.12,
// sys.last_value before), then finalizes the interpreter and only then calls exit(): the exit
// record is written too late to read it. An atexit function of ours, registered once under the
// GIL, runs early in finalization, with the GIL, and keeps what the record needs.

namespace {

// The few functions beyond PythonApi this needs, looked up when registering.
struct ExitApi {
  PyObject* (*PyCFunction_NewEx)(void*, PyObject*, PyObject*) = nullptr;
  PyObject* (*PyImport_ImportModule)(const char*) = nullptr;
  PyObject* (*PyObject_Str)(PyObject*) = nullptr;
  PyObject* (*PyTuple_Pack)(ssize_t, ...) = nullptr;
  PyObject* none = nullptr;  // &_Py_NoneStruct
};
ExitApi g_exit_api;  // written once, under the GIL, before the callback can run

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

// Type, message and innermost traceback frame of `exception` (GIL held).
trace::UncaughtException DescribeException(const PythonApi& api, PyObject* exception) {
  trace::UncaughtException e;
  PyRef type(api, api.PyObject_GetAttrString(exception, "__class__"));
  if (type) {
    e.type = StringAttr(api, type.get(), "__qualname__");
    const std::string module = StringAttr(api, type.get(), "__module__");
    if (!module.empty() && module != "builtins" && module != "__main__") e.type = module + "." + e.type;
  }
  api.PyErr_Clear();
  PyRef text(api, g_exit_api.PyObject_Str(exception));
  const char* utf8 = text ? api.PyUnicode_AsUTF8(text.get()) : nullptr;
  if (utf8 != nullptr) e.message = Cut(utf8);
  api.PyErr_Clear();
  // The traceback's last entry is the innermost frame: where it was raised. Bounded walk.
  PyObject* tb = api.PyObject_GetAttrString(exception, "__traceback__");  // new references from here
  for (int depth = 0; tb != nullptr && tb != g_exit_api.none && depth < 100000; ++depth) {
    PyObject* next = api.PyObject_GetAttrString(tb, "tb_next");
    if (next != nullptr && next != g_exit_api.none) {
      api.Py_DecRef(tb);
      tb = next;
      continue;
    }
    if (next != nullptr) api.Py_DecRef(next);
    PyRef frame(api, api.PyObject_GetAttrString(tb, "tb_frame"));
    PyRef code(api, frame ? api.PyObject_GetAttrString(frame.get(), "f_code") : nullptr);
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

// atexit function (METH_NOARGS; registered only where the API was found): keeps the exception
// the interpreter printed, if any.
PyObject* AtPythonExit(PyObject*, PyObject*) {
  const PythonApi& api = *GetPythonApi();
  PyObject* exception = api.PySys_GetObject("last_exc");  // borrowed; 3.12+
  if (exception == nullptr || exception == g_exit_api.none) exception = api.PySys_GetObject("last_value");
  if (exception != nullptr && exception != g_exit_api.none) {
    PyRef held = Borrowed(api, exception);
    trace::UncaughtException e = DescribeException(api, held.get());
    std::lock_guard<std::mutex> lock(g_exception_mu);
    g_exception = std::move(e);
  }
  api.PyErr_Clear();
  api.Py_IncRef(g_exit_api.none);
  return g_exit_api.none;
}

// CPython's PyMethodDef.
struct MethodDef {
  const char* name;
  PyObject* (*method)(PyObject*, PyObject*);
  int flags;
  const char* doc;
};
constexpr int kMethNoArgs = 0x0004;
MethodDef g_at_exit_def{"ncclwatch_at_exit", &AtPythonExit, kMethNoArgs, nullptr};

// atexit.register(our function) (GIL held); false when something is missing.
bool RegisterAtExit(const PythonApi& api) {
  ExitApi& x = g_exit_api;
  x.PyCFunction_NewEx = reinterpret_cast<decltype(x.PyCFunction_NewEx)>(dlsym(RTLD_DEFAULT, "PyCFunction_NewEx"));
  x.PyImport_ImportModule =
      reinterpret_cast<decltype(x.PyImport_ImportModule)>(dlsym(RTLD_DEFAULT, "PyImport_ImportModule"));
  x.PyObject_Str = reinterpret_cast<decltype(x.PyObject_Str)>(dlsym(RTLD_DEFAULT, "PyObject_Str"));
  x.PyTuple_Pack = reinterpret_cast<decltype(x.PyTuple_Pack)>(dlsym(RTLD_DEFAULT, "PyTuple_Pack"));
  x.none = static_cast<PyObject*>(dlsym(RTLD_DEFAULT, "_Py_NoneStruct"));
  if (!x.PyCFunction_NewEx || !x.PyImport_ImportModule || !x.PyObject_Str || !x.PyTuple_Pack || !x.none) return false;
  PyRef atexit(api, x.PyImport_ImportModule("atexit"));  // a built-in module: no code of the job runs
  PyRef reg(api, atexit ? api.PyObject_GetAttrString(atexit.get(), "register") : nullptr);
  PyRef function(api, reg ? x.PyCFunction_NewEx(&g_at_exit_def, nullptr, nullptr) : nullptr);
  PyRef args(api, function ? x.PyTuple_Pack(1, function.get()) : nullptr);
  PyRef result(api, args ? api.PyObject_CallObject(reg.get(), args.get()) : nullptr);
  api.PyErr_Clear();
  return static_cast<bool>(result);
}

}  // namespace

}  // namespace detail

bool WatchPythonExit(int gil_timeout_ms) {
  using namespace detail;
  if (g_exit_watched.load() || GetPythonApi() == nullptr) return true;
  const GilResult r = RunWithGil(
      [](const PythonApi& api) {
        if (!g_exit_watched.exchange(true)) RegisterAtExit(api);  // once, even if a caller gave up waiting
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
