// CPython, found at run time (internal to lib/stacks).
//
// libpython is never linked: the few public C-API functions used are looked up once with
// dlsym(RTLD_DEFAULT), so a process without CPython pays nothing and a process with it works
// whatever its Python version (3.9+, which has PyFrame_GetCode/PyFrame_GetBack). PyObject is
// opaque here: only functions are called, except on the hot path, where the frames of the
// calling thread are read without the GIL at offsets known per version (python_frames.h).
#pragma once

#include <dlfcn.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "python_frames.h"
#include "stacks.h"

namespace ncclwatch {
namespace stacks {
namespace detail {

// `*slot` = the interpreter's function `name` (in the process: never linked); false when absent.
template <typename Fn>
bool Lookup(Fn* slot, const char* name) {
  *slot = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
  return *slot != nullptr;
}

struct PyObject;  // opaque

struct PythonApi {
  // Used on the hot path.
  int (*Py_IsInitialized)();
  int (*IsFinalizing)();  // Py_IsFinalizing (3.13+) or _Py_IsFinalizing; may be null
  int (*PyGILState_Check)();
  void* (*PyGILState_GetThisThreadState)();
  void* (*UncheckedThreadState)();  // PyThreadState_GetUnchecked / _PyThreadState_UncheckedGet; may be null
  PyObject* (*PyEval_GetFrame)();
  PyObject* (*PyFrame_GetCode)(PyObject*);
  PyObject* (*PyFrame_GetBack)(PyObject*);
  int (*PyFrame_GetLineNumber)(PyObject*);
  int (*PyFrame_GetLasti)(PyObject*);  // 3.11+; may be null
  void (*Py_IncRef)(PyObject*);
  void (*Py_DecRef)(PyObject*);
  // Used at dump time, under the GIL.
  int (*PyGILState_Ensure)();  // returns PyGILState_STATE
  void (*PyGILState_Release)(int);
  PyObject* (*PySys_GetObject)(const char*);
  PyObject* (*PyObject_GetAttrString)(PyObject*, const char*);
  PyObject* (*PyObject_CallObject)(PyObject*, PyObject*);
  PyObject* (*PyDict_GetItemString)(PyObject*, const char*);
  int (*PyDict_Next)(PyObject*, ssize_t*, PyObject**, PyObject**);
  PyObject* (*PyDict_Values)(PyObject*);
  ssize_t (*PyList_Size)(PyObject*);
  PyObject* (*PyList_GetItem)(PyObject*, ssize_t);
  long long (*PyLong_AsLongLong)(PyObject*);
  unsigned long long (*PyLong_AsUnsignedLongLong)(PyObject*);
  const char* (*PyUnicode_AsUTF8)(PyObject*);
  PyObject* (*PyErr_Occurred)();
  void (*PyErr_Clear)();
  void (*PyErr_Fetch)(PyObject**, PyObject**, PyObject**);
  void (*PyErr_Restore)(PyObject*, PyObject*, PyObject*);
  int (*PyCode_Addr2Line)(PyObject*, int);
  // Used at dump time without the GIL (plain reads of the runtime's structures); may be null.
  void* (*PyInterpreterState_Main)() = nullptr;
  void* (*PyInterpreterState_ThreadHead)(void*) = nullptr;

  // Reads the calling thread's frames without the GIL; walker.layout is null when this
  // CPython's layout is not known (then frames_problem says why, once, for the log).
  FrameWalker walker;
  char frames_problem[192] = {};
  uintptr_t code_type = 0;  // &PyCode_Type

  // Where a frame is in its code, as stored in call sites: the byte offset of its current
  // instruction where the walker or the API gives it (cheap), else its line number (a scan of
  // the line table per frame, which would cost ~20 ns per small frame on the hot path and more
  // for long functions). One kind per process: positions_are_offsets.
  bool positions_are_offsets = false;
  int PositionOf(PyObject* frame) const {
    return PyFrame_GetLasti != nullptr ? PyFrame_GetLasti(frame) : PyFrame_GetLineNumber(frame);
  }
  // The line of a position stored in a call site (GIL held).
  int LineOf(PyObject* code, int position) const {
    return positions_are_offsets ? PyCode_Addr2Line(code, position) : position;
  }

  // The interpreter's machine code (the executable segment holding PyEval_GetFrame: libpython,
  // or the python executable when it is linked in); empty when unknown.
  uintptr_t interpreter_code_begin = 0;
  uintptr_t interpreter_code_end = 0;
  bool InInterpreter(uintptr_t ip) const { return ip >= interpreter_code_begin && ip < interpreter_code_end; }

