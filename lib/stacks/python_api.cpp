#include "python_api.h"

#include "common/own_thread.h"
#include "common/timing.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

namespace ncclwatch {
namespace stacks {
namespace detail {
namespace {

enum ApiState : int { kUnresolved, kResolving, kAbsent, kPresent };
std::atomic<int> g_api_state{kUnresolved};
PythonApi g_api;  // written once, before g_api_state becomes kAbsent/kPresent
std::atomic<bool> g_python_callsites{true};

// Sets the interpreter's code range: the executable PT_LOAD segment holding PyEval_GetFrame.
void FindInterpreterCode(PythonApi* api) {
  struct Search {
    uintptr_t address;
    uintptr_t begin = 0, end = 0;
  } search{reinterpret_cast<uintptr_t>(api->PyEval_GetFrame)};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* arg) {
        auto* s = static_cast<Search*>(arg);
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& segment = info->dlpi_phdr[i];
          if (segment.p_type != PT_LOAD || (segment.p_flags & PF_X) == 0) continue;
          const uintptr_t begin = info->dlpi_addr + segment.p_vaddr;
          if (s->address >= begin && s->address < begin + segment.p_memsz) {
            s->begin = begin;
            s->end = begin + segment.p_memsz;
            return 1;
          }
        }
        return 0;
      },
      &search);
  api->interpreter_code_begin = search.begin;
  api->interpreter_code_end = search.end;
}

// 3.13 publishes its own layout in _PyRuntime.debug_offsets (Include/internal/pycore_runtime.h,
// struct _Py_DebugOffsets, stable within 3.13). The table must agree with it; this also refuses
// a free-threaded build, whose objects have another header. Positions of the fields in that
// struct: offsetof() against the 3.13.0 headers, as pystack reads them.
bool DebugOffsetsAgree(const FrameLayout& layout, char* problem, size_t size) {
  const auto* runtime = static_cast<const unsigned char*>(dlsym(RTLD_DEFAULT, "_PyRuntime"));
  const auto field = [runtime](size_t offset) {
    uint64_t value;
    std::memcpy(&value, runtime + offset, sizeof value);
    return value;
  };
  const char* why = nullptr;
  if (runtime == nullptr || std::memcmp(runtime, "xdebugpy", 8) != 0) {
    why = "no _PyRuntime.debug_offsets";
  } else if (((field(8) >> 16) & 0xff) != static_cast<uint64_t>(layout.minor)) {
    why = "_PyRuntime.debug_offsets is of another version";
  } else if (field(16) != 0) {
    why = "a free-threaded build";
  } else if (field(184) != static_cast<uint64_t>(layout.tstate_frame) ||
             field(232) != static_cast<uint64_t>(layout.frame_back) ||
             field(240) != static_cast<uint64_t>(layout.frame_code) ||
             field(248) != static_cast<uint64_t>(layout.frame_instr) ||
             field(264) != static_cast<uint64_t>(layout.frame_owner) ||
             field(344) != static_cast<uint64_t>(layout.code_adaptive) || field(360) != 8) {
    why = "its frame layout differs from the one this ncclwatch knows";
  }
  if (why != nullptr) std::snprintf(problem, size, "Python 3.%d: %s", layout.minor, why);
  return why == nullptr;
}

// Chooses the frame walker's layout from the running interpreter's version; on failure leaves
// the walker off and says why in frames_problem.
void SetUpFrameWalker(PythonApi* api) {
  int major = 0, minor = 0;
  if (const auto* hex = static_cast<const unsigned long*>(dlsym(RTLD_DEFAULT, "Py_Version"))) {  // 3.11+
    major = static_cast<int>((*hex >> 24) & 0xff);
    minor = static_cast<int>((*hex >> 16) & 0xff);
  } else if (const auto version = reinterpret_cast<const char* (*)()>(dlsym(RTLD_DEFAULT, "Py_GetVersion"))) {
    if (std::sscanf(version(), "%d.%d", &major, &minor) != 2) major = minor = 0;
  }
  const size_t size = sizeof api->frames_problem;
  const FrameLayout* layout = FrameLayoutFor(major, minor);
  const uintptr_t code_type = reinterpret_cast<uintptr_t>(dlsym(RTLD_DEFAULT, "PyCode_Type"));
  const uintptr_t frame_type = reinterpret_cast<uintptr_t>(dlsym(RTLD_DEFAULT, "PyFrame_Type"));
  api->code_type = code_type;
  if (layout == nullptr) {
    std::snprintf(api->frames_problem, size, "Python %d.%d: its frame layout is not known to this ncclwatch", major,
                  minor);
  } else if (dlsym(RTLD_DEFAULT, "_Py_PrintReferences") != nullptr) {  // objects carry 2 more pointers
    std::snprintf(api->frames_problem, size, "Python %d.%d: a Py_TRACE_REFS build", major, minor);
  } else if (code_type == 0 || frame_type == 0) {
    std::snprintf(api->frames_problem, size, "Python %d.%d: no PyCode_Type or PyFrame_Type", major, minor);
  } else if (minor < 13 || DebugOffsetsAgree(*layout, api->frames_problem, size)) {
    api->walker = FrameWalker{layout, code_type, frame_type,
                              reinterpret_cast<uintptr_t>(dlsym(RTLD_DEFAULT, "PyUnicode_Type"))};
    return;
  }
  std::strncat(api->frames_problem, ": call sites show Python frames only where the caller holds the GIL",
               size - std::strlen(api->frames_problem) - 1);
}

// Fills g_api; false when a required function is missing (no CPython, or one older than 3.9).
bool ResolvePythonApi() {
  PythonApi& a = g_api;
  bool ok = Lookup(&a.Py_IsInitialized, "Py_IsInitialized") &&
            Lookup(&a.PyGILState_Check, "PyGILState_Check") &&
            Lookup(&a.PyGILState_GetThisThreadState, "PyGILState_GetThisThreadState") &&
            Lookup(&a.PyEval_GetFrame, "PyEval_GetFrame") && Lookup(&a.PyFrame_GetCode, "PyFrame_GetCode") &&
            Lookup(&a.PyFrame_GetBack, "PyFrame_GetBack") &&
            Lookup(&a.PyFrame_GetLineNumber, "PyFrame_GetLineNumber") && Lookup(&a.Py_IncRef, "Py_IncRef") &&
            Lookup(&a.Py_DecRef, "Py_DecRef") && Lookup(&a.PyGILState_Ensure, "PyGILState_Ensure") &&
            Lookup(&a.PyGILState_Release, "PyGILState_Release") && Lookup(&a.PySys_GetObject, "PySys_GetObject") &&
            Lookup(&a.PyObject_GetAttrString, "PyObject_GetAttrString") &&
            Lookup(&a.PyObject_CallObject, "PyObject_CallObject") &&
            Lookup(&a.PyDict_GetItemString, "PyDict_GetItemString") && Lookup(&a.PyDict_Next, "PyDict_Next") &&
            Lookup(&a.PyDict_Values, "PyDict_Values") &&
            Lookup(&a.PyList_Size, "PyList_Size") && Lookup(&a.PyList_GetItem, "PyList_GetItem") &&
            Lookup(&a.PyLong_AsLongLong, "PyLong_AsLongLong") &&
            Lookup(&a.PyLong_AsUnsignedLongLong, "PyLong_AsUnsignedLongLong") &&
            Lookup(&a.PyUnicode_AsUTF8, "PyUnicode_AsUTF8") && Lookup(&a.PyErr_Occurred, "PyErr_Occurred") &&
            Lookup(&a.PyErr_Clear, "PyErr_Clear") && Lookup(&a.PyErr_Fetch, "PyErr_Fetch") &&
            Lookup(&a.PyErr_Restore, "PyErr_Restore") && Lookup(&a.PyCode_Addr2Line, "PyCode_Addr2Line");
  // Optional: newer, or renamed across versions.
  Lookup(&a.PyFrame_GetLasti, "PyFrame_GetLasti");
  Lookup(&a.PyInterpreterState_Main, "PyInterpreterState_Main");
  Lookup(&a.PyInterpreterState_ThreadHead, "PyInterpreterState_ThreadHead");
  Lookup(&a.IsFinalizing, "Py_IsFinalizing") || Lookup(&a.IsFinalizing, "_Py_IsFinalizing");
  Lookup(&a.UncheckedThreadState, "PyThreadState_GetUnchecked") ||
      Lookup(&a.UncheckedThreadState, "_PyThreadState_UncheckedGet");
  if (ok) {
    FindInterpreterCode(&a);
    SetUpFrameWalker(&a);
    a.positions_are_offsets = a.walker.layout != nullptr || a.PyFrame_GetLasti != nullptr;
  }
  return ok;
}

// ---- RunWithGil ----

using Clock = std::chrono::steady_clock;

struct GilRequest {
  std::function<void(const PythonApi&)> work;
  bool finished = false;  // the helper is done with it
  bool ran = false;       // `work` ran (false: the interpreter became unusable first)
};

// Takes the GIL for dump-time requests on a helper thread. One helper at a time: it takes the
// GIL, runs every queued request, releases it, and leaves when no request is left. A helper
// that cannot get the GIL stays blocked in PyGILState_Ensure until it can. Requests wait at
// most their timeout, and not past `timeout` after the helper began waiting for the GIL
// (timing::kMinGilWait aside): once the GIL has been unavailable that long, further requests give up
// quickly, so a dump with many call sites waits about one timeout in all, not one per site.
class GilHelper {
 public:
  explicit GilHelper(const PythonApi* api) : api_(api) {}

