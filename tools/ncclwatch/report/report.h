// The result of cross-rank attribution: verdicts, most likely root cause first. Rendered as
// text or JSON by render_report.h; the JSON schema is documented in docs/analysis.md.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/dump_set.h"
#include "model/dump.h"
#include "model/wait_graph.h"
#include "report/source_lines.h"
#include "report/vocabulary.h"

namespace ncclwatch {
namespace analysis {

// An operation named by its communicator and sequence number (p2p sequence number for Send/Recv).
struct OpRef {
  std::string op;
  int64_t seq = 0;
  std::string comm, comm_name;
};

// Where a culprit is, as data (the renderer words it: "inside ncclGroupEnd for 612 s (tid 7);
// its GPU has not reached #42 (issued 610 s ago)").
struct CulpritPosition {
  CulpritState state = CulpritState::NoDump;
  std::string detail;          // Crashed, Killed, NcclError: the dump's own detail (may be empty)
  // Killed: what its black box says: last seen inside `function` (tid, since_s), else outside
  // NCCL; `in_nccl_known` false when nothing says (gone before the teardown, no black box).
  bool in_nccl_known = false;
  bool was_inside_nccl = false;
  int64_t exit_status = -1;    // Exited: its status, -1 unknown
  bool exit_in_flight = false;  // Exited with operations in flight
  bool aborted_first = false;   // Exited: it aborted its communicators on its way out
  std::optional<trace::UncaughtException> exception;  // Exited: the Python exception it ended with
  std::string function;        // InsideNccl: the NCCL call its first thread inside NCCL is in
  double since_s = 0;          // InsideNccl: for how long
  int64_t tid = 0;             // InsideNccl: that thread
  // Where it is on the verdict's communicator (Unknown: no collective in the verdict).
  CommPosition comm_state = CommPosition::Unknown;
  int64_t comm_seq = -1;       // the sequence number comm_state is about; -1 none
  // GpuBehind, GpuUnknown from a black box that holds several calls its GPU had not finished
  // (or may not have): comm_seq is its last call, and this the last one its GPU had finished at
  // the box's last update (0: none); -1 otherwise.
  int64_t finished_through_seq = -1;
  double issued_age_s = -1;    // GpuInside, GpuNotReached: how long ago it issued comm_seq
  std::vector<std::string> then;  // reasons of the later dumps of its teardown
  // NoDump: it did not answer the newest job-wide request; its latest dump (not used) is this
  // much older. -1: not that.
  double unanswered_behind_s = -1;
  // Killed, from a black box: how old its op states were at its last sign of life (-1: not a
  // black box's; the states of a dump it wrote itself are as of the dump); `states_never`: its
  // watchdog never polled, so no op state in it is known.
  double box_age_s = -1;
  bool states_never = false;
  // Stopped: how its host saw it (StopKind's name) and since when; whether it was then killed.
  std::string stop_how;
  int64_t stopped_seen_unix_ns = 0;
  bool killed_while_stopped = false;
};

// Why a culprit's evidence has no stacks, or what its dump says about a missing one.
enum class StackNote : uint8_t {
  kNone,
  kNoUsableDump,       // no dump, or an unreadable one
  kDetailsUnreadable,  // its summary was read, its details not (stack_note_text: the reader's reason)
  kThreadNote,         // the thread's own note in the dump (stack_note_text)
  kNoThreads,          // its dump has no thread stacks
  kPythonFromEarlier,  // its current thread's Python frames come from an earlier dump (stack_note_text: its file)
};

// One application thread of a culprit at dump time, and why it is shown.
struct ThreadEvidence {
  int64_t tid = 0;
  std::string name;
  ThreadRole role = ThreadRole::Other;
  // Waiting in library code (a thread pool's worker, a queue) or running no Python at all:
  // collapsed to one line in text.
  bool idle = false;
  trace::Stack stack;
  std::string note;
};

// What the report knows about one culprit, for "where is it and how did it get there".
struct CulpritEvidence {
  int rank = -1;       // global rank; -1 when only the communicator rank is known
  int comm_rank = -1;  // rank in the verdict's communicator
  std::string host;
  int64_t pid = 0;
  // Its process drives several ranks (several devices): its device, and every rank of it.
  int64_t device = -1;
  std::vector<int> process_ranks;
  // Its launch where two launches share a communicator (DumpSet::shared_launches): the
  // launch's number (1, 2, ...) and the RANK it was started with; -1 otherwise.
  int launch = -1;
  int launch_rank = -1;
  std::string file;       // its dump file (or its unreadable one), empty when it left none
  CulpritPosition position;
  std::optional<OpRef> callsite_op;  // which operation `callsite` belongs to
  trace::Stack callsite;  // call-site stack of its op at the verdict's seq, or its last op
  // Set when the thread that issued it ran no Python: callsite.python is the stack of the thread
  // driving it ("main thread"), and callsite_thread names the issuing thread.
  std::string callsite_driven_from;
  std::string callsite_thread;
  std::string current_thread;  // name of the thread `current` is, empty: unnamed
  int64_t current_tid = -1;    // -1: no thread
  trace::Stack current;   // its stack at dump time
  ThreadRole current_role = ThreadRole::Other;
  // Every other application thread, after `current`: main, inside NCCL, Python, the rest.
  std::vector<ThreadEvidence> other_threads;
  StackNote stack_note = StackNote::kNone;
  std::string stack_note_text;
};

// One wait of a deadlock's cycle: rank `from` waits in `op` for rank `to`.
struct CycleStep {
  int from = -1, to = -1;
  OpRef op;
  bool p2p = false;
  int p2p_src = -1, p2p_dst = -1;  // global ranks of the transfer, for Send/Recv
};

// The ncclGroupStart/End group a Send/Recv was issued in, as its rank recorded it: one operation
// in text ("AlltoAll-like group #13 (7 peers)"), every member in JSON.
struct P2pGroupMember {
  std::string op;
  std::string comm;
  int peer = -1;  // global rank (Send/Recv); -1 for a collective
  int64_t seq = 0;  // p2p_seq for Send/Recv, seq for a collective
  int64_t count = -1;
  std::string dtype;
  int64_t bytes = -1;
  std::string state;
};
struct P2pGroup {
  int64_t id = 0;              // the rank's own group number (0: issued outside a group)
  std::string shape;           // alltoall_like, ring_exchange, send_recv, mixed (collectives too)
  int peers = 0;               // distinct peers of its Send/Recv
  int64_t p2p_seq = -1;        // the p2p_seq all its Send/Recv share, -1 when they differ
  std::vector<P2pGroupMember> ops;
};

// One side of a Send/Recv transfer as its rank called it.
struct P2pCall {
  int rank = -1;       // global
  int comm_rank = -1;
  std::string op;      // Send, Recv
  int peer = -1;       // global rank of the peer
  int64_t p2p_seq = 0;
  int64_t count = -1;
  std::string dtype;
  int64_t bytes = -1;
  std::string state;   // its operation state; "completed" also for one gone from in_flight
  P2pGroup group;
};

// A communicator blocked only because of a verdict's root cause.
struct Consequence {
  std::string comm;
  std::string comm_name;
  int comm_size = 0;
  int64_t seq = 0;
  std::string op;
  std::vector<int> waiting_ranks;
  bool p2p = false;
  int p2p_src = -1, p2p_dst = -1;  // global ranks of the transfer, for Send/Recv
};

// init_hang of communicators created with different ids: the ranks inside one of them.
struct IdGroup {
  std::string comm, comm_name;
  std::vector<int> ranks;  // global ranks inside its creation
};

// no_hang, taken before a deadline: an operation some ranks have waited in for longer than the
// dumps' times spread, which is not (yet) past its deadline: what would be a verdict later.
struct NotYet {
  analysis::Cause cause = analysis::Cause::RankMissing;  // what it would be
  std::vector<int> culprit_ranks;
  std::vector<int> waiting_ranks;
  std::string op;
  int64_t seq = 0;
  double waited_s = -1;
  double deadline_s = -1;  // the waiting ranks' deadline for it; -1 unknown
};

// A waiting rank whose process its framework ended after the wait: it aborted its
// communicators (ncclCommAbort, as PyTorch's watchdog does on a timeout), then ended. How, as
// its last dump says.
struct FrameworkEnded {
  int rank = -1;
  std::string reason;       // its last dump's: exit, exit_in_flight, fatal_signal, signal, postmortem
  int64_t exit_status = -1;  // exit, exit_in_flight: the status; -1 unknown
  std::string signal;       // fatal_signal, signal: the signal's name (SIGABRT); "" unknown
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
  std::vector<FrameworkEnded> ended_by_framework;  // of waiting_ranks, by rank
  std::vector<CulpritEvidence> evidence;  // for the first few culprits
  std::vector<int> cycle;                 // deadlocks: ranks in wait order, first repeated last
  std::vector<CycleStep> cycle_steps;     // one per wait in the cycle
  std::vector<MismatchGroup> groups;      // mismatch: majority first
  bool tie = false;                       // mismatch: groups of equal size
  bool call_count_divergence = false;
  // The operation was captured into a CUDA graph (seq: its capture-time number) and the hang is
  // in a replay; replays: the most replays a waiting rank's watchdog saw begin (a lower bound).
  bool captured = false;
  int64_t replays = -1;
  std::map<std::string, std::string> nccl_env;  // stuck_in_collective: NCCL_* settings
  std::vector<Consequence> consequences;
  // init_hang: the ranks created communicators of the same size with different ids (a stale id
  // file, a wrong rendezvous), each waiting for members inside another: who holds which id,
  // the group with the lowest rank first. Empty for an ordinary init_hang.
  std::vector<IdGroup> id_groups;
  // What the advice sentence (written by the renderer, render_report.h) needs to know.
  bool culprit_in_nccl = false;         // rank_missing: a culprit's host is inside an NCCL call
  bool culprit_crashed = false;         // rank_dead: a culprit left a crash dump (not nothing)
  bool culprit_unreadable = false;      // rank_dead: every culprit's dumps are unreadable (nothing says it died)
  bool culprit_unanswered = false;      // rank_dead: a culprit did not answer the newest request (DumpSet::unanswered_ranks)
  bool culprit_killed = false;          // rank_dead: a culprit ended without a word (postmortem dump, or gone before the teardown)
  bool culprit_stopped_killed = false;  // rank_stopped: a culprit was killed while stopped
  // nccl_error, rank_exited: where the first culprit with a dump that failed or exited is.
  std::optional<CulpritPosition> culprit_position;
  bool stopped_while_healthy = false;   // no_hang: ranks were at different seqs, nothing past due
  double oldest_in_flight_s = -1;       // no_hang: the oldest operation in flight when dumped
  std::vector<NotYet> not_yet;          // no_hang: waits not yet past their deadline, longest first
  // extra_call: the ranks that ended normally (exit status 0, everything completed) and the
  // last sequence number of the communicator they completed.
  std::vector<int> ended_ranks;
  int64_t ended_after_seq = -1;
  // job_killed, host_lost: the ranks that ended without a word together, how far apart their
  // last signs of life lie, and (host_lost) their host.
  std::vector<int> killed_ranks;
  double killed_within_ms = -1;
  std::string killed_host;
  // p2p_mismatch: the Send and the Recv (in that order) and what differs ("size", "datatype").
  std::vector<P2pCall> p2p_calls;
  std::string p2p_mismatch;
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
  std::string callsite_op;  // the operation those calls issue
  trace::Stack callsite;  // the call site of most of its late collectives
};

// A stall that recovered (an operation past its deadline that completed later): no hang, but
// what held it up at the time, from the dumps of that moment.
struct RecoveredStall {
  int rank = -1;  // the lowest rank that reported it stalled
  std::string host;
  int64_t pid = 0;
  OpRef op;
  std::vector<int> reported_by;   // every rank whose dump reported it stalled
  double stalled_after_s = -1;    // its age when reported stalled
  double recovered_after_s = -1;  // its age when it completed; -1 unknown
  Cause cause = Cause::NoHang;    // what the dumps of that moment showed
  std::vector<int> waiting_for;   // the culprits of that moment
  std::optional<CulpritEvidence> culprit;  // the first of them: where it was, its stacks
};

struct Report {
  std::vector<Verdict> verdicts;  // never empty: no_hang when nothing is stuck
  std::vector<Finding> findings;  // below the verdicts: never a cause
  std::vector<RecoveredStall> recovered_stalls;  // below the verdicts: never a cause
  size_t more_recovered_stalls = 0;              // beyond those explained
  int ranks_seen = 0;
  int world_size = 0;
  // Two launches or more share communicator `launches_comm` (its size is the world here):
  // each launch's first rank in it and its size, by first rank. Empty for one launch.
  std::string launches_comm;
  std::vector<std::pair<int, int>> launches;
  std::vector<int> ranks_without_dump;  // 0..world_size-1 with no usable dump
  // Dumps not used as evidence (history): earlier ones, and later ones that followed the start
  // of their process's teardown (`later`: a crash after the framework's abort), or those of a
  // process another one replaced in its rank.
  struct EarlierDump {
    int rank;
    std::string file;
    std::string reason;
    bool later = false;  // written after its rank's evidence, by the same process
  };
  std::vector<EarlierDump> earlier_dumps;
  std::vector<Problem> problems;
  std::vector<Attempt> attempts;  // of the job in this directory (DumpSet::attempts)
  int attempt = 0;                // the one analyzed
  SourceLines source_lines;  // of the native frames it prints: the symbolization pass's
  // Dumps much older than the newest of the attempt: they may describe an earlier state.
  struct StaleEvidence {
    int rank;
    std::string file;
    std::string reason;
    double behind_s;  // older than the newest dump by
  };
  std::vector<StaleEvidence> stale_evidence;
  // Ranks that did not answer the newest job-wide request (their older dump is history).
  std::vector<StaleEvidence> unanswered;
  // Whether a verdict says the job hangs: not no_hang, nor job_killed (every rank killed at once
  // from outside: nobody waits on anybody; the exit status is 0, as for a job stopped while healthy).
  bool Hang() const {
    for (const auto& v : verdicts)
      if (v.cause != analysis::Cause::NoHang && v.cause != analysis::Cause::JobKilled) return true;
    return false;
  }
};

}  // namespace analysis
}  // namespace ncclwatch
