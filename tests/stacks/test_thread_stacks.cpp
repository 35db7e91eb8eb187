// CaptureAllThreads: every thread's own stack, bounded waits, and no harm to the threads.
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "common/thread_id.h"
#include "stacks.h"
#include "call_sites.h"
#include "testing.h"

using namespace ncclwatch::stacks;
using namespace stacks_test;
using Clock = std::chrono::steady_clock;

namespace {

int StackSignal() { return SIGRTMIN + 5; }

void EnsureStackSignal() {
  if (ThreadStackSignal() == 0) REQUIRE(InstallThreadStackSignal(StackSignal()));
  REQUIRE(ThreadStackSignal() == StackSignal());
}

long long MillisecondsSince(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

// A line of /proc/self/task/TID/status or, for "State", the state letter from .../stat.
std::string ThreadStatus(pid_t tid, const std::string& field) {
  const std::string dir = "/proc/self/task/" + std::to_string(tid);
  if (field == "State") {
    std::ifstream f(dir + "/stat");
    const std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t close = stat.rfind(')');
    return close == std::string::npos || close + 2 >= stat.size() ? "" : stat.substr(close + 2, 1);
  }
  std::ifstream f(dir + "/status");
  for (std::string line; std::getline(f, line);)
    if (line.rfind(field + ":", 0) == 0) return line.substr(field.size() + 1);
  return "";
}

// Waits until `ready()`; the deadline is only reached when something is broken (a loaded CI
// machine can starve a thread for seconds).
template <typename Ready>
void WaitUntil(Ready ready, const char* what) {
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(30);
  while (!ready()) {
    INFO("waiting for: " << what);
    REQUIRE(Clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Thread `tid` sleeps in the kernel: parked in its wait.
void WaitUntilSleeping(pid_t tid) {
  WaitUntil([&] { return ThreadStatus(tid, "State") == "S"; }, "the thread to sleep in its wait");
}

// The stack signal is pending at thread `tid`: sent to it, not yet taken.
bool StackSignalPending(pid_t tid) {
  std::istringstream hex(ThreadStatus(tid, "SigPnd"));
  unsigned long long mask = 0;
  hex >> std::hex >> mask;
  return (mask >> (StackSignal() - 1)) & 1;
}

void BlockStackSignal(int how) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, StackSignal());
  pthread_sigmask(how, &set, nullptr);
}

}  // namespace

namespace stacks_test {

// What a parked thread waits on (not in an unnamed namespace: the functions that take it must
// keep external linkage, or dladdr cannot name them).
struct Parking {
  std::mutex mu;
  std::condition_variable cv;
  bool released = false;
  std::atomic<bool> release_flag{false};
  std::atomic<pid_t> tid{0};

  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu);
      released = true;
    }
    release_flag = true;
    cv.notify_all();
  }
};

STACKS_TEST_SITE void ParkInCondvarWait(Parking* parking) {
  std::unique_lock<std::mutex> lock(parking->mu);
  parking->tid = ncclwatch::CurrentTid();
  parking->cv.wait(lock, [&] { return parking->released; });
}

