// How this process's end is recorded, whichever way it ends: exit() (a return from main
// included), _exit/_Exit, a signal whose default action ends it. Each way writes what a rank
// still waiting on this one needs (the exit record, or the operations still in flight), then
// the process's node-local files go: its relay place, metrics file and black box.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

#include "blackbox/black_box.h"
#include "common/config.h"
#include "common/process_info.h"
#include "dump/dump_policy.h"
#include "dump/request_relay.h"
#include "metrics/metrics.h"
#include "watchdog/watchdog.h"

namespace ncclwatch {

class ExitPath {
 public:
  // Owned by the runtime; `metrics` and `box` may be null (off).
  struct Parts {
    const Config* config = nullptr;
    const ProcessIdentity* identity = nullptr;
    Watchdog* watchdog = nullptr;
    RequestRelay* relay = nullptr;
    DumpPolicy* policy = nullptr;
    MetricsWriter* metrics = nullptr;
    blackbox::BlackBox* box = nullptr;
    void (*pass_through)() = nullptr;  // from the exit on, NCCL calls pass straight through
    // At a normal exit, once the relay is left: the host's caretaker's pass, when this process
    // is (or now becomes) the caretaker, so that a job shorter than a caretaker's poll still
    // converts what a killed one left and removes its relay files. Null: none.
    std::function<void()> tidy_host;
  };
  explicit ExitPath(Parts parts) : p_(parts) {}

  // exit(): the exit record. From any thread but the watchdog's, the watchdog writes it (the
  // exiting thread may have interrupted the application inside a lock) while this one waits.
  void AtExit(int status);
  // _exit/_Exit: the same record, written by the watchdog thread while the calling thread waits
  // at most NCCLWATCH_SIGNAL_WAIT_MS. Async-signal-safe: _exit may be called where nothing else
  // may run (a signal handler).
  void OnQuickExit(int status);
  // Right before a signal's default action ends the process: its metrics file and its black
  // box (once the dump of that end is written) go. Unlinks only: async-signal-safe.
  void OnSignalEnding();
  // An execve of `program` is about to replace the process (its box says so: no death to tell);
  // ExecFailed when it returned. Async-signal-safe.
  void MarkExec(const char* program);
  void ExecFailed();

  // Watchdog thread, each tick before the duties: finishes an _exit that waits.
  void FinishQuickExit();
  // A signal's dump (SIGTERM, a fatal signal, the on-demand signal), while its handler waits: a
  // TickSchedule duty. After an ending signal's dump the black box has nothing to add.
  uint64_t DumpPendingSignal(uint64_t now);
  // The exit record is written: no duty runs any more.
  bool finished() const { return finished_.load(std::memory_order_acquire); }

 private:
  // The box's mark of this end (black_box.h EndingMark), once, before anything that may fail.
  void MarkEnding(blackbox::EndingKind how, int status);
  // The caretaker's pass at a normal exit (Parts::tidy_host), after the exit record.
  void TidyHost();
  // Once: waits briefly for operations still finishing, stops the watchdog, leaves the relay,
  // writes the exit record (or the operations in flight), removes the node-local files.
  // `on_watchdog`: called on the watchdog thread (_exit).
  void Finish(int status, int32_t exiting_site, int32_t exiting_tid, bool on_watchdog);

  Parts p_;
  enum : int { kNoQuickExit = 0, kQuickExitAsked = 1, kQuickExitDone = 2 };
  std::atomic<int> quick_exit_{kNoQuickExit};
  std::atomic<bool> quick_exit_claimed_{false};
  std::atomic<bool> quick_exit_late_said_{false};
  std::atomic<int> quick_exit_status_{0};
  std::atomic<int32_t> quick_exit_site_{-1};
  std::atomic<int32_t> quick_exit_tid_{0};
  std::atomic<bool> finished_{false};
  std::atomic<bool> ending_marked_{false};
};

}  // namespace ncclwatch
