// The wait-for graph of a hang, built from the selected dumps of a DumpSet: communicators and
// their members across dumps, the blocked operations (BlockedOp; blocked_ops() holds them, and
// `bi` or a `blocked_op` field is an index into it), who keeps each from completing and where each wait ends (a dead,
// errored or exited member, a host busy elsewhere, a GPU held by earlier work, or another
// blocked operation), and the cycles among them. No verdicts: the rules that name causes read
// this graph (attribution.cpp), so each can be tested on a small hand-built dump set.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "model/dump_set.h"

namespace ncclwatch {
namespace analysis {

// Sizes beyond these are corrupt input, not a real job; they must not size our tables.
constexpr int kMaxCommSize = 1 << 20;
constexpr size_t kMaxMemberSlots = size_t{1} << 23;
// An operation younger than this that its peers completed may just be finishing.
constexpr double kStuckAloneAfterS = 1.0;

// ncclResult_t ncclRemoteError: a rank that got it only learned that another one failed.
constexpr int64_t kNcclRemoteError = 6;

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

// Why a member keeps a blocked operation from completing.
enum class BlockKind {
  kDead,         // no usable dump, or its latest dump is a crash dump
  kStopped,      // its host saw it stopped (a stand-in dump, or its postmortem says so)
  kError,        // an NCCL call of its returned an error
  kExited,       // it exited normally (its exit record)
  kHostMissing,  // its host never issued the operation
  kGpuLag,       // issued, but its GPU has not reached it
  kGroup,        // its own side is inside the operation, held by the rest of its ncclGroupStart/End
                 // group: another transfer (or collective) of the group that cannot complete
                 // (Blocker::target); a group completes as one
};

// Where the wait ends, once a blocker has been followed.
enum class Terminal {
  kNone,      // it waits on another blocked operation (see Blocker::target)
  kDead,      // rank_dead
  kStopped,   // rank_stopped
  kError,     // nccl_error
  kExited,    // rank_exited
  kEnded,     // exited normally (status 0, no exception) with everything it issued completed: the
              // waiting ranks issued a collective it never would (extra_call), or it left early
  kBusy,      // host elsewhere and not blocked on any NCCL operation: rank_missing
  kGpuStuck,  // GPU busy with earlier non-NCCL work: gpu_not_reached
};

struct Blocker {
  int comm_rank = -1;
  int global = -1;
  int dump = -1;
  BlockKind kind = BlockKind::kDead;
  int lag_op = -1;  // kGpuLag: index of its operation in the dump's in_flight
  Terminal terminal = Terminal::kNone;
  int target = -1;  // blocked operation this blocker waits on (when terminal == kNone)
};

// How the two sides of a Send/Recv transfer (the n-th send from src to dst and the n-th receive
// at dst from src, on one communicator) compare. NCCL pairs them by that order alone: the
// sizes and types must agree, or the receive never completes (or reads garbage).
enum class P2pMatch : uint8_t {
  kUnknown,       // a side's record is not at hand (no dump, its ring overwritten): not compared
  kMatch,         // the same datatype and bytes
  kSizeMismatch,  // the same datatype, different counts
  kTypeMismatch,  // different datatypes (the bytes may differ too)
};

// One side of a transfer as its rank recorded it.
struct P2pSide {
  int comm_rank = -1;
  int dump = -1;
  std::optional<trace::Op> op;  // in flight, or (a completed side) its ring's record
  bool done = false;            // completed (in flight as completed, or issued and gone from in_flight)
};

// One blocked operation: a collective (comm, seq) or one Send/Recv transfer.
struct BlockedOp {
  bool p2p = false;
  bool init = false;  // a communicator's creation (ncclCommInitRank*) that has not returned
  int comm = -1;
  int64_t seq = 0;
  int src = -1, dst = -1;  // p2p: communicator ranks
  std::vector<int> waiting;  // communicator ranks inside the operation, waiting
  std::vector<Blocker> blockers;
  const trace::Op* op = nullptr;  // as a waiting (or any) member recorded it
  double waited_s = -1;
  bool mismatch = false;
  std::vector<MismatchGroup> groups;  // global ranks, majority first
  std::vector<int> minority;          // global ranks
  bool tie = false;
  bool divergence = false;
  // A collective captured into a CUDA graph (`seq`: its capture-time sequence number), blocked
  // inside a replay: `replays` is the most replays a waiting member's watchdog saw begin.
  bool captured = false;
  int64_t replays = -1;
  // p2p: both sides of the transfer and how they compare.
  P2pSide send, recv;
  P2pMatch match = P2pMatch::kUnknown;
};

struct CommIndex {
  std::string id;
  std::string name;
  int size = 0;
  std::vector<int> global;  // by communicator rank; -1 unknown
  std::vector<int> dump;    // by communicator rank; -1 none
  int blocked_op = -1;      // its blocked collective, if any
};

struct Signature {
  std::string op;
  int64_t count;
  std::string dtype;
  int root;
  std::string redop;
  bool operator<(const Signature& o) const {
    return std::tie(op, count, dtype, root, redop) < std::tie(o.op, o.count, o.dtype, o.root, o.redop);
  }
};

// The GPU state of an operation whose markers say nothing (unmonitored, captured, unknown).
bool StateUnknownToGpu(const trace::Op& op);
// Issued by the host, not yet launched or reached.
bool NotStarted(const trace::Op& op);

class WaitGraph {
 public:
  // Builds the graph from the selected dumps of `set` (their summaries only): indexes
  // communicators, builds the blocked operations, follows every blocker, finds cycles. The
  // graph never changes afterwards; `set` must outlive it.
  explicit WaitGraph(const DumpSet& set);
  // With a reader of a dump's full details (DumpSet::Detail): a transfer's side that completed
  // is looked up in its rank's ring, so that both sides can be compared.
  using DetailReader = std::function<const trace::Detail*(size_t dump)>;
  WaitGraph(const DumpSet& set, DetailReader details);