STACKS_TEST_SITE void ParkInSleep(Parking* parking) {
  parking->tid = ncclwatch::CurrentTid();
  while (!parking->release_flag.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

STACKS_TEST_SITE void ParkInBusyLoop(Parking* parking) {
  parking->tid = ncclwatch::CurrentTid();
  while (!parking->release_flag.load(std::memory_order_relaxed)) STACKS_KEEP_FRAME();
}

// One nanosleep of `ms`, resumed with the remaining time after each EINTR, as a program that
// must sleep its full time does (nanosleep is never restarted by SA_RESTART).
STACKS_TEST_SITE int ParkInNanosleep(Parking* parking, int ms) {
  parking->tid = ncclwatch::CurrentTid();
  timespec request{ms / 1000, (ms % 1000) * 1000000L}, remaining;
  int interruptions = 0;
  while (nanosleep(&request, &remaining) != 0 && errno == EINTR) {
    ++interruptions;
    request = remaining;
  }
  return interruptions;
}

STACKS_TEST_SITE std::vector<ThreadStack> CaptureAllFromHere(int timeout_ms, bool python) {
  std::vector<ThreadStack> threads = CaptureAllThreads(timeout_ms, python, 100);
  STACKS_KEEP_FRAME();
  return threads;
}

}  // namespace stacks_test

namespace {

// A thread running `body` (which parks on the given Parking) until destroyed.
class ParkedThread {
 public:
  // `sleeps`: the body parks in a wait, not a busy loop (which it enters once it has its tid).
  ParkedThread(const char* name, std::function<void(Parking*)> body, bool sleeps = true)
      : thread_([this, name, body] {
          pthread_setname_np(pthread_self(), name);
          body(&parking_);
        }) {
    WaitUntil([this] { return parking_.tid.load() != 0; }, "the parked thread to start");
    if (sleeps) WaitUntilSleeping(parking_.tid.load());
  }
  ~ParkedThread() {
    parking_.Release();
    thread_.join();
  }
  pid_t tid() const { return parking_.tid.load(); }
  Parking* parking() { return &parking_; }

 private:
  Parking parking_;
  std::thread thread_;
};

const ThreadStack& Find(const std::vector<ThreadStack>& threads, pid_t tid) {
  for (const ThreadStack& thread : threads) {
    if (thread.tid == tid) return thread;
  }
  FAIL("thread " << tid << " missing from the capture");
  throw std::logic_error("unreachable");
}

}  // namespace

TEST_CASE("InstallThreadStackSignal takes only a signal with its default action") {
  const int taken = SIGRTMIN + 6;
  struct sigaction application = {}, after = {};
  application.sa_handler = [](int) {};
  REQUIRE(sigaction(taken, &application, nullptr) == 0);
  CHECK_FALSE(InstallThreadStackSignal(taken));
  sigaction(taken, nullptr, &after);
  CHECK(after.sa_handler == application.sa_handler);  // left alone
  signal(taken, SIG_DFL);

  EnsureStackSignal();
  CHECK_FALSE(InstallThreadStackSignal(StackSignal()));  // once only
  CHECK_FALSE(InstallThreadStackSignal(SIGRTMIN + 7));
}

// The busy thread was interrupted right inside its loop: frame 0 is that exact pc. (Under TSan
// signals arrive late, at its own safe points; under ASan the loop's instrumentation calls can be
// the interrupted frame, with the loop a few frames below.)
static bool BusyLoopOnTop(const ThreadStack& stack) {
#if !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
  return !stack.ips.empty() && Symbolize(stack.ips[0]).symbol.find("ParkInBusyLoop") != std::string::npos;
#else
  for (size_t i = 0; i < stack.ips.size() && i < 8; ++i)
    if (Symbolize(stack.ips[i]).symbol.find("ParkInBusyLoop") != std::string::npos) return true;
  return false;
#endif
}

// A thread blocked in a system call is unwound without a signal, from the kernel's stack and
// instruction pointers alone (callee-saved registers unknown). Under a sanitizer the call goes
// through the sanitizer's interceptor, whose frames need those registers: the walk can stop
// inside it, so there only a stack is required; the plain build checks the function.
static bool ShowsFunction(const ThreadStack& stack, const char* function) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  if (std::string(function) == "ParkInSleep") return !stack.ips.empty();
#endif
  return StackContains(stack.ips, function);
}

