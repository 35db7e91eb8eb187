#include "dump/signals.h"

#include <dlfcn.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>

#include "common/config.h"
#include "common/log.h"

namespace ncclwatch {
namespace {

constexpr int kTerminate[] = {SIGTERM, SIGINT};
constexpr int kFatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

struct sigaction g_previous[NSIG];
std::atomic<bool> g_installed[NSIG];
std::atomic<bool> g_dumped_once[NSIG];  // a second SIGTERM chains at once
int g_owner_pid = 0;                     // forked children chain at once
int g_dump_signal = 0;
uint64_t g_wait_ms = 0;
SignalHooks g_hooks;
std::atomic<int> g_watchdog_tid{0};
std::atomic<int> g_pending{0};
std::atomic<uint64_t> g_requested{0};
std::atomic<uint64_t> g_done{0};
std::atomic<uintptr_t> g_trampoline{0};

bool IsFatal(int sig) {
  for (int s : kFatal)
    if (s == sig) return true;
  return false;
}

void SleepMs(long ms) {
  timespec ts{0, ms * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

void ChainToPrevious(int sig, siginfo_t* info, void* uctx) {
  const struct sigaction& old = g_previous[sig];
  if (old.sa_flags & SA_SIGINFO) {
    if (old.sa_sigaction) old.sa_sigaction(sig, info, uctx);
    return;
  }
  if (old.sa_handler == SIG_IGN) return;
  if (old.sa_handler == SIG_DFL) {
    // Default action with the same signal: the exit status is what it would have been.
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
    raise(sig);  // blocked while we run: delivered as soon as the handler returns
    return;
  }
  old.sa_handler(sig);
}

void Handler(int sig, siginfo_t* info, void* uctx) {
  int saved_errno = errno;
  bool owner = getpid() == g_owner_pid;
  bool first = !g_dumped_once[sig].exchange(true);
  if (sig == g_dump_signal) g_dumped_once[sig].store(false);  // on demand: every time
  if (owner && first && g_hooks.wake) {
    int expected = 0;
    if (g_pending.compare_exchange_strong(expected, sig)) {
      uint64_t ticket = g_requested.fetch_add(1) + 1;
      g_hooks.wake(g_hooks.arg);
      bool on_watchdog = static_cast<int>(syscall(SYS_gettid)) == g_watchdog_tid.load();
      if (sig != g_dump_signal && !on_watchdog) {
        for (uint64_t waited = 0; g_done.load() < ticket && waited < g_wait_ms; waited += 10) SleepMs(10);
      }
    }
  }
  if (sig != g_dump_signal) ChainToPrevious(sig, info, uctx);
  errno = saved_errno;
}

bool Install(int sig) {
  struct sigaction sa {};
  sa.sa_sigaction = Handler;
  sa.sa_flags = SA_SIGINFO | SA_RESTART | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  if (sigaction(sig, &sa, &g_previous[sig]) != 0) return false;
  g_installed[sig].store(true);
  struct sigaction now {};
  if (sigaction(sig, nullptr, &now) == 0) g_trampoline.store(reinterpret_cast<uintptr_t>(now.sa_restorer));
  return true;
}

}  // namespace

void InstallSignalHandlers(bool terminate_and_fatal, int dump_signal, uint64_t wait_ms, SignalHooks hooks) {
  g_owner_pid = getpid();
  g_wait_ms = wait_ms;
  g_hooks = hooks;
  if (terminate_and_fatal) {
    for (int s : kTerminate) Install(s);
    for (int s : kFatal) Install(s);
  }
  if (dump_signal > 0 && dump_signal < NSIG) {
    struct sigaction cur {};
    sigaction(dump_signal, nullptr, &cur);
    bool app_owns = (cur.sa_flags & SA_SIGINFO) ? cur.sa_sigaction != nullptr : cur.sa_handler != SIG_DFL;
    bool ours = (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == Handler;
    if (app_owns && !ours) {
      LogWarn("the application already handles %s (NCCLWATCH_DUMP_SIGNAL): on-demand dumps off; "
              "choose another signal with NCCLWATCH_DUMP_SIGNAL",
              SignalName(dump_signal).c_str());
    } else {
      g_dump_signal = dump_signal;
      Install(dump_signal);
    }
  }
}

void SetWatchdogTid(int tid) { g_watchdog_tid.store(tid); }

uintptr_t SignalTrampoline() { return g_trampoline.load(); }

bool InOurLibrary(uintptr_t ip) {
  Dl_info mine, theirs;
  return dladdr(reinterpret_cast<void*>(&InOurLibrary), &mine) && dladdr(reinterpret_cast<void*>(ip), &theirs) &&
         mine.dli_fbase == theirs.dli_fbase;
}

int TakePendingSignal(trace::DumpReason* reason) {
  int sig = g_pending.load();
  if (sig == 0) return 0;
  *reason = sig == g_dump_signal ? trace::DumpReason::OnDemand
                                 : (IsFatal(sig) ? trace::DumpReason::FatalSignal : trace::DumpReason::Signal);
  return sig;
}

void DoneSignalDump() {
  g_pending.store(0);
  g_done.store(g_requested.load());
}

void UninstallSignalHandlers() {
  for (int s = 1; s < NSIG; ++s) {
    if (g_installed[s].exchange(false)) sigaction(s, &g_previous[s], nullptr);
    g_dumped_once[s].store(false);
  }
  g_dump_signal = 0;
}

}  // namespace ncclwatch
