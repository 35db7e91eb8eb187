// The process-wide ncclwatch state, created at the first NCCL use (communicator creation or
// operation) and never destroyed. A process that never calls NCCL never creates it: no thread,
// no file, no output. The runtime only wires: it starts each piece (record/, gpu/, watchdog/,
// dump/ with the dump policy, blackbox/, metrics/, exit/) and gives the watchdog thread its
// list of duties (TickSchedule). The hooks in intercept/ see it through its Recorder only.
#pragma once

#include <atomic>
#include <memory>

#include "blackbox/black_box.h"
#include "blackbox/box_keeper.h"
#include "blackbox/caretaker.h"
#include "common/config.h"
#include "common/process_info.h"
#include "dump/dump_files.h"
#include "dump/dump_policy.h"
#include "dump/request_relay.h"
#include "process/exit_path.h"
#include "gpu/driver.h"
#include "gpu/markers.h"
#include "metrics/metrics.h"
#include "record/comm_registry.h"
#include "record/flight_ring.h"
#include "record/thread_registry.h"
#include "runtime/recorder.h"
#include "watchdog/tick_schedule.h"
#include "watchdog/watchdog.h"

namespace ncclwatch {

// The runtime's state, read first by every wrapper: disabled (NCCLWATCH_DISABLE, a forked
// child, a failed start, after exit) passes straight through without touching anything else.
// Alone on its cache line: read on every call, written a few times per process.
enum : int { kRuntimeUnstarted = 0, kRuntimeActive = 1, kRuntimeDisabled = 2 };
extern std::atomic<int> g_runtime_state;

class Runtime {
 public:
  // True when every NCCL call passes straight through: one load, no thread-local state.
  static bool Off() { return g_runtime_state.load(std::memory_order_relaxed) == kRuntimeDisabled; }
  // The runtime if active, starting it on first use; null when disabled (NCCLWATCH_DISABLE,
  // a forked child, or start-up failed).
  static Runtime* Acquire();
  // The runtime if it is already active (never starts it).
  static Runtime* IfActive();

  // All the hooks may ask of it.
  Recorder& recorder() { return *recorder_; }
  // _exit/_Exit (intercept/process_exit.cpp). Async-signal-safe.
  void OnQuickExit(int status) { exit_->OnQuickExit(status); }
  // execve and its family (intercept/process_exec.cpp): the box says the process runs another
  // program from now on; ExecFailed when the call returned. Async-signal-safe.
  void MarkExec(const char* program) { exit_->MarkExec(program); }
  void ExecFailed() { exit_->ExecFailed(); }

 private:
  Runtime() = default;
  bool Start();
  // Starts the pieces a dump and the duties need, after the configuration and the black box.
  void StartPieces(const std::string& start_dir);
  void ScheduleDuties();
  // This process's black box file name ("" none): the caretaker never touches it.
  const std::string& OwnBoxName() const { return own_box_name_; }
  void OnTick();
  static void OnExitThunk(int status, void*);
  static void OnSignalEnding(void* runtime);
  static void AtForkChild();

  Config config_;
  ProcessIdentity identity_;
  ProcessRank rank_;
  uint64_t start_mono_ns_ = 0;
  int nccl_version_ = 0;
  CudaDriver driver_;
  std::unique_ptr<GpuMarkers> markers_;
  std::unique_ptr<FlightRing> ring_;
  CommRegistry comms_;
  ThreadRegistry threads_;
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<DumpDirectory> dumps_;
  std::unique_ptr<RequestRelay> relay_;        // used by the watchdog thread only
  std::unique_ptr<MetricsWriter> metrics_;     // NCCLWATCH_METRICS set
  std::unique_ptr<blackbox::BlackBox> box_;    // null: NCCLWATCH_BLACKBOX_DIR=none or unusable
  std::unique_ptr<blackbox::BoxKeeper> box_keeper_;  // with box_
  std::unique_ptr<blackbox::Caretaker> caretaker_;   // null: no black boxes (watchdog thread)
  std::unique_ptr<DumpPolicy> policy_;
  std::unique_ptr<ExitPath> exit_;
  std::unique_ptr<PendingLaunches> pending_;
  std::unique_ptr<Recorder> recorder_;
  TickSchedule duties_;  // watchdog thread
  std::string own_box_name_;  // OwnBoxName(), set once the box is made
};

}  // namespace ncclwatch