TEST_CASE("every thread shows its own function in its stack") {
  EnsureStackSignal();
  ParkedThread condvar("park-condvar", ParkInCondvarWait);
  ParkedThread sleeper("park-sleep", ParkInSleep);
  ParkedThread busy("park-busy", ParkInBusyLoop, /*sleeps=*/false);

  const struct {
    const ParkedThread& thread;
    const char* name;
    const char* function;
  } expected[] = {{condvar, "park-condvar", "ParkInCondvarWait"},
                  {sleeper, "park-sleep", "ParkInSleep"},
                  {busy, "park-busy", "ParkInBusyLoop"}};
  // Under load a sanitizer's runtime delivers the signal late, at its own safe points, where a
  // sample can miss the thread's function (seen once under TSan on 2 busy cores): sample again,
  // up to 8 times, as someone re-running `ncclwatch dump` would. A broken sampler fails all 8.
  std::vector<ThreadStack> threads;
  for (int attempt = 0; attempt < 8; ++attempt) {
    threads = CaptureAllFromHere(2000, /*python=*/true);
    bool all_found = true;
    for (const auto& e : expected) {
      const ThreadStack* stack = nullptr;
      for (const ThreadStack& t : threads)
        if (t.tid == e.thread.tid()) stack = &t;
      all_found = all_found && stack && stack->note.empty() && ShowsFunction(*stack, e.function);
      if (stack && &e.thread == &busy) all_found = all_found && BusyLoopOnTop(*stack);
    }
    if (all_found) break;
    WARN("sample " << attempt + 1 << " missed a parked thread's function: sampling again");
  }
  for (const auto& e : expected) {
    const ThreadStack& stack = Find(threads, e.thread.tid());
    INFO(e.name << ": " << stack.note);
    CHECK(stack.name == e.name);
    CHECK(stack.note.empty());
    CHECK(ShowsFunction(stack, e.function));
    CHECK(stack.python.empty());  // no CPython here
  }
  // The calling thread captured itself, starting at its caller.
  const ThreadStack& self = Find(threads, ncclwatch::CurrentTid());
  REQUIRE(!self.ips.empty());
  CHECK(Symbolize(self.ips[0]).symbol.find("CaptureAllFromHere") != std::string::npos);
  CHECK(BusyLoopOnTop(Find(threads, busy.tid())));
}

TEST_CASE("a thread that blocks the signal gets a note and costs no waiting") {
  EnsureStackSignal();
  ParkedThread blocked("park-blocked", [](Parking* parking) {
    BlockStackSignal(SIG_BLOCK);
    ParkInCondvarWait(parking);
  });
  ParkedThread normal("park-normal", ParkInCondvarWait);

  const Clock::time_point start = Clock::now();
  const std::vector<ThreadStack> threads = CaptureAllThreads(2000, false, 0);
  CHECK(MillisecondsSince(start) < 1000);  // the mask was read from /proc: no signal, no wait
  const ThreadStack& stack = Find(threads, blocked.tid());
  CHECK(stack.ips.empty());
  CHECK(stack.note.find("blocks the stack signal") != std::string::npos);
  CHECK(StackContains(Find(threads, normal.tid()).ips, "ParkInCondvarWait"));
}

TEST_CASE("a thread that does not answer costs at most the timeout and its late signal is harmless") {
  EnsureStackSignal();
  Parking second_park;
  std::atomic<bool> unblocked{false};
  // Running (a thread blocked in a system call is sampled without a signal), and blocking it.
  ParkedThread silent(
      "park-silent",
      [&](Parking* parking) {
        BlockStackSignal(SIG_BLOCK);
        ParkInBusyLoop(parking);
        BlockStackSignal(SIG_UNBLOCK);  // the queued signal is delivered now, long after its deadline
        unblocked = true;
        ParkInCondvarWait(&second_park);
      },
      /*sleeps=*/false);

  detail::SetCheckSignalMaskForTesting(false);  // signal it although it blocks the signal
  constexpr int kTimeoutMs = 300;
  const Clock::time_point start = Clock::now();
  const std::vector<ThreadStack> first = CaptureAllThreads(kTimeoutMs, false, 0);
  const long long elapsed = MillisecondsSince(start);
  detail::SetCheckSignalMaskForTesting(true);
  CHECK(elapsed >= kTimeoutMs);
  CHECK(elapsed < kTimeoutMs + 700);
  CHECK(Find(first, silent.tid()).ips.empty());
  CHECK(Find(first, silent.tid()).note.find("no answer") != std::string::npos);

  silent.parking()->Release();
  WaitUntil([&] { return unblocked.load() && second_park.tid.load() != 0; }, "the second park");
  WaitUntilSleeping(second_park.tid.load());
  const std::vector<ThreadStack> second = CaptureAllThreads(2000, false, 0);
  CHECK(StackContains(Find(second, silent.tid()).ips, "ParkInCondvarWait"));
  second_park.Release();
}

