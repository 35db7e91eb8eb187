// The result of cross-rank attribution: verdicts, most likely root cause first. Rendered as
// text or JSON by render_report.h; the JSON schema is documented in docs/analysis.md.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/dump_set.h"
#include "model/dump.h"
#include "report/vocabulary.h"

namespace ncclwatch {
namespace analysis {

// What the report knows about one culprit, for "where is it and how did it get there".
struct CulpritEvidence {
  int rank = -1;       // global rank; -1 when only the communicator rank is known
  int comm_rank = -1;  // rank in the verdict's communicator
  std::string host;
  int64_t pid = 0;
  std::string file;       // its dump file, empty when it left none
  std::string where;      // one line: "not inside NCCL", "inside ncclGroupEnd for 612 s", ...
  // The same for machines: what it is doing, and where it is on the verdict's communicator.
  analysis::CulpritState state = analysis::CulpritState::NoDump;
  analysis::CommPosition comm_state = analysis::CommPosition::Unknown;
  int64_t comm_seq = -1;  // the sequence number comm_state is about; -1 none
  std::string callsite_op;  // which operation `callsite` belongs to
  trace::Stack callsite;         // call-site stack of its op at the verdict's seq, or its last op
  std::string current_thread;  // which thread `current` is
  trace::Stack current;          // its stack at dump time
  std::string stack_note;  // why stacks are missing (no dump, details unreadable, ...)
};

// Signature of the operation one group of ranks called at the mismatching sequence number.
struct MismatchGroup {
  std::vector<int> ranks;
  std::string op;
  int64_t count = -1;
  std::string dtype;
  int root = -1;
  std::string redop;
  int64_t bytes = -1;
};

// A communicator blocked only because of a verdict's root cause.
struct Consequence {
  std::string comm;
  std::string comm_name;
  int comm_size = 0;
  int64_t seq = 0;
  std::string op;
  std::vector<int> waiting_ranks;
};

struct Verdict {
  analysis::Cause cause = analysis::Cause::NoHang;
  std::string comm;  // empty: none (no_hang, a dead rank nobody waits for yet)
  std::string comm_name;
  int comm_size = 0;
  int64_t seq = 0;  // collective seq; for Send/Recv the p2p sequence number (see p2p_src/dst)
  bool p2p = false;
  int p2p_src = -1, p2p_dst = -1;  // global ranks of the transfer, for Send/Recv
  std::string op;
  int64_t bytes = -1;
  std::vector<int> culprit_ranks;       // global ranks
  std::vector<int> culprit_comm_ranks;  // culprits whose global rank cannot be inferred
  std::vector<int> waiting_ranks;
  double waited_s = -1;
  std::vector<CulpritEvidence> evidence;  // for the first few culprits
  std::vector<int> cycle;                 // deadlocks: ranks in wait order, first repeated last
  std::vector<std::string> cycle_steps;   // one line per wait in the cycle
  std::vector<MismatchGroup> groups;      // mismatch: majority first
  bool tie = false;                       // mismatch: groups of equal size
  bool call_count_divergence = false;
  std::map<std::string, std::string> nccl_env;  // stuck_in_collective: NCCL_* settings
  std::vector<Consequence> consequences;
  // What the advice sentence (written by the renderer, render_report.h) needs to know.
  bool culprit_in_nccl = false;         // rank_missing: a culprit's host is inside an NCCL call
  bool culprit_crashed = false;         // rank_dead: a culprit left a crash dump (not nothing)
  std::string culprit_detail;           // nccl_error: the failing call and error; rank_exited: status
  bool stopped_while_healthy = false;   // no_hang: ranks were at different seqs, nothing past due
  double oldest_in_flight_s = -1;       // no_hang: the oldest operation in flight when dumped
};

// Something worth knowing that is not a hang (never changes the exit status). Kind
// "slow_rank": a rank that arrives last at most collectives of a communicator by a clear margin.
struct Finding {
  std::string kind = "slow_rank";
  int rank = -1;
  std::string host;
  int64_t pid = 0;
  std::string comm, comm_name;
  size_t collectives = 0;  // collectives of the communicator every member's ring holds
  size_t last_in = 0;      // of those, how many this rank reached last
  double lateness_median_ms = 0, lateness_p90_ms = 0;  // behind the other members' median
  double clock_spread_ms = 0;  // uncertainty of the aligned clock between its host and others
  std::string callsite_op;
  trace::Stack callsite;  // the call site of most of its late collectives
};

struct Report {
  std::vector<Verdict> verdicts;  // never empty: no_hang when nothing is stuck
  std::vector<Finding> findings;  // below the verdicts: never a cause
  int ranks_seen = 0;
  int world_size = 0;
  std::vector<int> ranks_without_dump;  // 0..world_size-1 with no usable dump
  // Dumps not used as evidence because the same rank has a later one (history).
  struct EarlierDump {
    int rank;
    std::string file;
    std::string reason;
  };
  std::vector<EarlierDump> earlier_dumps;
  std::vector<Problem> problems;
  std::vector<Attempt> attempts;  // of the job in this directory (DumpSet::attempts)
  int attempt = 0;                // the one analyzed
  std::vector<std::string> notes;  // about the evidence: stale dumps, several attempts
  bool Hang() const {
    for (const auto& v : verdicts)
      if (v.cause != analysis::Cause::NoHang) return true;
    return false;
  }
};

}  // namespace analysis
}  // namespace ncclwatch
