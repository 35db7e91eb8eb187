// Dump-time Python introspection: everything here runs with the GIL held (see RunWithGil)
// and uses only the public C API.
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

}  // namespace detail
}  // namespace stacks
}  // namespace ncclwatch
