#include "python_api.h"

#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

namespace ncclwatch {
namespace stacks {
namespace detail {
namespace {

enum ApiState : int { kUnresolved, kResolving, kAbsent, kPresent };
std::atomic<int> g_api_state{kUnresolved};
PythonApi g_api;  // written once, before g_api_state becomes kAbsent/kPresent

template <typename Fn>
bool Lookup(Fn* slot, const char* name) {
  *slot = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
  return *slot != nullptr;
}

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
  Lookup(&a.IsFinalizing, "Py_IsFinalizing") || Lookup(&a.IsFinalizing, "_Py_IsFinalizing");
  Lookup(&a.UncheckedThreadState, "PyThreadState_GetUnchecked") ||
      Lookup(&a.UncheckedThreadState, "_PyThreadState_UncheckedGet");
  if (ok) FindInterpreterCode(&a);
  return ok;
}

// ---- RunWithGil ----

struct GilJob {
  std::function<void(const PythonApi&)> work;
  const PythonApi* api = nullptr;
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false;   // the helper is done (whether or not `work` ran)
  bool ran = false;        // `work` ran to completion
  bool abandoned = false;  // the caller stopped waiting: `work` must not start
};

// Set while a helper thread exists; a timed-out helper may wait for the GIL indefinitely, and
// one is enough.
std::atomic<bool> g_helper_active{false};

void* GilHelperMain(void* arg) {
  std::shared_ptr<GilJob> job = std::move(*static_cast<std::shared_ptr<GilJob>*>(arg));
  delete static_cast<std::shared_ptr<GilJob>*>(arg);
  pthread_setname_np(pthread_self(), "ncclwatch-gil");
  const PythonApi& api = *job->api;
  bool ran = false;
  if (api.InterpreterUsable()) {
    const int gil_state = api.PyGILState_Ensure();
    bool start;
    {
      std::lock_guard<std::mutex> lock(job->mu);
      start = !job->abandoned;
    }
    if (start && api.InterpreterUsable()) {
      job->work(api);
      api.PyErr_Clear();  // never leave an exception behind
      ran = true;
    }
    api.PyGILState_Release(gil_state);
  }
  g_helper_active.store(false, std::memory_order_release);
  {
    std::lock_guard<std::mutex> lock(job->mu);
    job->finished = true;
    job->ran = ran;
  }
  job->cv.notify_all();
  return nullptr;
}

// Starts the detached helper with every signal blocked except the stack signal: process-directed
// signals must go to the application's threads, but a dump should still see this thread.
bool StartGilHelper(const std::shared_ptr<GilJob>& job) {
  sigset_t all, saved;
  sigfillset(&all);
  if (const int signo = ThreadStackSignal()) sigdelset(&all, signo);
  pthread_sigmask(SIG_SETMASK, &all, &saved);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  auto* arg = new std::shared_ptr<GilJob>(job);
  pthread_t thread;
  const int rc = pthread_create(&thread, &attr, GilHelperMain, arg);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  if (rc != 0) delete arg;
  return rc == 0;
}

void ResetHelperInChild() { g_helper_active.store(false); }  // a forked child has no helper

}  // namespace

bool PythonApi::InterpreterUsable() const {
  return Py_IsInitialized() != 0 && (IsFinalizing == nullptr || IsFinalizing() == 0);
}

bool PythonApi::ThisThreadHoldsGil() const {
  if (!InterpreterUsable() || PyGILState_Check() == 0) return false;
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

int CapturePythonFrames(uintptr_t* code, int32_t* position, int max) {
  const PythonApi* api = GetPythonApi();
  if (api == nullptr || !api->ThisThreadHoldsGil()) return 0;
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
    case GilResult::kTimedOut: return "the GIL could not be taken in time (a thread holds it)";
    case GilResult::kBusy: return "the GIL could not be taken (an earlier attempt is still waiting for it)";
    case GilResult::kNoHelper: return "no helper thread could be started to take the GIL";
  }
  return "?";
}

GilResult RunWithGil(std::function<void(const PythonApi&)> work, int timeout_ms) {
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
  std::call_once(at_fork_once, [] { pthread_atfork(nullptr, nullptr, ResetHelperInChild); });
  bool idle = false;
  if (!g_helper_active.compare_exchange_strong(idle, true)) return GilResult::kBusy;

  auto job = std::make_shared<GilJob>();
  job->work = std::move(work);
  job->api = api;
  if (!StartGilHelper(job)) {
    g_helper_active.store(false);
    return GilResult::kNoHelper;
  }
  std::unique_lock<std::mutex> lock(job->mu);
  if (!job->cv.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return job->finished; })) {
    job->abandoned = true;
    return GilResult::kTimedOut;
  }
  return job->ran ? GilResult::kRan : GilResult::kNoPython;
}

}  // namespace detail
}  // namespace stacks
}  // namespace ncclwatch