TEST_CASE("a thread sleeping in nanosleep is sampled without cutting its sleep short") {
  EnsureStackSignal();
  constexpr int kSleepMs = 800;
  std::atomic<int> interruptions{-1};
  std::atomic<long long> slept_ms{0};
  ParkedThread sleeper("park-nanosleep", [&](Parking* parking) {
    const Clock::time_point start = Clock::now();
    interruptions = ParkInNanosleep(parking, kSleepMs);
    slept_ms = MillisecondsSince(start);
  });
  for (int i = 0; i < 3; ++i) {
    const std::vector<ThreadStack> threads = CaptureAllThreads(1000, false, 0);
    CHECK(StackContains(Find(threads, sleeper.tid()).ips, "ParkInNanosleep"));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // samples spread over the sleep
  }
  while (interruptions.load() < 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(slept_ms.load() >= kSleepMs);
#if defined(__x86_64__)
  CHECK(interruptions.load() == 0);  // blocked in a system call: unwound without a signal
#endif
}

TEST_CASE("a thread that works and sleeps by turns is sampled without cutting a sleep short") {
  // 50 us of work, then a 50 us nanosleep: seen running, it enters a sleep microseconds later
  // half the time, where a stack signal would make nanosleep return EINTR. It is looked at
  // again until it is seen waiting, and unwound there.
  EnsureStackSignal();
  std::atomic<bool> stop{false};
  std::atomic<int> eintr{0}, rounds{0};
  std::atomic<pid_t> tid{0};
  std::thread worker([&] {
    tid = ncclwatch::CurrentTid();
    const timespec nap{0, 50 * 1000};
    while (!stop.load()) {
      const Clock::time_point end = Clock::now() + std::chrono::microseconds(50);
      while (Clock::now() < end) {
      }
      if (nanosleep(&nap, nullptr) != 0 && errno == EINTR) ++eintr;
      ++rounds;
    }
  });
  WaitUntil([&] { return rounds.load() > 100; }, "the worker to loop");
  int sampled = 0;
  for (int i = 0; i < 30; ++i) {
    const std::vector<ThreadStack> threads = CaptureAllThreads(1000, false, 0);
    for (const ThreadStack& thread : threads)
      if (thread.tid == tid.load() && !thread.ips.empty()) ++sampled;
  }
  stop = true;
  worker.join();
  CHECK(sampled == 30);
#if defined(__x86_64__)
  CHECK(eintr.load() == 0);
#endif
}

#if defined(__x86_64__)
namespace {
std::atomic<int> g_cut{-1};
void RecordCut(int, siginfo_t*, void* ucontext) { g_cut = SignalCutSystemCall(ucontext) ? 1 : 0; }
}  // namespace

TEST_CASE("a signal handler tells whether its signal cut a system call short") {
  struct sigaction action {}, before {};
  action.sa_sigaction = RecordCut;
  action.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&action.sa_mask);
  REQUIRE(sigaction(SIGUSR1, &action, &before) == 0);
  std::atomic<int> result{-2};
  std::atomic<bool> stop{false};
  std::atomic<pid_t> tid{0};
  // In nanosleep: the call returns EINTR, and the handler says so.
  std::thread sleeper([&] {
    tid = ncclwatch::CurrentTid();
    const timespec nap{5, 0};
    result = nanosleep(&nap, nullptr) != 0 && errno == EINTR ? 1 : 0;
  });
  WaitUntil([&] { return tid.load() != 0; }, "the sleeper to start");
  WaitUntilSleeping(tid.load());
  pthread_kill(sleeper.native_handle(), SIGUSR1);
  sleeper.join();
  CHECK(result.load() == 1);
  CHECK(g_cut.load() == 1);
  // Computing: nothing was cut.
  g_cut = -1;
  std::thread busy([&] {
    volatile unsigned long n = 0;
    while (!stop.load()) ++n;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  pthread_kill(busy.native_handle(), SIGUSR1);
  WaitUntil([] { return g_cut.load() != -1; }, "the busy thread's handler");
  stop = true;
  busy.join();
  CHECK(g_cut.load() == 0);
  sigaction(SIGUSR1, &before, nullptr);
}
#endif

TEST_CASE("a stack signal taken over by the application is not sent") {
  EnsureStackSignal();
  static std::atomic<int> application_calls{0};
  struct sigaction ours, application = {};
  application.sa_handler = [](int) { application_calls.fetch_add(1); };
  REQUIRE(sigaction(StackSignal(), &application, &ours) == 0);
  ParkedThread parked("park-taken", ParkInCondvarWait);

  const std::vector<ThreadStack> threads = CaptureAllThreads(500, false, 0);
  sigaction(StackSignal(), &ours, nullptr);
  CHECK(application_calls.load() == 0);
  CHECK(Find(threads, parked.tid()).ips.empty());
  CHECK(Find(threads, parked.tid()).note.find("taken over") != std::string::npos);
  CHECK(!Find(threads, ncclwatch::CurrentTid()).ips.empty());  // the caller still has its own stack
}

TEST_CASE("a child forked in the middle of a capture captures its own stacks") {
  EnsureStackSignal();
  ParkedThread silent(
      "park-silent",
      [](Parking* parking) {
        BlockStackSignal(SIG_BLOCK);
        ParkInBusyLoop(parking);  // running: it is signalled, not read from /proc
      },
      /*sleeps=*/false);
  detail::SetCheckSignalMaskForTesting(false);  // the capture below waits its full second
  std::thread capturing([] { CaptureAllThreads(1000, false, 0); });
  // Its signal is pending at the silent thread: the capture holds the lock and a slot now.
  WaitUntil([&] { return StackSignalPending(silent.tid()); }, "the capture to signal the silent thread");

  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {  // only the forking thread lives here (plus a sanitizer's own, if any)
    std::string note;
    const std::vector<ThreadStack> threads = CaptureAllThreads(300, false, 0, &note);
    const bool has_self = std::any_of(threads.begin(), threads.end(), [](const ThreadStack& thread) {
      return thread.tid == ncclwatch::CurrentTid() && !thread.ips.empty();
    });
    _exit(has_self && note.empty() ? 0 : 1);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  capturing.join();
  detail::SetCheckSignalMaskForTesting(true);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // 1: the child waited for its parent's capture
}

TEST_CASE("ncclwatch's own threads are marked as such") {
  EnsureStackSignal();
  std::atomic<int> step{0};
  std::atomic<pid_t> tid{0};
  std::thread own([&] {
    tid = ncclwatch::CurrentTid();
    MarkOwnThread();
    step = 1;
    while (step.load() != 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    UnmarkOwnThread();
    step = 3;
    while (step.load() != 4) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  while (step.load() != 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const auto own_flag = [&](pid_t which) {
    for (const ThreadStack& thread : CaptureAllThreads(2000, false, 0))
      if (thread.tid == which) return thread.own ? 1 : 0;
    return -1;
  };
  CHECK(IsOwnThread(tid));
  CHECK(own_flag(tid) == 1);
  CHECK(own_flag(ncclwatch::CurrentTid()) == 0);
  step = 2;
  while (step.load() != 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(!IsOwnThread(tid));
  CHECK(own_flag(tid) == 0);
  step = 4;
  own.join();
}