  GilResult Run(std::function<void(const PythonApi&)> work, int timeout_ms, bool finish_late) {
    auto request = std::make_shared<GilRequest>();
    request->work = std::move(work);
    std::unique_lock<std::mutex> lock(mu_);
    const Clock::time_point now = Clock::now();
    const auto timeout = std::chrono::milliseconds(timeout_ms);
    if (!running_) {
      if (!Start()) return GilResult::kNoHelper;
      running_ = true;
      waiting_since_ = now;
    }
    const Clock::time_point deadline =
        holding_ ? now + timeout : std::min(now + timeout, std::max(waiting_since_ + timeout, now + timing::kMinGilWait));
    queue_.push_back(request);
    if (!cv_.wait_until(lock, deadline, [&] { return request->finished; })) {
      if (!finish_late) queue_.erase(std::remove(queue_.begin(), queue_.end(), request), queue_.end());
      return GilResult::kTimedOut;
    }
    return request->ran ? GilResult::kRan : GilResult::kNoPython;
  }

 private:
  // Starts the detached helper with every signal blocked except the stack signal and the
  // faults (OwnThreadMask says why): process-directed signals must go to the application's
  // threads, but a dump should still see this thread's stack.
  bool Start() {
    pthread_t thread;
    return StartOwnThread(&thread, &GilHelper::Main, this, ThreadStackSignal(), /*detached=*/true) == 0;
  }

