#include "process/exit_path.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <time.h>
#include <vector>

#include "common/clock.h"
#include "common/log.h"
#include "common/quietly.h"
#include "common/thread_id.h"
#include "common/timing.h"
#include "process/signals.h"
#include "format/display.h"
#include "stacks/stacks.h"

namespace ncclwatch {
void ExitPath::AtExit(int status) {
  if (p_.identity->pid != getpid()) return;
  MarkEnding(blackbox::EndingKind::kExit, status);
  Watchdog& watchdog = *p_.watchdog;
  // exit() may be called from a signal handler that interrupted the application inside malloc
  // (or any lock it holds): this thread takes none. The watchdog writes the record, as for
  // _exit, and this thread waits for it, bounded; then the watchdog stops.
  if (watchdog.running() && !watchdog.OnWatchdogThread()) {
    OnQuickExit(status);
    if (quick_exit_.load(std::memory_order_acquire) == kQuickExitDone)
      watchdog.Stop(timing::Ms(timing::kWatchdogStopWait));
    return;
  }
  Finish(status, -1, 0, /*on_watchdog=*/false);
}

void ExitPath::MarkEnding(blackbox::EndingKind how, int status) {
  // First, before anything that may fail (an allocation under RLIMIT_AS, a dump directory out of
  // reach after setresuid or chroot): the box knows this was an exit, and its status.
  if (p_.box && !finished() && !ending_marked_.exchange(true)) p_.box->MarkEnding(how, status);
}

void ExitPath::MarkExec(const char* program) {
  if (p_.box && p_.identity->pid == static_cast<int>(getpid()) && !ending_marked_.load())
    p_.box->MarkEnding(blackbox::EndingKind::kExec, 0, program);
}

void ExitPath::ExecFailed() {
  if (p_.box && p_.identity->pid == static_cast<int>(getpid()) && !ending_marked_.load()) p_.box->ClearEnding();
}

void ExitPath::OnQuickExit(int status) {
  // A forked or vforked child (posix_spawn's exec failure) shares nothing of the rank's end.
  if (p_.identity->pid != static_cast<int>(getpid()) || finished()) return;
  MarkEnding(blackbox::EndingKind::kQuickExit, status);
  if (!p_.watchdog->running() || p_.watchdog->OnWatchdogThread()) return;  // its black box tells instead
  if (!quick_exit_claimed_.exchange(true)) {
    quick_exit_status_.store(status, std::memory_order_relaxed);
    quick_exit_tid_.store(CurrentTid(), std::memory_order_relaxed);
    int32_t site = -1;
    if (p_.config->stacks)
      Quietly("the exit record", [&] { site = stacks::CaptureCallsite(0, stacks::kMaxNativeFrames); });
    quick_exit_site_.store(site, std::memory_order_relaxed);
    quick_exit_.store(kQuickExitAsked, std::memory_order_release);
    p_.watchdog->Wake();
  }
  // Bounded, with async-signal-safe calls only: the exit goes ahead whatever happens.
  const timespec step{0, static_cast<long>(timing::Ns(timing::kQuickExitCheck))};
  for (uint64_t waited_ms = 0; waited_ms < p_.config->signal_wait_ms; waited_ms += timing::Ms(timing::kQuickExitCheck)) {
    if (quick_exit_.load(std::memory_order_acquire) == kQuickExitDone) return;
    nanosleep(&step, nullptr);
  }
  // Not written in time (the watchdog busy, or started out of memory and not yet able to
  // allocate): the exit goes ahead, its black box keeps this ending, and one line says so.
  if (!quick_exit_late_said_.exchange(true))
    LogWarn("exit: exit status %d (no exit record: the watchdog did not write it within %llu ms; the black box keeps "
            "this ending)",
            status, static_cast<unsigned long long>(p_.config->signal_wait_ms));
}

void ExitPath::OnSignalEnding() {
  // A process that a signal ends must not look alive to the metrics collector, and its black
  // box has nothing to add once the dump of that end is written.
  if (p_.metrics) p_.metrics->Remove();
  if (p_.box) p_.box->RemoveIfFinalDumped();
}

void ExitPath::FinishQuickExit() {
  if (quick_exit_.load(std::memory_order_acquire) != kQuickExitAsked) return;
  Quietly("the exit record", [&] {
    Finish(quick_exit_status_.load(), quick_exit_site_.load(), quick_exit_tid_.load(), /*on_watchdog=*/true);
  });
  quick_exit_.store(kQuickExitDone, std::memory_order_release);
  TidyHost();  // the record is out: the exit goes on meanwhile (bounded by the watchdog's stop)
}

uint64_t ExitPath::DumpPendingSignal(uint64_t now) {
  trace::DumpReason reason;
  if (int sig = TakePendingSignal(&reason)) {
    Quietly("a signal's dump", [&] {
      std::string detail =
          "signal " + SignalName(sig) + " (" + std::string(sigdescr_np(sig) ? sigdescr_np(sig) : "") + ")";
      if (reason == trace::DumpReason::OnDemand) {
        if (const int cut = TakeDumpSignalCut()) {
          const std::string what = SignalName(sig) + " landed on thread " + std::to_string(cut) +
                                   " and cut its system call short (EINTR)";
          detail += "; " + what;
          LogWarn("%s; `ncclwatch dump` asks for a dump without a signal", what.c_str());
        }
      }
      if (reason == trace::DumpReason::FatalSignal && TakeGivenBack() == sig)
        detail += "; the application's handler ran first, then gave it back its default action";
      p_.policy->Dump(reason, detail);
      if (p_.box && reason != trace::DumpReason::OnDemand) p_.box->FinalDumpWritten(static_cast<int64_t>(MonoNs()));
    });
    DoneSignalDump();  // the handler waits no longer, dump or not
  }
  return now;  // every tick
}

void ExitPath::Finish(int status, int32_t exiting_site, int32_t exiting_tid, bool on_watchdog) {
  if (finished_.exchange(true)) return;
  if (p_.pass_through) p_.pass_through();  // late NCCL calls pass straight through
  Watchdog& watchdog = *p_.watchdog;
  // Operations that finish while the process exits are normal (a script that ends without a
  // final synchronize): give them a moment before calling them "in flight at exit".
  std::vector<InflightView> pending;
  for (int i = 0; i < timing::kExitSettleChecks; ++i) {
    if (on_watchdog) watchdog.PollOnce(MonoNs());  // nobody else follows them meanwhile
    pending = watchdog.Inflight(timing::Ms(timing::kExitInflightLockWait));
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [](const InflightView& v) { return v.op.state == trace::OpState::Completed; }),
                  pending.end());
    if (pending.empty()) break;
    usleep(static_cast<useconds_t>(timing::Ms(timing::kExitSettleInterval)) * 1000);
  }
  if (!on_watchdog) watchdog.Stop(timing::Ms(timing::kWatchdogStopWait));
  LogDebug("job-wide request: %llu checks of the shared dump directory%s",
           static_cast<unsigned long long>(p_.relay->shared_checks()),
           p_.relay->watcher() ? " (this host's watcher)" : "");
  // The relay is the watchdog's: left from its own thread, or once it has stopped (one stuck in
  // the driver may still poll it).
  if (on_watchdog || !watchdog.running()) p_.relay->Leave();
  if (p_.metrics) p_.metrics->Remove();  // a process that left must not look alive to the collector
  DumpExtra extra;
  extra.exit_status = status;
  extra.exiting_site = exiting_site;
  extra.exiting_tid = exiting_tid;
  trace::UncaughtException exception;
  // The interpreter's report of an exception that ended it, when it did end (Python exits with
  // 1): an interactive session that printed one and went on to exit 0 did not end because of it.
  if (status != 0 && stacks::LastUncaughtException(&exception)) extra.exception = std::move(exception);
  bool written = false;
  if (!pending.empty()) {
    std::string detail = std::to_string(pending.size()) + " operation(s) still in flight at exit, oldest " +
                         trace::OpKindName(pending.front().op.kind) + " seq " +
                         std::to_string(pending.front().op.seq);
    written = p_.policy->Dump(trace::DumpReason::ExitInFlight, detail, std::nullopt, std::nullopt, extra);
  } else if (p_.config->exit_record) {
    // Where this rank stopped, for the ranks that may still wait on it (uneven inputs): small
    // and cheap, outside NCCLWATCH_MAX_DUMPS.
    extra.exit_record = true;
    written = p_.policy->Dump(trace::DumpReason::Exit, "exit status " + std::to_string(status), std::nullopt,
                              std::nullopt, extra);
  } else {
    written = true;  // none asked for: the mark is its word
  }
  // A box that cannot be removed (setresuid, chroot since) says the record is out.
  if (written && p_.box) p_.box->MarkRecordWritten();
  // It left its own word: nothing for the host's caretaker to convert. Without it (no room, no
  // memory, a directory it no longer reaches) the box stays, marked with this exit and its
  // status: the caretaker writes the record from it.
  if (p_.box && written) p_.box->Remove();
  // On the watchdog, once the exiting thread no longer waits (FinishQuickExit).
  if (!on_watchdog && !watchdog.running()) TidyHost();
}

void ExitPath::TidyHost() {
  if (p_.tidy_host) Quietly("the host's caretaker", [&] { p_.tidy_host(); });
}

}  // namespace ncclwatch