  const std::vector<Dump>& dumps() const { return dumps_; }
  const std::vector<CommIndex>& comms() const { return comms_; }
  const std::vector<BlockedOp>& blocked_ops() const { return blocked_ops_; }
  // Index in comms() of a communicator id, or -1.
  int CommOf(const std::string& id) const;
  // The strongly connected component of a blocked operation in the wait-for graph, and whether it
  // lies on a wait cycle.
  int Component(int bi) const { return scc_[bi]; }
  bool Cyclic(int bi) const { return cyclic_[bi]; }

  const trace::CommSummary* StateOf(int dump, int comm) const;
  // The dump of a member: its own claim, else the dump of its inferred global rank (a live
  // rank that has not created this communicator yet).
  int DumpOfMember(const CommIndex& c, int comm_rank) const;
  bool Is(int dump, trace::DumpReason r) const;
  bool IsDead(int dump) const;
  // Dead without a word: its black box read by another process (a postmortem dump), or gone
  // before the job's teardown.
  bool IsKilled(int dump) const;
  // Its host saw it stopped and it never ran again: a stand-in dump, or a postmortem of a
  // process killed while stopped.
  bool IsStopped(int dump) const;
  bool IsExited(int dump) const;
  // An exit record of a normal end after completing everything it issued: status 0, no
  // uncaught exception, no error, nothing in flight, every communicator's issued ops completed.
  bool EndedNormally(int dump) const;
  bool IsErrored(int dump) const;
  // Its error only says that another rank failed (ncclRemoteError).
  bool IsRemoteError(int dump) const;
  int FindInFlight(int dump, const std::string& comm, int64_t seq) const;
  // Whether the GPU reached an operation's ncclGroupStart/End group: the group is one launch with
  // one marker pair per stream, which its first operation holds (the others read `enqueued`).
  bool GroupStarted(int dump, const trace::Op& op) const;

 private:
  void IndexCommunicators();
  // Members without a dump: when the known members' global ranks are base + stride * comm
  // rank (world, TP and DP groups are), the missing ones follow the same rule.
  void InferMissingGlobals(CommIndex* c);
  // The kind of a member that did not complete the operation, from its dump alone; kGpuLag
  // when its dump says nothing against it (the caller decides from its sequence state).
  BlockKind KindFromDump(int dump) const;
  int FindP2pInFlight(int dump, const std::string& comm, trace::OpKind kind, int peer, int64_t p2p_seq) const;
  // The sequence number a communicator is blocked at, or -1: the lowest one that some member
  // issued and has not completed, skipping one that every other member completed (the few left
  // did their part: their own GPUs hold them, and they show up as missing from the next one).
  // Sequence numbers, not the ring, so ring overflow does not matter.
  int64_t BlockedSeq(int ci) const;
  // A communicator some members are still creating: the ones inside ncclCommInitRank* wait
  // for the members that never joined (no state for it).
  void BuildInitBlockedOp(int ci);
  void BuildCollectiveBlockedOp(int ci);
  void BuildReplayBlockedOp(int ci);
  // The collective blocked op of communicator `c` at `s`, described as a mismatch when its
  // members are inside differing calls (by_signature), becomes c's.
  void AddCollectiveBlockedOp(CommIndex& c, int64_t s, const std::map<Signature, std::vector<int>>& by_signature,
                              BlockedOp blocked);
  void DescribeMismatch(const CommIndex& c, int64_t s, const std::map<Signature, std::vector<int>>& by_signature, BlockedOp* blocked);
  // One blocked operation per incomplete Send/Recv transfer, keyed by (comm, src, dst, p2p_seq), built
  // from whichever side recorded it.
  void BuildP2pBlockedOps();
  void AddP2pSide(BlockedOp* blocked, int comm_rank, bool send);
  // Both sides' records compared (P2pMatch); a completed side's from its ring when details are at hand.
  void MatchP2pSides(BlockedOp* blocked);
  // A transfer whose sides agree and that nothing else blocks waits for the rest of its group on
  // each waiting rank: an edge to each of the group's operations that is itself blocked.
  void LinkP2pGroups();
  bool HeldOnlyByItsGroup(const BlockedOp& b) const;
  // A rank that ended (exited, died) owes nothing to a transfer it completed, or issued while
  // its peer completed its side: its counts toward the peer say so, whatever its op list says.
  bool EndedOwingNothing(const BlockedOp& blocked, int dump, int comm_rank, bool send) const;
  int BlockedOpOf(int dump, const trace::Op& op) const;
  // A collective of this rank that the other members completed a while ago: its own GPU (or
  // work queued around the operation on its stream) holds it.
  bool CompletedByPeers(int dump, const trace::Op& op) const;
  // Follow each blocker one step: to the blocked operation it waits on, or to a terminal.
  void ResolveBlockers(int bi);
  void FindCycles();

  const DumpSet& set_;
  const std::vector<Dump>& dumps_;
  DetailReader details_;
  std::vector<CommIndex> comms_;
  std::unordered_map<std::string, int> comm_by_id_;
  std::vector<BlockedOp> blocked_ops_;
  std::map<std::tuple<int, int, int, int64_t>, int> p2p_blocked_ops_;
  std::vector<int> scc_;        // strongly connected component of each blocked op
  std::vector<bool> cyclic_;    // it lies on a wait cycle
};

}  // namespace analysis
}  // namespace ncclwatch
