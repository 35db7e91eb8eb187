// The process-wide ncclwatch state, created at the first NCCL use (communicator creation or
// operation) and never destroyed. A process that never calls NCCL never creates it: no thread,
// no file, no output. The runtime only wires the pieces (each in the room its name says:
// record/, gpu/, watchdog/ with setup hangs, dump/ with a dump's input, blackbox/ with the
// caretaker, metrics/) and says when each duty runs: on the watchdog thread after each poll
// (OnTick), on the exit and signal paths.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "blackbox/black_box.h"
#include "blackbox/box_keeper.h"
#include "blackbox/caretaker.h"
#include "blackbox/postmortem.h"
#include "common/config.h"
#include "common/process_info.h"
#include "dump/dump_files.h"
#include "dump/dump_input.h"
#include "dump/request_relay.h"
#include "gpu/driver.h"
#include "gpu/markers.h"
#include "metrics/metrics.h"
#include "record/comm_registry.h"
#include "record/flight_ring.h"
#include "record/thread_registry.h"
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

  const Config& config() const { return config_; }
  FlightRing& ring() { return *ring_; }
  CommRegistry& comms() { return comms_; }
  ThreadRegistry& threads() { return threads_; }
  GpuMarkers* markers() { return markers_.get(); }
  Watchdog& watchdog() { return *watchdog_; }

  // A communicator was created: records it and, the first time, works out the global rank.
  CommInfo* AddCommunicator(std::unique_ptr<CommInfo> info);
  // An operation on a communicator created behind our back (e.g. through pncclCommInitRank).
  CommInfo* AdoptUnknown(const void* handle);

  // Writes one dump now, on the calling thread.
  void Dump(trace::DumpReason reason, const std::string& detail,
            const std::optional<trace::DumpRequest>& trigger = std::nullopt,
            const std::optional<InflightView>& stalled = std::nullopt, const DumpExtra& extra = {});
  // An NCCL call returned an error (or GetAsyncError reported one): one dump per communicator.
  // `failed`: the operation whose call failed, when it was one.
  void OnNcclError(const char* function, int result, CommInfo* comm, bool async, const OpSnapshot* failed = nullptr);
  // ncclCommAbort, before it is forwarded: marks the communicator and dumps (once per episode).
  void OnAbort(CommInfo* comm);
  // A communicator being created (ncclCommInitRank*): shown as `initializing` in dumps until
  // EndInit, and a stall when it takes longer than the default deadline (a setup hang).
  uint64_t BeginInit(const char* function, uint64_t id, int size, int rank);
  void EndInit(uint64_t token);
  // _exit/_Exit: the same exit record as exit() writes, by the watchdog thread while the calling
  // thread waits (bounded): _exit may be called where nothing else may run (a signal handler).
  // Async-signal-safe.
  void OnQuickExit(int status);

 private:
  Runtime();
  bool Start();
  void OnTick();
  void WriteMetrics(uint64_t now);
  void CheckSetups(uint64_t now);
  void OnStall(const InflightView& v, const std::string& detail);
  void OnRecovery(const Recovery& r);
  void AtExit(int status);
  // The end of a process that leaves normally: its exit record (or its operations in flight),
  // then its node-local files go. `on_watchdog`: called on the watchdog thread (_exit).
  void Finish(int status, int32_t exiting_site, int32_t exiting_tid, bool on_watchdog);
  void WriteBoxIdentity();
  // Ended communicators past a bound are forgotten (watchdog thread).
  void ForgetEndedComms(uint64_t now);
  uint64_t next_forget_check_ns_ = 0;
  static void OnExitThunk(int status, void*);
  static void OnSignalEnding(void* runtime);
  static void AtForkChild();
  // Writes the job-wide request unless one already asks for this episode: a stall or abort
  // request of this job written after `stuck_since_unix_ns` (wall clock).
  void AskPeersToDump(trace::DumpReason reason, uint64_t stuck_since_unix_ns);

  Config config_;
  ProcessIdentity identity_;
  uint64_t start_mono_ns_ = 0;
  CudaDriver driver_;
  std::unique_ptr<GpuMarkers> markers_;
  std::unique_ptr<FlightRing> ring_;
  CommRegistry comms_;
  ThreadRegistry threads_;
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<DumpDirectory> dumps_;
  std::unique_ptr<RequestRelay> relay_;  // used by the watchdog thread only
  std::unique_ptr<MetricsWriter> metrics_;  // NCCLWATCH_METRICS set
  std::unique_ptr<blackbox::BlackBox> box_;  // null: NCCLWATCH_BLACKBOX_DIR=none or unusable
  blackbox::BoxIdentity box_identity_;
  std::unique_ptr<blackbox::BoxKeeper> box_keeper_;  // with box_ (watchdog thread)
  bool temporaries_swept_ = false;  // under dump_mu_
  std::unique_ptr<blackbox::Caretaker> caretaker_;  // null: no black boxes (watchdog thread)
  enum : int { kNoQuickExit = 0, kQuickExitAsked = 1, kQuickExitDone = 2 };
  std::atomic<int> quick_exit_{kNoQuickExit};
  std::atomic<int> quick_exit_status_{0};
  std::atomic<int32_t> quick_exit_site_{-1};
  std::atomic<int32_t> quick_exit_tid_{0};
  std::atomic<bool> finished_{false};
  std::atomic<bool> final_dump_written_{false};  // a dump of this process's own end (fatal signal, SIGTERM)
  uint64_t next_metrics_ns_ = 0;
  // The Python exit hook that keeps the job's uncaught exception (watchdog thread).
  bool python_exit_watched_ = false;
  uint64_t next_python_exit_try_ns_ = 0;
  bool metrics_warned_ = false;
  std::atomic<uint64_t> stalls_{0};

  std::atomic<int> global_rank_{-1};
  std::atomic<int> world_size_{-1};
  int nccl_version_ = 0;

  std::mutex dump_mu_;
  uint64_t dump_seq_ = 0;
  std::atomic<uint64_t> last_abort_dump_ns_{0};
  std::atomic<uint64_t> last_recovery_mono_ns_{0};
  uint64_t last_peer_poll_ns_ = 0;
  std::mutex request_mu_;
  std::set<std::string> served_requests_;
  std::atomic<uint64_t> requests_made_{0};
  std::mutex error_mu_;
  std::set<uint64_t> error_dumped_comms_;
};

}  // namespace ncclwatch
