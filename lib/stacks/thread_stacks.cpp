// Stacks of every thread: a thread blocked in a system call is unwound from where the kernel
// says it waits, without a signal; a running one unwinds itself in a signal handler into a
// preallocated slot (the dumping thread signals them in parallel batches and waits a bounded
// time). A thread seen running is looked at again for a while first: one that waits now and
// then is unwound during a wait, without a signal (a signal that lands as it enters a wait
// cuts the wait short, whatever SA_RESTART says for nanosleep, poll or epoll_wait).
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "common/thread_id.h"
#include "common/timing.h"
#include "native_unwind.h"
#include "python_api.h"
#include "stacks.h"
#include "testing.h"

namespace ncclwatch {
namespace stacks {
namespace {

using Clock = std::chrono::steady_clock;

// Threads signalled at once (slots are ~1 KiB each, in static storage).
constexpr int kSlots = 64;

// Each slot's state word is (tid << 2 | phase):
//   dumper:   kIdle -> kArmed(tid), then tgkill(tid)
//   handler:  kArmed(own tid) -> kCapturing (CAS), unwind into `frames`, -> kDone
//   dumper:   kDone -> read `frames` -> kIdle; at the deadline kArmed -> kIdle (CAS). A handler
//             that won the race (kCapturing) keeps the slot until it is done; the slot is
//             skipped until then, so a late handler never writes into a slot in use.
// A late or stray signal finds no slot armed for its thread and does nothing.
enum Phase : uint64_t { kIdle = 0, kArmed = 1, kCapturing = 2, kDone = 3 };
constexpr uint64_t kPhaseMask = 3;

constexpr uint64_t Word(pid_t tid, Phase phase) { return (uint64_t{static_cast<uint32_t>(tid)} << 2) | phase; }

struct StackSlot {
  std::atomic<uint64_t> state;
  int count;
  bool cut_wait;  // the signal came as the thread entered a system call: it returned EINTR
  uint64_t pthread_id;  // the thread's pthread_self(): Python's thread ident
  uintptr_t frames[kMaxThreadFrames];
};
StackSlot g_slots[kSlots];
std::atomic<int> g_signo{0};
std::atomic<bool> g_check_signal_mask{true};

// Serializes captures. Leaked on purpose: usable while the process exits.
std::mutex*& CaptureMutex() {
  static std::mutex* mu = new std::mutex;
  return mu;
}

// A forked child has only the forking thread: no capture runs there, whatever the parent's
// threads were doing (one may have held the mutex or left slots armed) when it forked.
void ResetCapturesInChild() {
  for (StackSlot& slot : g_slots) slot.state.store(kIdle, std::memory_order_relaxed);
  CaptureMutex() = new std::mutex;
}

// The main thread's pthread_self() (Python's ident of its main thread), taken when the library is
// loaded on it: a main thread that answers no sampling signal (waiting in our own signal handler,
// unwound without one) still has its Python frames matched. 0 when loaded on another thread.
uint64_t MainPthreadAtLoad() { return CurrentTid() == getpid() ? static_cast<uint64_t>(pthread_self()) : 0; }
const uint64_t g_main_pthread = MainPthreadAtLoad();

}  // namespace

// Whether the signal whose handler got `ucontext` cut a system call short: the kernel made the
// call return EINTR to run the handler. On x86-64 the registers say so without reading memory:
// the syscall instruction left its return address in rcx (so rcx is the pc) and the result in
// rax is -EINTR; a call the kernel restarts (SA_RESTART) has its pc moved back onto the
// instruction instead. Async-signal-safe; false where it cannot be told.
bool SignalCutSystemCall(const void* ucontext) {
#if defined(__x86_64__)
  if (ucontext == nullptr) return false;
  const greg_t* regs = static_cast<const ucontext_t*>(ucontext)->uc_mcontext.gregs;
  return regs[REG_RAX] == -EINTR && regs[REG_RCX] == regs[REG_RIP];
#else
  (void)ucontext;
  return false;
#endif
}

namespace {

// Async-signal-safe: atomics, gettid, unw_step into static storage; errno preserved.
void OnStackSignal(int, siginfo_t*, void* ucontext) {
  const int saved_errno = errno;
  const pid_t tid = CurrentTid();
  const uint64_t armed = Word(tid, kArmed);
  for (StackSlot& slot : g_slots) {
    uint64_t expected = armed;
    if (slot.state.load(std::memory_order_relaxed) != armed ||
        !slot.state.compare_exchange_strong(expected, Word(tid, kCapturing), std::memory_order_acquire)) {
      continue;
    }
    slot.count = detail::UnwindContext(static_cast<unw_context_t*>(ucontext), /*signal_frame=*/true, slot.frames,
                                       kMaxThreadFrames);
    slot.pthread_id = static_cast<uint64_t>(pthread_self());
    slot.cut_wait = SignalCutSystemCall(ucontext);
    slot.state.store(Word(tid, kDone), std::memory_order_release);
    break;
  }
  errno = saved_errno;
}

std::string ReadSmallFile(const std::string& path) {
  std::string content;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return content;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) content.append(buffer, static_cast<size_t>(n));
  close(fd);
  return content;
}

std::string TaskFile(pid_t tid, const char* name) {
  return "/proc/self/task/" + std::to_string(tid) + "/" + name;
}

// Value of the "Key:" line of a /proc status file, empty when absent.
std::string StatusField(const std::string& status, const std::string& key) {
  for (size_t line = 0; line < status.size();) {
    size_t end = status.find('\n', line);
    if (end == std::string::npos) end = status.size();
    if (status.compare(line, key.size() + 1, key + ":") == 0) {
      size_t value = line + key.size() + 1;
      while (value < end && (status[value] == '\t' || status[value] == ' ')) ++value;
      return status.substr(value, end - value);
    }
    line = end + 1;
  }
  return std::string();
}

void AppendNote(std::string* note, const std::string& text) {
  if (!note->empty()) *note += "; ";
  *note += text;
}

std::vector<ThreadStack> ListThreads() {
  std::vector<ThreadStack> threads;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return threads;
  while (const dirent* entry = readdir(dir)) {
    const int tid = std::atoi(entry->d_name);
    if (tid <= 0) continue;
    ThreadStack thread;
    thread.tid = tid;
    thread.name = ReadSmallFile(TaskFile(tid, "comm"));
    if (!thread.name.empty() && thread.name.back() == '\n') thread.name.pop_back();
    threads.push_back(std::move(thread));
  }
  closedir(dir);
  std::sort(threads.begin(), threads.end(), [](const ThreadStack& a, const ThreadStack& b) { return a.tid < b.tid; });
  return threads;
}

// Why the stack signal cannot be used at all right now; empty when it can.
std::string SignalProblem(int signo) {
  if (signo == 0) return "stack signal not installed";
  struct sigaction current;
  if (sigaction(signo, nullptr, &current) != 0 || (current.sa_flags & SA_SIGINFO) == 0 ||
      current.sa_sigaction != OnStackSignal) {
    // Sending it now would run the application's handler (or its default action).
    return "stack signal " + std::to_string(signo) + " was taken over by the application";
  }
  return std::string();
}

#if defined(__x86_64__)
// The top of a waiting thread's stack, copied for its unwind (captures are serialized).
constexpr size_t kStackCopyBytes = 32 * 1024;
alignas(16) unsigned char g_stack_copy[kStackCopyBytes];

// Copies up to kStackCopyBytes of the stack from `sp` into g_stack_copy, page by page (a stack
// ends at its mapping's end; ReadOwnMemory reads only what can be read): the bytes copied.
size_t CopyStack(uintptr_t sp) {
  constexpr uintptr_t kPage = 4096;
  size_t total = 0;
  for (uintptr_t at = sp; total < kStackCopyBytes;) {
    const size_t piece = std::min<size_t>(kStackCopyBytes - total, kPage - (at & (kPage - 1)));
    if (!detail::ReadOwnMemory(at, g_stack_copy + total, piece)) break;
    at += piece;
    total += piece;
  }
  return total;
}
#endif

// A thread blocked in a system call, unwound without a signal: a signal would cut its wait
// short (sleep, nanosleep, sem_timedwait, poll return early, with EINTR or the time left). The
// kernel says where it waits (/proc/self/task/TID/syscall: its stack and instruction pointers),
// its stack is in our own address space, and the unwinder reads memory through a checked
// accessor (native_unwind.cpp), so a stack that changes under us gives wrong frames, never a
// fault. False when the thread runs, or left its call while it was read: it is signalled then.
bool UnwindBlocked(pid_t tid, ThreadStack* thread) {
#if defined(__x86_64__)
  const std::string path = TaskFile(tid, "syscall");
  const std::string before = ReadSmallFile(path);
  long long nr = -1;
  unsigned long long arg[6], sp = 0, pc = 0;
  if (std::sscanf(before.c_str(), "%lld %llx %llx %llx %llx %llx %llx %llx %llx", &nr, &arg[0], &arg[1], &arg[2],
                  &arg[3], &arg[4], &arg[5], &sp, &pc) != 9 ||
      nr < 0 || sp == 0 || pc == 0)
    return false;
  ucontext_t context;
  std::memset(&context, 0, sizeof context);
  context.uc_mcontext.gregs[REG_RIP] = static_cast<greg_t>(pc);
  context.uc_mcontext.gregs[REG_RSP] = static_cast<greg_t>(sp);
  uintptr_t frames[kMaxThreadFrames];
  // The top of its stack is copied first (one read per page), and the unwinder reads it from
  // the copy: the thread need only stay in its wait while it is copied, not while it is unwound
  // (a 50 us sleep is over long before an unwind that reads word by word). Where it cannot be
  // copied, the live stack is unwound and the wait checked after.
  const size_t copied = CopyStack(static_cast<uintptr_t>(sp));
  if (copied > 0) {
    if (ReadSmallFile(path) != before) return false;  // it moved while copied
    const int count = detail::UnwindContextOverCopy(reinterpret_cast<unw_context_t*>(&context),
                                                    /*signal_frame=*/true, frames, kMaxThreadFrames,
                                                    static_cast<uintptr_t>(sp), g_stack_copy, copied);
    if (count <= 0) return false;
    thread->ips.assign(frames, frames + count);
    return true;
  }
  // Frame 0 is the exact pc, as in a signal handler's context.
  const int count = detail::UnwindContext(reinterpret_cast<unw_context_t*>(&context), /*signal_frame=*/true, frames,
                                          kMaxThreadFrames);
  if (count <= 0 || ReadSmallFile(path) != before) return false;  // it moved: the frames may be torn
  thread->ips.assign(frames, frames + count);
  return true;
#else
  (void)tid;
  (void)thread;
  return false;  // elsewhere the registers the unwinder needs first (the link register) are not known
#endif
}

enum class Eligibility { kSignal, kSkip, kGone };

// Whether thread `tid` can answer the signal; a `note` says why not.
Eligibility CheckThread(pid_t tid, int signo, std::string* note) {
  const std::string status = ReadSmallFile(TaskFile(tid, "status"));
  if (status.empty()) return Eligibility::kGone;
  const std::string state = StatusField(status, "State");
  if (!state.empty() && (state[0] == 'Z' || state[0] == 'X')) return Eligibility::kGone;
  if (!state.empty() && (state[0] == 'T' || state[0] == 't')) {
    *note = "thread is stopped (state " + state + "): not signalled";
    return Eligibility::kSkip;
  }
  const unsigned long long blocked = std::strtoull(StatusField(status, "SigBlk").c_str(), nullptr, 16);
  if (g_check_signal_mask.load() && (blocked & (1ull << (signo - 1)))) {
    *note = "thread blocks the stack signal " + std::to_string(signo) + ": no native stack";
    return Eligibility::kSkip;
  }
  return Eligibility::kSignal;
}

// Claims a free slot for `tid` at or after *next; -1 when none is left.
int ArmSlot(pid_t tid, int* next) {
  while (*next < kSlots) {
    const int index = (*next)++;
    std::atomic<uint64_t>& state = g_slots[index].state;
    uint64_t current = state.load(std::memory_order_acquire);
    if ((current & kPhaseMask) == kDone) {  // an answer that came after its deadline: drop it
      state.compare_exchange_strong(current, kIdle, std::memory_order_acq_rel);
      current = state.load(std::memory_order_acquire);
    }
    if (current == kIdle && state.compare_exchange_strong(current, Word(tid, kArmed), std::memory_order_acq_rel)) {
      return index;
    }
  }
  return -1;
}

// Signals up to kSlots threads at once and collects their stacks, waiting at most timeout_ms.
void CaptureBatch(ThreadStack* const* threads, int count, int signo, int timeout_ms,
                  std::unordered_set<int>* gone) {
  int slot_of[kSlots];
  int next_slot = 0;
  const pid_t pid = getpid();
  for (int i = 0; i < count; ++i) {
    const pid_t tid = threads[i]->tid;
    // A last look right before the signal: a thread that entered a system call since it was
    // seen running is unwound where it waits instead.
    if (UnwindBlocked(tid, threads[i])) {
      slot_of[i] = -1;
      continue;
    }
    slot_of[i] = ArmSlot(tid, &next_slot);
    if (slot_of[i] < 0) {
      threads[i]->note = "no free capture slot (handlers of an earlier capture still running)";
      continue;
    }
    if (syscall(SYS_tgkill, pid, tid, signo) != 0) {
      const int error = errno;
      // Disarm; a CAS because a signal still queued from an earlier capture may have been
      // delivered meanwhile, and then its handler owns the slot until it is done.
      uint64_t armed = Word(tid, kArmed);
      g_slots[slot_of[i]].state.compare_exchange_strong(armed, kIdle, std::memory_order_acq_rel);
      slot_of[i] = -1;
      if (error == ESRCH) {
        gone->insert(tid);
      } else {
        threads[i]->note = std::string("could not signal the thread: ") + std::strerror(error);
      }
    }
  }

  const auto answered = [&](int i) {
    return (g_slots[slot_of[i]].state.load(std::memory_order_acquire) & kPhaseMask) == kDone;
  };
  const Clock::time_point deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    bool waiting = false;
    for (int i = 0; i < count && !waiting; ++i) waiting = slot_of[i] >= 0 && !answered(i);
    if (!waiting || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }

  for (int i = 0; i < count; ++i) {
    if (slot_of[i] < 0) continue;
    StackSlot& slot = g_slots[slot_of[i]];
    const pid_t tid = threads[i]->tid;
    uint64_t armed = Word(tid, kArmed);
    if (slot.state.compare_exchange_strong(armed, kIdle, std::memory_order_acq_rel)) {
      const std::string state = StatusField(ReadSmallFile(TaskFile(tid, "status")), "State");
      threads[i]->note = "no answer to the stack signal within " + std::to_string(timeout_ms) + " ms" +
                         (state.empty() ? std::string() : " (state " + state + ")");
      continue;
    }
    // The handler has started: it finishes in microseconds unless the thread was descheduled.
    const Clock::time_point grace = Clock::now() + timing::kCapturingGrace;
    while (!answered(i) && Clock::now() < grace) std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (!answered(i)) {
      threads[i]->note = "stack signal answered too late";
      continue;  // the handler releases the slot's frames when done; ArmSlot recycles it
    }
    threads[i]->ips.assign(slot.frames, slot.frames + slot.count);
    threads[i]->pthread_id = slot.pthread_id;
    if (slot.cut_wait)
      AppendNote(&threads[i]->note,
                 "the stack signal came as the thread entered a system call: that call returned EINTR");
    slot.state.store(kIdle, std::memory_order_release);
  }
}

// Threads seen running, looked at again for up to kRunningPatience: a thread that waits in a
// system call at one of the looks is unwound there, without a signal, and leaves `running`.
// What is left kept running at every look (computing, spinning): only those get the signal,
// which a thread that never waits cannot feel.
void UnwindWhenBlocked(std::vector<ThreadStack*>* running) {
  const Clock::time_point until = Clock::now() + timing::kRunningPatience;
  while (!running->empty() && Clock::now() < until) {
    std::this_thread::sleep_for(timing::kRunningLook);
    running->erase(std::remove_if(running->begin(), running->end(),
                                  [](ThreadStack* thread) { return UnwindBlocked(thread->tid, thread); }),
                   running->end());
  }
}

// The calling thread's own stack, starting at the frame that called CaptureAllThreads.
__attribute__((noinline)) void CaptureSelf(ThreadStack* thread, uintptr_t caller) {
  uintptr_t frames[kMaxThreadFrames];
  unw_context_t context;
  unw_getcontext(&context);
  const int count = detail::UnwindContext(&context, /*signal_frame=*/false, frames, kMaxThreadFrames);
  const int first = detail::FindFrame(frames, count, caller, /*window=*/8);
  thread->ips.assign(frames + std::max(first, 0), frames + count);
  thread->pthread_id = static_cast<uint64_t>(pthread_self());
}

void AddPythonStacks(std::vector<ThreadStack>* threads, int gil_timeout_ms, std::string* note) {
  // Shared: work that started may finish after a timed-out wait.
  auto collected = std::make_shared<std::vector<detail::PythonThread>>();
  const detail::GilResult status = detail::RunWithGil(
      [collected](const detail::PythonApi& api) {
        *collected = detail::CollectPythonThreads(api, kMaxThreadPythonFrames);
      },
      gil_timeout_ms);
  if (status == detail::GilResult::kNoPython) return;
  // `collected` only once the work ran: after a timeout it may still run and write it.
  std::vector<detail::PythonThread> found;
  if (status == detail::GilResult::kRan) found = std::move(*collected);
  if (status == detail::GilResult::kTimedOut) {
    // Another thread keeps the GIL (spinning in Python, or in C code that holds it): read every
    // thread's frames from the interpreter's structures instead, as a sampler outside would.
    found = detail::PythonThreadsWithoutGil(*detail::GetPythonApi(), kMaxThreadPythonFrames);
    if (!found.empty()) {
      const std::string message = "python frames read without the GIL (not had within " +
                                  std::to_string(gil_timeout_ms) + " ms: another thread holds it)";
      for (ThreadStack& thread : *threads) {
        if (thread.tid == getpid()) AppendNote(&thread.note, message);
      }
      if (note != nullptr) AppendNote(note, message);
    }
  }
  if (status != detail::GilResult::kRan && found.empty()) {
    std::string message = std::string("python stacks unavailable: ") + detail::GilResultText(status);
    if (status == detail::GilResult::kTimedOut) message += " (timeout " + std::to_string(gil_timeout_ms) + " ms)";
    for (ThreadStack& thread : *threads) {
      if (thread.tid == getpid()) AppendNote(&thread.note, message);
    }
    if (note != nullptr) AppendNote(note, message);
    return;
  }
  // A Python thread's ident is its pthread_self(), which every thread that answered reported:
  // exact, also where Thread.native_id is stale (a forked child keeps its parent's) or absent
  // (threads the threading module does not know). native_id is for threads that did not answer.
  std::unordered_map<uint64_t, ThreadStack*> by_pthread;
  std::unordered_map<int, ThreadStack*> by_tid;
  for (ThreadStack& thread : *threads) {
    if (thread.tid == getpid() && thread.pthread_id == 0) thread.pthread_id = g_main_pthread;
    by_tid[thread.tid] = &thread;
    if (thread.pthread_id != 0) by_pthread[thread.pthread_id] = &thread;
  }
  std::vector<ThreadStack> unmatched;
  for (detail::PythonThread& python : found) {
    ThreadStack* match = nullptr;
    const auto by_ident = by_pthread.find(python.ident);
    if (by_ident != by_pthread.end()) {
      match = by_ident->second;
    } else if (python.native_id > 0) {
      const auto found = by_tid.find(static_cast<int>(python.native_id));
      // A thread that reported another ident is another thread (the tid of one that exited).
      if (found != by_tid.end() && found->second->pthread_id == 0) match = found->second;
    }
    if (match != nullptr) {
      match->python = std::move(python.frames);
      continue;
    }
    ThreadStack thread;
    thread.tid = -1;
    thread.name = "python thread " + std::to_string(python.ident);
    thread.python = std::move(python.frames);
    thread.note = "Python thread not known to the threading module: no native thread id";
    unmatched.push_back(std::move(thread));
  }
  for (ThreadStack& thread : unmatched) threads->push_back(std::move(thread));
}

}  // namespace

void detail::SetCheckSignalMaskForTesting(bool check) { g_check_signal_mask.store(check); }

bool InstallThreadStackSignal(int signo) {
  PrepareUnwinder();  // its handler unwinds: never the unwinder's first use
  static std::mutex* mu = new std::mutex;
  std::lock_guard<std::mutex> lock(*mu);
  if (g_signo.load() != 0 || signo <= 0 || signo >= NSIG) return false;
  struct sigaction current;
  if (sigaction(signo, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return false;
  struct sigaction action;
  std::memset(&action, 0, sizeof(action));
  action.sa_sigaction = OnStackSignal;
  action.sa_flags = SA_SIGINFO | SA_RESTART;  // restartable system calls of the target resume
  sigemptyset(&action.sa_mask);
  if (sigaction(signo, &action, nullptr) != 0) return false;
  pthread_atfork(nullptr, nullptr, ResetCapturesInChild);
  g_signo.store(signo);
  return true;
}

int ThreadStackSignal() { return g_signo.load(std::memory_order_relaxed); }

__attribute__((noinline)) std::vector<ThreadStack> CaptureAllThreads(int per_thread_timeout_ms, bool python,
                                                                     int gil_timeout_ms, std::string* note,
                                                                     const std::vector<int>* sampled) {
  const uintptr_t caller = reinterpret_cast<uintptr_t>(__builtin_return_address(0));
  PrepareUnwinder();
  if (note != nullptr) note->clear();
  // Taken with a bounded wait, so that a capture stuck elsewhere cannot block this one beyond
  // the timeout.
  std::unique_lock<std::mutex> lock(*CaptureMutex(), std::try_to_lock);
  const Clock::time_point give_up = Clock::now() + std::chrono::milliseconds(per_thread_timeout_ms);
  while (!lock.owns_lock() && Clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    lock.try_lock();
  }
  if (!lock.owns_lock()) {
    if (note != nullptr) *note = "another thread-stack capture is in progress";
    return {};
  }

  std::vector<ThreadStack> threads = ListThreads();
  const pid_t self = CurrentTid();
  const int signo = g_signo.load();
  const std::string signal_problem = SignalProblem(signo);
  std::unordered_set<int> gone;
  std::vector<ThreadStack*> to_signal;
  for (ThreadStack& thread : threads) {
    thread.own = IsOwnThread(thread.tid);
    if (thread.tid == self) {
      CaptureSelf(&thread, caller);
    } else if (!signal_problem.empty()) {
      thread.note = signal_problem;
    } else if (sampled && std::find(sampled->begin(), sampled->end(), thread.tid) == sampled->end()) {
      thread.note = kNotSampledNote;
    } else {
      switch (CheckThread(thread.tid, signo, &thread.note)) {
        case Eligibility::kSignal:
          if (!UnwindBlocked(thread.tid, &thread)) to_signal.push_back(&thread);  // only running threads
          break;
        case Eligibility::kGone: gone.insert(thread.tid); break;
        case Eligibility::kSkip: break;
      }
    }
  }
  UnwindWhenBlocked(&to_signal);
  for (size_t begin = 0; begin < to_signal.size(); begin += kSlots) {
    const int count = static_cast<int>(std::min<size_t>(kSlots, to_signal.size() - begin));
    CaptureBatch(to_signal.data() + begin, count, signo, per_thread_timeout_ms, &gone);
  }
  threads.erase(std::remove_if(threads.begin(), threads.end(),
                               [&](const ThreadStack& thread) { return gone.count(thread.tid) != 0; }),
                threads.end());
  if (python) AddPythonStacks(&threads, gil_timeout_ms, note);
  return threads;
}

}  // namespace stacks
}  // namespace ncclwatch