  static void* Main(void* self) {
    WarmAllocator();
    pthread_setname_np(pthread_self(), "ncclwatch-gil");
    MarkOwnThread();
    static_cast<GilHelper*>(self)->Serve();
    UnmarkOwnThread();  // its tid may be another thread's next
    return nullptr;
  }

  void Serve() {
    for (;;) {
      const bool usable = api_->InterpreterUsable();
      const int gil_state = usable ? api_->PyGILState_Ensure() : 0;
      std::vector<std::shared_ptr<GilRequest>> batch;
      {
        std::lock_guard<std::mutex> lock(mu_);
        holding_ = usable;
        batch.swap(queue_);  // requests that timed out have left the queue, unless they finish late
      }
      for (const auto& request : batch) {
        if (!usable || !api_->InterpreterUsable()) break;
        request->work(*api_);
        api_->PyErr_Clear();  // never leave an exception behind
        request->ran = true;
      }
      if (usable) api_->PyGILState_Release(gil_state);
      std::lock_guard<std::mutex> lock(mu_);
      holding_ = false;
      for (const auto& request : batch) request->finished = true;
      cv_.notify_all();
      if (queue_.empty() || !usable) {
        running_ = false;
        return;
      }
      waiting_since_ = Clock::now();  // requests that came while it held the GIL: go again
    }
  }

  const PythonApi* api_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<GilRequest>> queue_;
  bool running_ = false;  // a helper thread exists
  bool holding_ = false;  // it holds the GIL right now
  Clock::time_point waiting_since_;  // when it began waiting for the GIL
};

// Leaked on purpose: a blocked helper thread may outlive everything, and dumps run at exit.
GilHelper*& TheGilHelper() {
  static GilHelper* helper = new GilHelper(&g_api);
  return helper;
}

// A forked child has no helper thread, and the parent's may have held the helper's mutex.
void ResetGilHelperInChild() { TheGilHelper() = new GilHelper(&g_api); }

}  // namespace

bool PythonApi::InterpreterUsable() const {
  return Py_IsInitialized() != 0 && (IsFinalizing == nullptr || IsFinalizing() == 0);
}

bool PythonApi::ThisThreadHoldsGil() const {
  if (PyGILState_Check() == 0) return false;
  if (UncheckedThreadState == nullptr) return true;
  void* attached = UncheckedThreadState();
  return attached != nullptr && attached == PyGILState_GetThisThreadState();
}

const PythonApi* GetPythonApi() {
  int state = g_api_state.load(std::memory_order_acquire);
  if (state == kUnresolved && g_api_state.compare_exchange_strong(state, kResolving)) {
    state = ResolvePythonApi() ? kPresent : kAbsent;
    g_api_state.store(state, std::memory_order_release);
  }
  while (state == kResolving) {  // another thread is in the few dlsym calls
    sched_yield();
    state = g_api_state.load(std::memory_order_acquire);
  }
  return state == kPresent ? &g_api : nullptr;
}

