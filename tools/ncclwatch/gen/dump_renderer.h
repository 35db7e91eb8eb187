// Renders synthetic dumps in exactly the documented format (docs/trace-format.md), fast: the
// heavy ring of the common history is rendered once per renderer, and each rank's file only
// patches the fields that differ (communicator ids, thread ids) into it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scenario.h"

namespace ncclwatch {
namespace gen {

struct DumpOptions {
  int dump_seq = 0;
  bool earlier = false;  // an earlier dump of the same process: before the hang, no extras
  int origin_rank = -1;  // the rank whose stall made the others dump (peer_request); -1 none
};

// One operation as it will be written (ring entry or in_flight element).
struct OpText {
  std::string comm;
  int64_t seq = 0, p2p_seq = 0;
  Operation op;
  int comm_size = 1;
  int64_t tid = 0;
  int64_t enqueue_ns = 0, gpu_reached_ns = 0, completed_ns = 0;
  trace::OpState state = trace::OpState::Completed;
  double age_s = -1, deadline_s = -1;  // in_flight only
};

class DumpRenderer {
 public:
  // `callsites`: the call sites the job uses (Operation::callsite values); like the writer, the
  // dump lists only those, numbered densely. `lean`: main thread and ncclwatch thread only.
  DumpRenderer(const Topology& topo, int ring_capacity, uint64_t seed, const std::vector<int>& callsites,
               bool lean);

  // Writes one rank's dump into dir; returns the file name, or empty with *error.
  std::string Write(const std::string& dir, int rank, const RankPlan& plan, const DumpOptions& options,
                    std::string* error);
  // Byte offset where the summary ends in the last written file (to truncate after it).
  size_t last_summary_end() const { return last_summary_end_; }

  int64_t history_ops() const { return history_ops_; }

 private:
  struct Timing;
  void BuildTemplate();
  void PatchTemplate(int rank);
  // Everything up to the ring entries; *extras gets the plan's operations as written.
  std::string RenderHead(int rank, const RankPlan& plan, const DumpOptions& options, const Timing& t,
                         size_t* summary_end, std::vector<OpText>* extras, trace::DumpReason* reason);
  // The ring's last entries (the extras) and everything after the ring.
  std::string RenderTail(int rank, const RankPlan& plan, const std::vector<OpText>& extras,
                         bool after_template);

  Topology topo_;
  int capacity_;
  uint64_t seed_;
  std::vector<Operation> step_;
  int64_t history_ops_ = 0;
  std::vector<int64_t> base_seq_;  // per CommKind: seq reached by the common history

  // The last `capacity_` history operations as JSON text, entries separated by ','.
  std::string ring_template_;
  std::vector<size_t> entry_start_;  // offset of each template entry
  std::vector<size_t> tp_id_at_, dp_id_at_, tid_at_;
  int patched_rank_ = -1;
  std::string callsites_json_;
  std::vector<int> callsite_index_;  // Operation::callsite -> index in the dump's callsites
  bool lean_ = false;
  size_t last_summary_end_ = 0;
};

// Monotonic clock origin of every synthetic host, and the deadline written in dumps.
constexpr int64_t kMonoBaseNs = 3600LL * 1000000000LL;
constexpr double kDeadlineS = 600.0;

}  // namespace gen
}  // namespace ncclwatch