  // True when the interpreter is initialized and not finalizing.
  bool InterpreterUsable() const;
  // True when the calling thread holds the GIL of the main interpreter (call it only while
  // InterpreterUsable()). PyGILState_Check alone
  // answers 1 when it is disabled (once subinterpreters exist), so its answer is confirmed by
  // comparing the attached thread state with this thread's GILState thread state.
  bool ThisThreadHoldsGil() const;
};

// The process's CPython API, or nullptr when it has none. Resolved once, on first use; safe to
// call from many threads (late callers wait for the one doing the lookup).
const PythonApi* GetPythonApi();

// Hot path: the innermost `max` Python frames of the calling thread as (code object, position
// (see PositionOf)); returns how many were stored (0 without CPython, when the thread runs no
// Python code, or when Python call sites are off). With the frame walker, whether the thread
// holds the GIL or not; without it, only when it does (through the C API). *gil_held says
// whether it held the GIL. The code pointers are borrowed (alive while the frames are); see
// RetainCodeObjects.
int CapturePythonFrames(uintptr_t* code, int32_t* position, int max, bool* gil_held);
// For a calling thread without Python frames (a C++ thread: autograd's, a library's), in a
// process running CPython with the frame walker: the Python frames of the thread that drives
// it, the interpreter's first thread state (the main thread, which e.g. waits in backward()),
// read without the GIL through guarded reads (that thread runs on). Same output as
// CapturePythonFrames; 0 when there is none (or it is the caller's own state).
int CaptureDriverPythonFrames(uintptr_t* code, int32_t* position, int max);
// Takes one reference on each code object so that it outlives its frames (GIL held). A call
// site interned without the GIL borrows its code objects until the first dump names them: each
// is checked to still be a live code object first (IsLiveCodeObject); one freed and replaced by
// another code object at the same address would get the new one's name, the one case this
// cannot tell.
void RetainCodeObjects(const uintptr_t* code, int count);
// Python frames in call sites on (the default) or off, for the whole process.
void SetPythonCallsitesEnabled(bool enabled);
// How many of `ips` (innermost first) come before the first frame of the interpreter's code.
// Outside of that, a call site with Python frames has only interpreter frames, which add nothing
// to the Python frames and change as CPython specializes its bytecode (the same Python line
// would otherwise give a new call site after its first runs).
int FramesBeforeInterpreter(const uintptr_t* ips, int count);

// ---- dump time ----
enum class GilResult {
  kRan,        // `work` ran to completion under the GIL
  kNoPython,   // no CPython in the process, or not initialized / finalizing
  kTimedOut,   // the GIL was not obtained in time
  kNoHelper,   // the helper thread could not be created
};
const char* GilResultText(GilResult result);

// Runs `work` with the GIL held, waiting at most timeout_ms. When the calling thread already
// holds the GIL, `work` runs right here. Otherwise a helper thread takes the GIL with
// PyGILState_Ensure and runs it; if that does not happen in time, the caller returns
// kTimedOut and `work` never runs. A helper blocked on the GIL stays blocked until the GIL is
// free, then serves whatever is queued by then and exits (meanwhile its thread state is one
// more thread for faulthandler and sys._current_frames(): only while a thread keeps the GIL
// from it); while it waits, other requests wait only until the GIL has been unavailable for
// their timeout. `work` that did start may outlive
// a timed-out caller: it must write only to state it owns (captured by value / shared_ptr).
// With `finish_late`, `work` that timed out stays queued and runs once the GIL is free (naming
// code objects while they live: at the end, the interpreter may be gone).
GilResult RunWithGil(std::function<void(const PythonApi&)> work, int timeout_ms, bool finish_late = false);

// Names of a code object (under the GIL).
struct CodeNames {
  std::string file;
  std::string function;
};
CodeNames NamesOfCode(const PythonApi& api, PyObject* code);

// The directory of the standard library (dirname of os.__file__), empty if unknown (GIL held).
std::string StandardLibraryDir(const PythonApi& api);
// Whether a frame in `file` belongs to a library rather than to the user's own code.
bool IsLibraryFile(const std::string& file, const std::string& stdlib_dir);

struct PythonThread {
  unsigned long long ident = 0;  // threading.get_ident()
  long long native_id = -1;      // Thread.native_id (the tid), -1 when unknown
  std::vector<PythonFrame> frames;  // innermost first
};
// Every Python thread with a frame (sys._current_frames), matched to its native id through
// threading.enumerate() (GIL held).
std::vector<PythonThread> CollectPythonThreads(const PythonApi& api, int max_frames);

// When the GIL cannot be had (a thread holds it: spinning in Python, or in C code that keeps
// it): the Python frames of every thread of the main interpreter, read without the GIL from its
// thread-state list (python_frames.h: guarded reads, bounded walks, code objects checked live
// and named only when their names are compact ASCII strings; lines from the code's line table,
// which is read, never written). `ident` is each thread's pthread_self(). Empty without a frame
// walker for this CPython.
std::vector<PythonThread> PythonThreadsWithoutGil(const PythonApi& api, int max_frames);

}  // namespace detail
}  // namespace stacks
}  // namespace ncclwatch