int CaptureDriverPythonFrames(uintptr_t* code, int32_t* position, int max) {
  if (!g_python_callsites.load(std::memory_order_relaxed)) return 0;
  const PythonApi* api = GetPythonApi();
  if (api == nullptr || api->walker.layout == nullptr || api->PyInterpreterState_Main == nullptr ||
      api->PyInterpreterState_ThreadHead == nullptr || !api->InterpreterUsable()) {
    return 0;
  }
  void* interp = api->PyInterpreterState_Main();
  if (interp == nullptr) return 0;
  const uintptr_t driver = OldestThreadState(reinterpret_cast<uintptr_t>(api->PyInterpreterState_ThreadHead(interp)));
  if (driver == 0 || driver == reinterpret_cast<uintptr_t>(api->PyGILState_GetThisThreadState())) return 0;
  return WalkOtherThreadFrames(api->walker, driver, code, position, max);
}

int CapturePythonFrames(uintptr_t* code, int32_t* position, int max, bool* gil_held) {
  *gil_held = false;
  if (!g_python_callsites.load(std::memory_order_relaxed)) return 0;
  const PythonApi* api = GetPythonApi();
  if (api == nullptr || !api->InterpreterUsable()) return 0;
  *gil_held = api->ThisThreadHoldsGil();
  if (api->walker.layout != nullptr) {
    // This thread's own state (PyGILState's TLS key: no GIL needed). Its frames cannot change
    // while it is here, inside our wrapper, whoever holds the GIL.
    const auto tstate = reinterpret_cast<uintptr_t>(api->PyGILState_GetThisThreadState());
    return WalkPythonFrames(api->walker, tstate, code, position, max);
  }
  if (!*gil_held) return 0;
  PyObject* frame = api->PyEval_GetFrame();  // borrowed
  PyObject* owned = nullptr;                 // PyFrame_GetBack returns new references
  int count = 0;
  while (frame != nullptr && count < max) {
    PyObject* frame_code = api->PyFrame_GetCode(frame);
    code[count] = reinterpret_cast<uintptr_t>(frame_code);
    position[count] = api->PositionOf(frame);
    api->Py_DecRef(frame_code);  // the frame keeps its code alive while we hold the GIL
    ++count;
    PyObject* back = count < max ? api->PyFrame_GetBack(frame) : nullptr;
    if (owned != nullptr) api->Py_DecRef(owned);
    owned = frame = back;
  }
  if (owned != nullptr) api->Py_DecRef(owned);
  return count;
}

void SetPythonCallsitesEnabled(bool enabled) { g_python_callsites.store(enabled, std::memory_order_relaxed); }

}  // namespace detail

void SetPythonCallsites(bool enabled) { detail::SetPythonCallsitesEnabled(enabled); }

std::string PythonCallsiteProblem() {
  const detail::PythonApi* api = detail::GetPythonApi();
  return api != nullptr ? std::string(api->frames_problem) : std::string();
}

namespace detail {

void RetainCodeObjects(const uintptr_t* code, int count) {
  const PythonApi* api = GetPythonApi();
  for (int i = 0; i < count; ++i) api->Py_IncRef(reinterpret_cast<PyObject*>(code[i]));
}

int FramesBeforeInterpreter(const uintptr_t* ips, int count) {
  const PythonApi* api = GetPythonApi();
  if (api == nullptr) return count;
  for (int i = 0; i < count; ++i) {
    if (api->InInterpreter(ips[i])) return i;
  }
  return count;
}

const char* GilResultText(GilResult result) {
  switch (result) {
    case GilResult::kRan: return "done";
    case GilResult::kNoPython: return "no usable Python interpreter";
    case GilResult::kTimedOut: return "the GIL was not available in time (a thread holds it)";
    case GilResult::kNoHelper: return "no helper thread could be started to take the GIL";
  }
  return "?";
}

GilResult RunWithGil(std::function<void(const PythonApi&)> work, int timeout_ms, bool finish_late) {
  const PythonApi* api = GetPythonApi();
  if (api == nullptr || !api->InterpreterUsable()) return GilResult::kNoPython;
  if (api->ThisThreadHoldsGil()) {
    // A helper would wait for us: run here, keeping the caller's pending exception intact.
    PyObject *type, *value, *traceback;
    api->PyErr_Fetch(&type, &value, &traceback);
    work(*api);
    api->PyErr_Clear();
    api->PyErr_Restore(type, value, traceback);
    return GilResult::kRan;
  }
  static std::once_flag at_fork_once;
  std::call_once(at_fork_once, [] { pthread_atfork(nullptr, nullptr, ResetGilHelperInChild); });
  return TheGilHelper()->Run(std::move(work), timeout_ms, finish_late);
}

}  // namespace detail
}  // namespace stacks
}  // namespace ncclwatch
