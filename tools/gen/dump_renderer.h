// Renders synthetic dumps through the trace format's one writer (lib/format/trace_writer.h), as
// typed records: the common history's ring is built once per renderer, and each rank's dump
// only changes the records that differ (communicator ids, thread ids).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/records.h"
#include "scenario.h"

namespace ncclwatch {
namespace gen {

struct DumpOptions {
  int dump_seq = 0;
  bool earlier = false;  // an earlier dump of the same process: before the hang, no extras
  int origin_rank = -1;  // the rank whose stall made the others dump (peer_request); -1 none
};

class DumpRenderer {
 public:
  // `callsites`: the call sites the job uses (Operation::callsite values); like the library, the
  // dump lists only those, numbered densely. `lean`: main thread and ncclwatch thread only.
  DumpRenderer(const Topology& topo, int ring_capacity, uint64_t seed, const std::vector<int>& callsites,
               bool lean);

  // Writes one rank's dump into dir; returns the file name, or empty with *error.
  std::string Write(const std::string& dir, int rank, const RankPlan& plan, const DumpOptions& options,
                    std::string* error);
  // Byte offset where the summary ends in the last written file (to truncate after it).
  size_t last_summary_end() const { return last_summary_end_; }

  // Sequence number the common history reached on a communicator kind (the next op is +1).
  int64_t base_seq(CommKind k) const { return base_seq_[static_cast<int>(k)]; }

  // The ring's entries of one dump: history_[history_from..] then extras.
  struct RingWindow {
    size_t history_from = 0;
    std::vector<trace::Op> extras;
  };
  // The whole document of one rank's dump, as records; with `window`, the ring's entries are
  // described there instead of copied into the document.
  trace::Document Render(int rank, const RankPlan& plan, const DumpOptions& options, RingWindow* window = nullptr);

 private:
  void BuildHistory();
  void PatchHistory(int rank);

  Topology topo_;
  int capacity_;
  uint64_t seed_;
  std::vector<Operation> step_;
  int64_t history_ops_ = 0;
  std::vector<int64_t> base_seq_;  // per CommKind: seq reached by the common history

  // The last `capacity_` history operations, oldest first, and their communicator kinds.
  std::vector<trace::Op> history_;
  std::vector<CommKind> history_comm_;
  int patched_rank_ = -1;
  std::vector<trace::Callsite> callsites_;
  std::vector<int> callsite_index_;  // Operation::callsite -> index in the dump's callsites
  bool lean_ = false;
  size_t last_summary_end_ = 0;
};

// Monotonic clock origin of every synthetic host, and the deadline written in dumps.
constexpr int64_t kMonoBaseNs = 3600LL * 1000000000LL;
constexpr double kDeadlineS = 600.0;

}  // namespace gen
}  // namespace ncclwatch
