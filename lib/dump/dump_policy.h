// Every rule about when this process writes a dump and whom it asks to dump too: a stall, a
// recovery, an NCCL error, an abort, a setup hang, a peer's request. What a dump holds is
// dump_input.h's; where it goes, dump_files.h's; this says when and why, and keeps the state
// those rules need (which requests were answered, which communicators' errors dumped, ...).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "dump/dump_files.h"
#include "dump/dump_input.h"
#include "dump/request_relay.h"

namespace ncclwatch {

// The rank this process is, once known (the launcher's environment, or its first communicator
// of the world's size); -1 until then.
struct ProcessRank {
  std::atomic<int> global{-1};
  std::atomic<int> world_size{-1};
};

class DumpPolicy {
 public:
  // What the policy reads and writes, owned by the runtime. `dump_written`: called with the
  // directory of each dump written, under the dump lock (the black box keeps it for the
  // postmortem a caretaker may write later); may be empty.
  struct Parts {
    DumpSources sources;
    const ProcessRank* rank = nullptr;
    DumpDirectory* dumps = nullptr;
    RequestRelay* relay = nullptr;
    std::function<void(const std::string& dir)> dump_written;
  };
  explicit DumpPolicy(Parts parts) : p_(std::move(parts)) {}

  // Writes one dump now, on the calling thread (at most one at a time; a dump that waited past
  // kDumpLockWait for another is dropped). True when it was written.
  bool Dump(trace::DumpReason reason, const std::string& detail,
            const std::optional<trace::DumpRequest>& answered = std::nullopt,
            const std::optional<InflightView>& stalled = std::nullopt, const DumpExtra& extra = {});

  // The watchdog's verdicts: a stall dumps and asks every rank to dump; a recovery dumps light.
  void OnStall(const InflightView& v, const std::string& detail);
  void OnRecovery(const Recovery& r);
  // An NCCL call returned an error (or GetAsyncError reported one): one dump per communicator.
  // `failed`: the operation whose call failed, when it was one.
  void OnNcclError(const char* function, int result, const CommInfo* comm, bool async, const OpSnapshot* failed = nullptr);
  // ncclCommAbort, before it is forwarded: one dump for a framework's burst of aborts, and the
  // job-wide request.
  void OnAbort(const CommInfo* comm);

  // Watchdog-thread duties (TickSchedule): each returns when it is next due.
  // A communicator's creation past its deadline (a setup hang): a stall dump and the request.
  uint64_t CheckSetups(uint64_t now);
  // The job-wide request, through the host's relay (every NCCLWATCH_PEER_POLL_MS): every new
  // request is answered with a dump.
  uint64_t AnswerPeers(uint64_t now);

  uint64_t stalls() const { return stalls_.load(std::memory_order_relaxed); }
  uint64_t dumps_written() const { return p_.dumps->written(); }
  DumpDirectory& dumps() { return *p_.dumps; }

 private:
  // Writes the job-wide request unless one already asks for this episode: a stall or abort
  // request of this job written after `stuck_since_unix_ns` (wall clock).
  void AskPeersToDump(trace::DumpReason reason, uint64_t stuck_since_unix_ns);

  Parts p_;
  std::mutex dump_mu_;
  uint64_t dump_seq_ = 0;           // under dump_mu_
  bool temporaries_swept_ = false;  // under dump_mu_
  std::atomic<uint64_t> stalls_{0};
  std::atomic<uint64_t> last_abort_dump_ns_{0};
  std::atomic<uint64_t> last_recovery_mono_ns_{0};
  std::mutex request_mu_;
  std::set<std::string> served_requests_;  // under request_mu_: ours and the ones answered
  std::atomic<uint64_t> requests_made_{0};
  std::mutex error_mu_;
  std::set<uint64_t> error_dumped_comms_;  // under error_mu_
};

}  // namespace ncclwatch
