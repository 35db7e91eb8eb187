#include "process/signals.h"

#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <initializer_list>

#include "common/config.h"
#include "common/log.h"
#include "common/signal_frames.h"
#include "common/thread_id.h"
#include "dump/dump_files.h"
#include "stacks/stacks.h"

namespace ncclwatch {
namespace {

constexpr int kTerminate[] = {SIGTERM, SIGINT};
constexpr int kFatal[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

struct sigaction g_previous[NSIG];
std::atomic<bool> g_installed[NSIG];
std::atomic<bool> g_dumped_once[NSIG];  // a second SIGTERM chains at once
std::atomic<bool> g_reset[NSIG];        // SA_RESETHAND: the application's handler has run once
std::atomic<int> g_leader{0};           // the ending signal being handled first (0: none)
int g_owner_pid = 0;                     // forked children chain at once
int g_dump_signal = 0;
uint64_t g_wait_ms = 0;
SignalHooks g_hooks;
std::atomic<int> g_watchdog_tid{0};
std::atomic<int> g_pending{0};  // the signal waiting for its dump; negated once the watchdog took it
std::atomic<uint64_t> g_requested{0};
std::atomic<uint64_t> g_done{0};
std::atomic<int> g_dump_signal_cut{0};  // a thread whose system call the on-demand signal cut short
std::atomic<bool> g_said_chained[NSIG];  // "chained to the application's handler" said once
std::atomic<int> g_given_back{0};        // a fatal signal the application's handler gave back its default

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

// A fault the kernel raised on the faulting instruction: ignoring it or returning from a handler
// runs the instruction again, so the kernel never leaves it ignored (it takes the default action).
bool SynchronousFault(int sig, const siginfo_t* info) {
  return IsFatal(sig) && sig != SIGABRT && info && info->si_code > 0;
}

// SIG_DFL and SIG_IGN are values of the handler union whatever the flags (as the kernel reads it).
bool Ignored(const struct sigaction& a) { return a.sa_handler == SIG_IGN; }

// The application's handler, unless SA_RESETHAND made it the default after its first run.
bool HasHandler(int sig) {
  const struct sigaction& old = g_previous[sig];
  return !g_reset[sig].load() && old.sa_handler != SIG_DFL && !Ignored(old);
}

// Async-signal-safe "ncclwatch[pid P]: <parts...>" line.
void WriteLine(std::initializer_list<const char*> parts) {
  char line[512];
  size_t n = 0;
  auto put = [&](const char* s) {
    while (*s && n < sizeof line - 1) line[n++] = *s++;
  };
  auto put_uint = [&](uint64_t v) {
    char digits[24];
    int k = 0;
    do digits[k++] = static_cast<char>('0' + v % 10); while ((v /= 10) && k < 24);
    while (k > 0 && n < sizeof line - 1) line[n++] = digits[--k];
  };
  put("ncclwatch[pid ");
  put_uint(static_cast<uint64_t>(getpid()));
  put("]: ");
  for (const char* p : parts) {
    if (p == nullptr) put_uint(g_wait_ms);  // nullptr stands for the wait bound
    else put(p);
  }
  line[n++] = '\n';
  WriteStderrLine(line, n);
}

void DefaultAction(int sig) {
  if (getpid() == g_owner_pid) {
    // A dump still being written (an on-demand one when SIGTERM came) ends here with the
    // process: its partial file goes, and the log says so.
    if (AbandonDumpInProgress()) {
      const char* name = sigabbrev_np(sig);
      WriteLine({"SIG", name ? name : "?", " ends the process while a dump was being written: abandoned, no partial file left"});
    }
    if (g_hooks.ending) g_hooks.ending(g_hooks.ending_arg);
  }
  // Default action with the same signal: the exit status is what it would have been.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  raise(sig);  // blocked while we run: delivered as soon as the handler returns
}

// Chaining to what the application set ends the process (the default action of an ending
// signal; a synchronous fault the application ignores).
bool EndsProcess(int sig, const siginfo_t* info = nullptr) {
  if (HasHandler(sig)) return false;
  return g_reset[sig].load() || !Ignored(g_previous[sig]) || SynchronousFault(sig, info);
}

// Runs what the application set for `sig` as the kernel would have: its handler (our handler
// was installed with its flags and mask, so the mask is already the one it would run with),
// once only with SA_RESETHAND; SIG_IGN; the default action.
void ChainToPrevious(int sig, siginfo_t* info, void* uctx) {
  const struct sigaction& old = g_previous[sig];
  if (!HasHandler(sig)) {
    if (EndsProcess(sig, info)) DefaultAction(sig);  // else ignored: nothing to do
    return;
  }
  if (old.sa_flags & SA_RESETHAND) g_reset[sig].store(true);  // the next one takes the default action
  if (old.sa_flags & SA_SIGINFO) old.sa_sigaction(sig, info, uctx);
  else old.sa_handler(sig);
}

// Waits for the dump of `ticket` at most NCCLWATCH_SIGNAL_WAIT_MS; false when it did not finish.
bool WaitForDump(uint64_t ticket) {
  for (uint64_t waited = 0; g_done.load() < ticket; waited += 10) {
    if (waited >= g_wait_ms) return false;
    SleepMs(10);
  }
  return true;
}


// The dump did not finish within the bound. A process about to end keeps no partial file.
void GiveUpOnDump(int sig) {
  const char* name = sigabbrev_np(sig);
  if (EndsProcess(sig)) {
    AbandonDumpInProgress();
    WriteLine({"the dump for SIG", name ? name : "?", " did not finish within NCCLWATCH_SIGNAL_WAIT_MS=", nullptr,
               " ms: abandoned, no partial file left"});
  } else {
    WriteLine({"the dump for SIG", name ? name : "?", " did not finish within NCCLWATCH_SIGNAL_WAIT_MS=", nullptr,
               " ms: the application's handler runs now, the dump goes on"});
  }
}

// Posts a dump request for `sig` (after an on-demand dump being written, if any); 0 if none
// could be posted.
uint64_t RequestDump(int sig) {
  for (int attempt = 0; attempt < 2; ++attempt) {
    int expected = 0;
    if (g_pending.compare_exchange_strong(expected, sig)) {
      uint64_t ticket = g_requested.fetch_add(1) + 1;
      g_hooks.wake(g_hooks.arg);
      return ticket;
    }
    if (sig == g_dump_signal || !WaitForDump(g_requested.load())) return 0;
  }
  return 0;
}

void Handler(int sig, siginfo_t* info, void* uctx);

// Whether `sig` is still ours (the application has not set a disposition of its own since).
bool StillOurs(int sig) {
  struct sigaction now {};
  return sigaction(sig, nullptr, &now) == 0 && (now.sa_flags & SA_SIGINFO) && now.sa_sigaction == Handler;
}

// A fatal signal the application handles: its handler runs now. When it comes back having
// given the signal its default action again (signal(SIGSEGV, SIG_DFL), then a return to the
// faulting instruction, or a raise() that is delivered as this handler returns), the process
// ends with it right after: that end gets its dump, as a fault nobody handles.
void ChainToApplication(int sig, siginfo_t* info, void* uctx, bool can_dump) {
  if (can_dump && GetLogLevel() >= LogLevel::kInfo && !g_said_chained[sig].exchange(true)) {
    const char* name = sigabbrev_np(sig);
    WriteLine({"SIG", name ? name : "?", ": chained to the application's handler (it handles the signal: no dump)"});
  }
  ChainToPrevious(sig, info, uctx);
  if (!can_dump || StillOurs(sig)) return;
  struct sigaction now {};
  sigaction(sig, nullptr, &now);
  sigset_t pending;
  sigemptyset(&pending);
  sigpending(&pending);
  const bool again = SynchronousFault(sig, info) || sigismember(&pending, sig);  // it comes back at once
  // (a fault the kernel raises on the instruction is never ignored: its default action it is)
  if (!((now.sa_handler == SIG_DFL && again) || (Ignored(now) && SynchronousFault(sig, info)))) return;
  // A dump not finished within the bound is abandoned by the default action (it says so).
  if (!g_dumped_once[sig].exchange(true)) {
    g_given_back.store(sig);
    if (uint64_t ticket = RequestDump(sig)) WaitForDump(ticket);
  }
  DefaultAction(sig);  // the disposition is the default already: the same end
}

void Handler(int sig, siginfo_t* info, void* uctx) {
  int saved_errno = errno;
  bool owner = getpid() == g_owner_pid && g_hooks.wake;  // forked children chain at once
  if (sig == g_dump_signal) {  // on demand: a request, never a wait, never chained
    // The kernel gives a signal sent to the process to any thread that does not block it: if
    // that thread was waiting in nanosleep, poll, ... its call returns EINTR (the dump says so).
    if (owner && stacks::SignalCutSystemCall(uctx) && !stacks::IsOwnThread(CurrentTid()))
      g_dump_signal_cut.store(CurrentTid());
    if (owner) RequestDump(sig);
    else ChainToPrevious(sig, info, uctx);  // a forked child: as without ncclwatch (its default ends it)
    errno = saved_errno;
    return;
  }
  bool on_watchdog = CurrentTid() == g_watchdog_tid.load();
  // The watchdog leaves the fatal signals unblocked for its own faults, so a SIGSEGV or SIGABRT
  // sent to the process (kill) can land on it, where nobody could write the dump. The kernel
  // would have given it to a thread that does not block it: the watchdog blocks it from here on
  // (also once this handler returns) and queues it to the process again, same siginfo, for the
  // kernel to choose among the others (it stays pending while all of them block it, as it would
  // have without ncclwatch).
  if (owner && on_watchdog && !SynchronousFault(sig, info)) {
    sigset_t self;
    sigemptyset(&self);
    sigaddset(&self, sig);
    pthread_sigmask(SIG_BLOCK, &self, nullptr);
    if (uctx) sigaddset(&static_cast<ucontext_t*>(uctx)->uc_sigmask, sig);
    siginfo_t again = info ? *info : siginfo_t{};
    if (!info) {
      again.si_signo = sig;
      again.si_code = SI_USER;
      again.si_pid = getpid();
      again.si_uid = getuid();
    }
    // Named by this thread's id, the call passes the kernel's check that only a process itself
    // may queue a kill()'s siginfo, and still goes to the whole process (what kill(2) gives if not).
    if (syscall(SYS_rt_sigqueueinfo, CurrentTid(), sig, &again) == 0 ||
        kill(g_owner_pid, sig) == 0) {
      errno = saved_errno;
      return;
    }
  }
  // A fault the application handles is no crash: a guard page it unprotects, a GC's or a wasm
  // runtime's trap, and the instruction runs again. Its handler runs at once, as without
  // ncclwatch: no dump, no wait, and the process is not marked as dumped at its end.
  // (SIGABRT is not one: abort() ends the process even when a handler returns.)
  if (IsFatal(sig) && sig != SIGABRT && HasHandler(sig)) {
    ChainToApplication(sig, info, uctx, owner && !on_watchdog);
    errno = saved_errno;
    return;
  }
  int leader = 0;
  bool leading = owner && !on_watchdog && g_leader.compare_exchange_strong(leader, sig);
  // Two ending signals delivered at once run their handlers on two threads in either order; the
  // kernel delivers the lower-numbered one first (SIGINT before SIGTERM) when both are pending,
  // and ends the process with the first one sent when nothing handles them. So while the
  // leader's dump has not started, a lower-numbered ending signal takes the lead over: the dump
  // and the exit status are its own.
  uint64_t ticket = 0;  // the dump this signal waits for
  if (owner && !on_watchdog && !leading && leader > 0 && sig < leader && !IsFatal(sig) && !IsFatal(leader)) {
    int expected = leader;
    if (g_pending.compare_exchange_strong(expected, sig)) {  // the leader's dump request is now ours
      g_leader.store(sig);
      g_dumped_once[sig].store(true);
      ticket = g_requested.load();
      leading = true;
    }
  }
  if (owner && !on_watchdog && !leading) {
    // Another ending signal is being handled (Ctrl-C, then the launcher's SIGTERM; SIGTERM, then
    // a SIGSEGV sent or raised while its dump is written): it leads. Without ncclwatch it would
    // have ended the process before this one came, so once its dump is written its action ends
    // the process here, with its own status, whatever this signal is.
    WaitForDump(g_requested.load());
    if (EndsProcess(leader)) {
      DefaultAction(leader);  // delivered as this handler returns (before a fault could run again)
      errno = saved_errno;
      return;
    }
    ChainToPrevious(sig, info, uctx);  // the leader did not end it: as without ncclwatch
    errno = saved_errno;
    return;
  }
  // On the watchdog thread (a crash there) nobody could write the dump: chain at once.
  if (owner && !on_watchdog && !ticket && !g_dumped_once[sig].exchange(true)) ticket = RequestDump(sig);
  if (ticket && !WaitForDump(ticket)) GiveUpOnDump(sig);
  const int now_leading = g_leader.load();
  if (leading && now_leading != sig && now_leading > 0) {  // a lower-numbered signal took the lead over
    if (EndsProcess(now_leading)) DefaultAction(now_leading);
    else ChainToPrevious(sig, info, uctx);
    errno = saved_errno;
    return;
  }
  // The application's handler keeps the process alive: the lead is given back before it runs,
  // since it may leave with longjmp and never come back here.
  if (leading && !EndsProcess(sig, info)) g_leader.store(0);
  ChainToPrevious(sig, info, uctx);  // the default action: delivered as this handler returns
  errno = saved_errno;
}

bool Install(int sig) {
  // An ignored signal stays ignored (nohup, `trap '' INT`, a background job's SIGINT): no
  // handler, no dump, and the programs it execs inherit it ignored.
  struct sigaction before {};
  if (sigaction(sig, nullptr, &before) == 0 && Ignored(before)) return false;
  struct sigaction sa {};
  sa.sa_sigaction = Handler;
  sigemptyset(&sa.sa_mask);
  if (sig == g_dump_signal) {
    sa.sa_flags = SA_SIGINFO | SA_RESTART;  // ours alone: a read() it interrupts goes on
  } else if (before.sa_handler != SIG_DFL) {
    // The application's handler runs from ours: with its own mask, restart semantics,
    // alternate stack and re-entry (SA_NODEFER), exactly as the kernel would have run it. Its
    // handler may leave with longjmp: nothing of ours stays blocked or held.
    sa.sa_flags = SA_SIGINFO | (before.sa_flags & (SA_RESTART | SA_ONSTACK | SA_NODEFER));
    sa.sa_mask = before.sa_mask;
  } else {
    // The default action ends the process after the dump: nothing of the application runs
    // after our handler. A fatal signal's handler may run on an alternate stack the application
    // set (a stack overflow still gets its dump); ours needs little of it.
    sa.sa_flags = SA_SIGINFO | SA_RESTART | (IsFatal(sig) ? SA_ONSTACK : 0);
    // A second ending signal never interrupts the first one's handler on the same thread (the
    // kernel would run the nested one first): it goes to another thread or waits, and the
    // first keeps the lead, as the kernel's default action would have ended the process with it.
    if (!IsFatal(sig))
      for (int s : kTerminate) sigaddset(&sa.sa_mask, s);
  }
  if (sigaction(sig, &sa, &g_previous[sig]) != 0) return false;
  g_installed[sig].store(true);
  struct sigaction now {};
  if (sigaction(sig, nullptr, &now) == 0) SetSignalTrampoline(reinterpret_cast<uintptr_t>(now.sa_restorer));
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

int TakePendingSignal(trace::DumpReason* reason) {
  int sig = g_pending.load();
  // Taken for good: from here on the dump is this signal's (TakeOverLead can no longer swap it).
  while (sig > 0 && !g_pending.compare_exchange_weak(sig, -sig)) {
  }
  if (sig <= 0) return 0;
  *reason = sig == g_dump_signal ? trace::DumpReason::OnDemand
                                 : (IsFatal(sig) ? trace::DumpReason::FatalSignal : trace::DumpReason::Signal);
  return sig;
}

int TakeDumpSignalCut() { return g_dump_signal_cut.exchange(0); }
int TakeGivenBack() { return g_given_back.exchange(0); }

void DoneSignalDump() {
  g_pending.store(0);
  g_done.store(g_requested.load());
}

void UninstallSignalHandlers() {
  for (int s = 1; s < NSIG; ++s) {
    if (g_installed[s].exchange(false)) {
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      sigaction(s, g_reset[s].load() ? &dfl : &g_previous[s], nullptr);  // as the kernel left it
    }
    g_dumped_once[s].store(false);
    g_reset[s].store(false);
    g_said_chained[s].store(false);
  }
  g_leader.store(0);
  g_dump_signal = 0;
}

}  // namespace ncclwatch
