#include "attribution.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "text_format.h"

namespace ncclwatch {
namespace analysis {

using trace::Cause;
using trace::OpState;

namespace {

// Sizes beyond these are corrupt input, not a real job; they must not size our tables.
constexpr int kMaxCommSize = 1 << 20;
constexpr size_t kMaxMemberSlots = size_t{1} << 23;
// An operation younger than this that its peers completed may just be finishing.
constexpr double kStuckAloneAfterS = 1.0;

// Below this, the framework did not abort because of a hang: an ncclCommAbort with only younger
// operations in flight is a shutdown (frameworks tear down with abort), not a timeout.
constexpr double kFrameworkTimeoutMinS = 1.0;
// Evidence this much older than the newest dump of the attempt may describe an earlier state.
constexpr double kStaleEvidenceS = 60.0;
// ncclResult_t ncclRemoteError: a rank that got it only learned that another one failed.
constexpr int64_t kNcclRemoteError = 6;

// Why a member keeps a blocked operation from completing.
enum class BlockKind {
  kDead,         // no usable dump, or its latest dump is a crash dump
  kError,        // an NCCL call of its returned an error
  kExited,       // it exited normally (its exit record)
  kHostMissing,  // its host never issued the operation
  kGpuLag,       // issued, but its GPU has not reached it
};

// Where the wait ends, once a blocker has been followed.
enum class Terminal {
  kNone,      // it waits on another blocked operation (see Blocker::target)
  kDead,      // rank_dead
  kError,     // nccl_error
  kExited,    // rank_exited
  kBusy,      // host elsewhere and not blocked on any NCCL operation: rank_missing
  kGpuStuck,  // GPU busy with earlier non-NCCL work: gpu_not_reached
};

// The attribution rules, in one place. A blocker's terminal gives the cause (collective,
// point-to-point); each cause has a rank among causes of equal impact and says whether it needs
// the job to show a hang: a snapshot or a SIGTERM of a healthy job finds ranks at different
// sequence numbers, which alone is not a hang, while a crash, an error or an exit that others
// wait for is one at any age.
struct TerminalRule {
  Terminal terminal;
  Cause collective, p2p;
};
constexpr TerminalRule kTerminalRules[] = {
    {Terminal::kDead, Cause::RankDead, Cause::RankDead},
    {Terminal::kError, Cause::NcclError, Cause::NcclError},
    {Terminal::kExited, Cause::RankExited, Cause::RankExited},
    {Terminal::kBusy, Cause::RankMissing, Cause::P2pUnmatched},
    {Terminal::kGpuStuck, Cause::GpuNotReached, Cause::GpuNotReached},
};
struct CauseRule {
  Cause cause;
  int priority;         // lower first, among verdicts blocking as many ranks
  bool needs_hang;      // reported only when the job shows a hang (see JobShowsHang)
};
constexpr CauseRule kCauseRules[] = {
    {Cause::RankDead, 0, false},          {Cause::NcclError, 1, false},
    {Cause::RankExited, 2, false},        {Cause::Mismatch, 3, false},
    {Cause::InitHang, 4, true},           {Cause::CrossCommDeadlock, 5, true},
    {Cause::P2pUnmatched, 6, true},       {Cause::RankMissing, 7, true},
    {Cause::GpuNotReached, 8, true},      {Cause::StuckInCollective, 9, true},
    {Cause::NoHang, 10, false},
};
const CauseRule& RuleOf(Cause c) {
  for (const auto& r : kCauseRules)
    if (r.cause == c) return r;
  return kCauseRules[std::size(kCauseRules) - 1];
}

struct Blocker {
  int comm_rank = -1;
  int global = -1;
  int dump = -1;
  BlockKind kind = BlockKind::kDead;
  int lag_op = -1;  // kGpuLag: index of its operation in the dump's in_flight
  Terminal terminal = Terminal::kNone;
  int target = -1;  // unit this blocker waits on (when terminal == kNone)
};

// One blocked operation: a collective (comm, seq) or one Send/Recv transfer.
struct Unit {
  bool p2p = false;
  bool init = false;  // a communicator's creation (ncclCommInitRank*) that has not returned
  int comm = -1;
  int64_t seq = 0;
  int src = -1, dst = -1;  // p2p: communicator ranks
  std::vector<int> waiting;  // communicator ranks inside the operation, waiting
  std::vector<Blocker> blockers;
  const OpRecord* op = nullptr;  // as a waiting (or any) member recorded it
  double waited_s = -1;
  bool mismatch = false;
  std::vector<MismatchGroup> groups;  // global ranks, majority first
  std::vector<int> minority;          // global ranks
  bool tie = false;
  bool divergence = false;
};

struct CommIndex {
  std::string id;
  std::string name;
  int size = 0;
  std::vector<int> global;  // by communicator rank; -1 unknown
  std::vector<int> dump;    // by communicator rank; -1 none
  int unit = -1;            // its blocked collective, if any
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

int CausePriority(Cause c) { return RuleOf(c).priority; }

bool StateUnknownToGpu(const OpRecord& op) {
  return !op.state.known || op.state.Is(OpState::Unmonitored) || op.state.Is(OpState::Captured);
}

bool NotStarted(const OpRecord& op) {
  return op.state.Is(OpState::Enqueued) || op.state.Is(OpState::PendingLaunch);
}

class Attributor {
 public:
  Attributor(DumpSet& set, const AttributionOptions& options)
      : set_(set), dumps_(set.dumps()), options_(options) {}

  Report Run() {
    IndexCommunicators();
    for (size_t c = 0; c < comms_.size(); ++c) {
      BuildInitUnit(static_cast<int>(c));
      BuildCollectiveUnit(static_cast<int>(c));
    }
    BuildP2pUnits();
    for (size_t u = 0; u < units_.size(); ++u) ResolveBlockers(static_cast<int>(u));
    FindCycles();
    BuildVerdicts();

    Report report;
    report.world_size = set_.world_size();
    report.ranks_seen = static_cast<int>(dumps_.size());
    for (int r = 0; r < std::min(report.world_size, kMaxCommSize); ++r)
      if (set_.IndexOfRank(r) < 0) report.ranks_without_dump.push_back(r);
    report.verdicts = std::move(verdicts_);
    if (report.verdicts.empty()) report.verdicts.push_back(NoHangVerdict(report));
    report.attempts = set_.attempts();
    report.attempt = set_.chosen_attempt();
    AddStaleEvidenceNotes(&report);
    for (const auto& h : set_.history()) report.earlier_dumps.push_back({h.summary.rank, h.file_name, h.summary.reason});
    std::sort(report.earlier_dumps.begin(), report.earlier_dumps.end(),
              [](const auto& a, const auto& b) { return std::tie(a.rank, a.file) < std::tie(b.rank, b.file); });
    report.problems = set_.problems();  // after reading details: includes their problems
    return report;
  }

 private:
  // ------------------------------------------------------------------------------------------
  // Communicators and their members.

  void IndexCommunicators() {
    struct Claim {
      int comm, comm_rank, dump;
    };
    // No communicator is larger than the job: trust the declared world size over a comm size.
    int max_size = kMaxCommSize;
    int declared_world = 0;
    for (const auto& d : dumps_) declared_world = std::max(declared_world, d.summary.world_size);
    if (declared_world > 0) max_size = std::min(max_size, declared_world);
    std::vector<Claim> claims;
    for (size_t d = 0; d < dumps_.size(); ++d) {
      for (const auto& cs : dumps_[d].summary.comms) {
        auto [it, inserted] = comm_by_id_.emplace(cs.id, static_cast<int>(comms_.size()));
        if (inserted) {
          comms_.emplace_back();
          comms_.back().id = cs.id;
        }
        CommIndex& c = comms_[it->second];
        if (c.name.empty()) c.name = cs.name;
        c.size = std::max(c.size, std::min(cs.size, max_size));
        if (cs.rank >= 0 && cs.rank < max_size) {
          c.size = std::max(c.size, cs.rank + 1);
          claims.push_back({it->second, cs.rank, static_cast<int>(d)});
        }
      }
    }
    size_t slots = 0;
    for (auto& c : comms_) {
      slots += static_cast<size_t>(c.size);
      if (slots > kMaxMemberSlots) c.size = 0;  // hostile input: ignore the rest's members
      c.global.assign(c.size, -1);
      c.dump.assign(c.size, -1);
    }
    for (const auto& cl : claims) {
      CommIndex& c = comms_[cl.comm];
      if (cl.comm_rank >= c.size || c.dump[cl.comm_rank] >= 0) continue;  // two dumps claim one slot: keep the first
      c.dump[cl.comm_rank] = cl.dump;
      c.global[cl.comm_rank] = dumps_[cl.dump].summary.rank;
    }
    for (auto& c : comms_) InferMissingGlobals(&c);
  }

  // Members without a dump: when the known members' global ranks are base + stride * comm
  // rank (world, TP and DP groups are), the missing ones follow the same rule.
  void InferMissingGlobals(CommIndex* c) {
    std::vector<std::pair<int, int>> known;  // (comm rank, global)
    for (int r = 0; r < c->size; ++r)
      if (c->global[r] >= 0) known.emplace_back(r, c->global[r]);
    if (known.size() == static_cast<size_t>(c->size)) return;
    long base, stride;
    if (known.size() >= 2) {
      long dr = known[1].first - known[0].first;
      long dg = known[1].second - known[0].second;
      if (dg <= 0 || dg % dr != 0) return;
      stride = dg / dr;
      base = known[0].second - stride * known[0].first;
      for (const auto& k : known)
        if (base + stride * k.first != k.second) return;
    } else if (known.size() == 1 && c->size == set_.world_size() && known[0].first == known[0].second) {
      base = 0, stride = 1;  // a full-size communicator whose one known member has rank == global
    } else {
      return;
    }
    for (int r = 0; r < c->size; ++r) {
      if (c->global[r] >= 0) continue;
      long g = base + stride * r;
      if (g < 0 || g >= std::max(set_.world_size(), 1) || g > kMaxCommSize) continue;
      int d = set_.IndexOfRank(static_cast<int>(g));
      // A present rank that has this communicator under another comm rank contradicts us.
      if (d >= 0 && dumps_[d].summary.Comm(c->id)) continue;
      c->global[r] = static_cast<int>(g);
    }
  }

  const CommSummary* StateOf(int dump, int comm) const {
    return dump < 0 ? nullptr : dumps_[dump].summary.Comm(comms_[comm].id);
  }

  // The dump of a member: its own claim, else the dump of its inferred global rank (a live
  // rank that has not created this communicator yet).
  int DumpOfMember(const CommIndex& c, int comm_rank) const {
    if (c.dump[comm_rank] >= 0) return c.dump[comm_rank];
    return c.global[comm_rank] >= 0 ? set_.IndexOfRank(c.global[comm_rank]) : -1;
  }

  bool Is(int dump, trace::DumpReason r) const { return dumps_[dump].summary.reason == trace::DumpReasonName(r); }
  bool IsDead(int dump) const { return dump < 0 || Is(dump, trace::DumpReason::FatalSignal); }
  bool IsExited(int dump) const {
    return dump >= 0 && (Is(dump, trace::DumpReason::Exit) || Is(dump, trace::DumpReason::ExitInFlight));
  }
  bool IsErrored(int dump) const {
    return dump >= 0 && (Is(dump, trace::DumpReason::NcclError) || Is(dump, trace::DumpReason::AsyncError) ||
                         dumps_[dump].summary.failed.has_value());
  }
  // Its error only says that another rank failed (ncclRemoteError).
  bool IsRemoteError(int dump) const {
    const DumpSummary& s = dumps_[dump].summary;
    if (s.failed) return s.failed->result == kNcclRemoteError;
    return s.detail.find("error " + std::to_string(kNcclRemoteError) + " (") != std::string::npos;
  }
  // The kind of a member that did not complete the operation, from its dump alone; kGpuLag
  // when its dump says nothing against it (the caller decides from its sequence state).
  BlockKind KindFromDump(int dump) const {
    if (IsDead(dump)) return BlockKind::kDead;
    if (IsErrored(dump)) return BlockKind::kError;
    if (IsExited(dump)) return BlockKind::kExited;
    return BlockKind::kGpuLag;
  }

  int FindInFlight(int dump, const std::string& comm, int64_t seq) const {
    const auto& ops = dumps_[dump].summary.in_flight;
    for (size_t i = 0; i < ops.size(); ++i)
      if (!ops[i].IsP2p() && ops[i].comm == comm && ops[i].seq == seq) return static_cast<int>(i);
    return -1;
  }

  int FindP2pInFlight(int dump, const std::string& comm, trace::OpKind kind, int peer,
                      int64_t p2p_seq) const {
    const auto& ops = dumps_[dump].summary.in_flight;
    for (size_t i = 0; i < ops.size(); ++i) {
      const OpRecord& o = ops[i];
      if (o.op_known && o.op == kind && o.comm == comm && o.peer == peer && o.p2p_seq == p2p_seq)
        return static_cast<int>(i);
    }
    return -1;
  }

  // ------------------------------------------------------------------------------------------
  // Blocked operations.

  // The sequence number a communicator is blocked at, or -1: the lowest one that some member
  // issued and has not completed, skipping one that every other member completed (the few left
  // did their part: their own GPUs hold them, and they show up as missing from the next one).
  // Sequence numbers, not the ring, so ring overflow does not matter.
  int64_t BlockedSeq(int ci) const {
    const CommIndex& c = comms_[ci];
    std::vector<const CommSummary*> states;
    bool someone_absent = false;  // no usable state: never entered anything we can see
    for (int r = 0; r < c.size; ++r) {
      const CommSummary* cs = StateOf(DumpOfMember(c, r), ci);
      if (cs) states.push_back(cs);
      else someone_absent = true;
    }
    std::vector<int64_t> candidates;
    for (const CommSummary* cs : states) candidates.push_back(cs->last_completed + 1);
    std::sort(candidates.begin(), candidates.end());
    candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
    for (int64_t s : candidates) {
      size_t completed = 0, inside = 0, missing = 0;
      for (const CommSummary* cs : states) {
        if (cs->last_completed >= s) ++completed;
        else if (cs->last_enqueued >= s) ++inside;
        else ++missing;
      }
      if (inside == 0) continue;
      bool left_behind = completed > 0 && missing == 0 && !someone_absent && inside <= completed;
      if (!left_behind) return s;
    }
    return -1;
  }

  // A communicator some members are still creating: the ones inside ncclCommInitRank* wait
  // for the members that never joined (no state for it).
  void BuildInitUnit(int ci) {
    const CommIndex& c = comms_[ci];
    const std::string initializing = trace::CommStateName(trace::CommState::Initializing);
    Unit u;
    u.init = true;
    u.comm = ci;
    for (int r = 0; r < c.size; ++r) {
      int d = DumpOfMember(c, r);
      const CommSummary* cs = StateOf(d, ci);
      if (cs && cs->state == initializing) {
        u.waiting.push_back(r);
        for (const auto& t : dumps_[d].summary.in_nccl) u.waited_s = std::max(u.waited_s, t.since_s);
      } else if (!cs) {
        Blocker b;
        b.comm_rank = r;
        b.global = c.global[r];
        b.dump = d;
        b.kind = BlockKind::kHostMissing;
        u.blockers.push_back(b);
      }
    }
    if (u.waiting.empty()) return;
    units_.push_back(std::move(u));
  }

  void BuildCollectiveUnit(int ci) {
    CommIndex& c = comms_[ci];
    int64_t s = BlockedSeq(ci);
    if (s < 0) return;

    Unit u;
    u.comm = ci;
    u.seq = s;
    std::map<Signature, std::vector<int>> by_signature;  // -> global ranks
    for (int r = 0; r < c.size; ++r) {
      int d = DumpOfMember(c, r);
      const CommSummary* cs = StateOf(d, ci);
      Blocker b;
      b.comm_rank = r;
      b.global = c.global[r];
      b.dump = d;
      if (cs && cs->last_completed >= s) continue;  // a member that completed it (see BlockedSeq)
      if (KindFromDump(d) != BlockKind::kGpuLag) {
        b.kind = KindFromDump(d);
        u.blockers.push_back(b);
        continue;
      }
      if (!cs || cs->last_enqueued < s) {
        b.kind = BlockKind::kHostMissing;
        u.blockers.push_back(b);
        continue;
      }
      int oi = FindInFlight(d, c.id, s);
      const OpRecord* op = oi >= 0 ? &dumps_[d].summary.in_flight[oi] : nullptr;
      if (op) {
        by_signature[{op->OpName(), op->count, op->dtype, op->root, op->redop}].push_back(b.global);
        if (!u.op) u.op = op;
      }
      bool reached = cs->last_gpu_reached >= s || (op && StateUnknownToGpu(*op));
      if (reached) {
        u.waiting.push_back(r);
        if (op && op->age_s > u.waited_s) u.waited_s = op->age_s;
        if (op) u.op = op;
      } else {
        b.kind = BlockKind::kGpuLag;
        b.lag_op = oi;
        u.blockers.push_back(b);
      }
    }
    if (by_signature.size() > 1) DescribeMismatch(c, s, by_signature, &u);
    c.unit = static_cast<int>(units_.size());
    units_.push_back(std::move(u));
  }

  void DescribeMismatch(const CommIndex& c, int64_t s,
                        const std::map<Signature, std::vector<int>>& by_signature, Unit* u) {
    u->mismatch = true;
    std::vector<std::pair<Signature, std::vector<int>>> groups(by_signature.begin(), by_signature.end());
    for (auto& g : groups) std::sort(g.second.begin(), g.second.end());
    // Majority first; on a tie the group holding the lowest rank counts as the majority.
    std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
      if (a.second.size() != b.second.size()) return a.second.size() > b.second.size();
      return a.second.front() < b.second.front();
    });
    u->tie = groups[0].second.size() == groups[1].second.size();
    for (size_t i = 0; i < groups.size(); ++i) {
      const Signature& sig = groups[i].first;
      MismatchGroup mg;
      mg.ranks = groups[i].second;
      mg.op = sig.op;
      mg.count = sig.count;
      mg.dtype = sig.dtype;
      mg.root = sig.root;
      mg.redop = sig.redop;
      for (int g : mg.ranks) {
        int d = set_.IndexOfRank(g);
        int oi = d >= 0 ? FindInFlight(d, c.id, s) : -1;
        if (oi >= 0) {
          mg.bytes = dumps_[d].summary.in_flight[oi].bytes;
          if (i == 0) u->op = &dumps_[d].summary.in_flight[oi];
          break;
        }
      }
      if (i > 0) u->minority.insert(u->minority.end(), mg.ranks.begin(), mg.ranks.end());
      u->groups.push_back(std::move(mg));
    }
    // Call-count divergence: one side is one call ahead, so its op at s is the other's at s+1.
    auto op_after = [&](const std::vector<int>& ranks) -> std::string {
      for (int g : ranks) {
        int d = set_.IndexOfRank(g);
        int oi = d >= 0 ? FindInFlight(d, c.id, s + 1) : -1;
        if (oi >= 0) return dumps_[d].summary.in_flight[oi].OpName();
      }
      return "";
    };
    const auto& major = groups[0];
    for (size_t i = 1; i < groups.size() && !u->divergence; ++i) {
      std::string minor_next = op_after(groups[i].second);
      std::string major_next = op_after(major.second);
      u->divergence = (!minor_next.empty() && minor_next == major.first.op && groups[i].first.op != major.first.op) ||
                      (!major_next.empty() && major_next == groups[i].first.op && groups[i].first.op != major.first.op);
    }
  }

  // One unit per incomplete Send/Recv transfer, keyed by (comm, src, dst, p2p_seq), built
  // from whichever side recorded it.
  void BuildP2pUnits() {
    for (size_t d = 0; d < dumps_.size(); ++d) {
      for (const OpRecord& op : dumps_[d].summary.in_flight) {
        if (!op.IsP2p() || op.state.Is(OpState::Completed) || op.p2p_seq <= 0) continue;
        auto cit = comm_by_id_.find(op.comm);
        if (cit == comm_by_id_.end()) continue;
        const CommSummary* cs = StateOf(static_cast<int>(d), cit->second);
        if (!cs || cs->rank < 0 || op.peer < 0 || op.peer >= comms_[cit->second].size) continue;
        bool send = op.op == trace::OpKind::Send;
        int src = send ? cs->rank : op.peer, dst = send ? op.peer : cs->rank;
        auto k = std::make_tuple(cit->second, src, dst, op.p2p_seq);
        if (p2p_units_.count(k)) continue;
        Unit u;
        u.p2p = true;
        u.comm = cit->second;
        u.src = src;
        u.dst = dst;
        u.seq = op.p2p_seq;
        u.op = &op;
        AddP2pSide(&u, src, true);
        AddP2pSide(&u, dst, false);
        if (u.waiting.empty() && u.blockers.empty()) continue;  // both sides done
        p2p_units_[k] = static_cast<int>(units_.size());
        units_.push_back(std::move(u));
      }
    }
  }

  void AddP2pSide(Unit* u, int comm_rank, bool send) {
    const CommIndex& c = comms_[u->comm];
    int other = send ? u->dst : u->src;
    Blocker b;
    b.comm_rank = comm_rank;
    b.global = c.global[comm_rank];
    b.dump = DumpOfMember(c, comm_rank);
    if (KindFromDump(b.dump) != BlockKind::kGpuLag) {
      b.kind = KindFromDump(b.dump);
      u->blockers.push_back(b);
      return;
    }
    auto kind = send ? trace::OpKind::Send : trace::OpKind::Recv;
    int oi = FindP2pInFlight(b.dump, c.id, kind, other, u->seq);
    if (oi >= 0) {
      const OpRecord& op = dumps_[b.dump].summary.in_flight[oi];
      if (op.state.Is(OpState::Completed)) return;
      if (NotStarted(op)) {
        b.kind = BlockKind::kGpuLag;
        b.lag_op = oi;
        u->blockers.push_back(b);
      } else {
        u->waiting.push_back(comm_rank);
        u->waited_s = std::max(u->waited_s, op.age_s);
        u->op = &op;
      }
      return;
    }
    // Not in flight: the p2p counters say whether it was issued (and completed) at all.
    const CommSummary* cs = StateOf(b.dump, u->comm);
    const P2pCounters* pc = cs ? cs->P2pWith(other) : nullptr;
    int64_t issued = pc ? (send ? pc->send_enqueued : pc->recv_enqueued) : 0;
    if (issued >= u->seq) return;  // issued and no longer in flight: completed
    b.kind = BlockKind::kHostMissing;
    u->blockers.push_back(b);
  }

  int UnitOfOp(int dump, const OpRecord& op) const {
    auto cit = comm_by_id_.find(op.comm);
    if (cit == comm_by_id_.end()) return -1;
    if (op.IsP2p()) {
      const CommSummary* cs = StateOf(dump, cit->second);
      if (!cs) return -1;
      bool send = op.op == trace::OpKind::Send;
      auto it = p2p_units_.find(std::make_tuple(cit->second, send ? cs->rank : op.peer,
                                                send ? op.peer : cs->rank, op.p2p_seq));
      return it == p2p_units_.end() ? -1 : it->second;
    }
    int u = comms_[cit->second].unit;
    return u >= 0 && op.seq >= units_[u].seq ? u : -1;
  }

  // A collective of this rank that the other members completed a while ago: its own GPU (or
  // work queued around the operation on its stream) holds it.
  bool CompletedByPeers(int dump, const OpRecord& op) const {
    if (op.IsP2p() || (op.age_s >= 0 && op.age_s < kStuckAloneAfterS)) return false;
    auto cit = comm_by_id_.find(op.comm);
    if (cit == comm_by_id_.end()) return false;
    const CommIndex& c = comms_[cit->second];
    bool others = false;
    for (int r = 0; r < c.size; ++r) {
      const CommSummary* cs = StateOf(c.dump[r], cit->second);
      if (!cs || c.dump[r] == dump) continue;
      if (cs->last_completed < op.seq) return false;
      others = true;
    }
    return others;
  }

  // Follow each blocker one step: to the blocked operation it waits on, or to a terminal.
  void ResolveBlockers(int ui) {
    Unit& u = units_[ui];
    if (u.mismatch || u.init) return;  // the calls disagree / nobody joined: nothing to follow
    for (Blocker& b : u.blockers) {
      if (b.kind == BlockKind::kDead || b.kind == BlockKind::kError || b.kind == BlockKind::kExited) {
        b.terminal = b.kind == BlockKind::kDead ? Terminal::kDead
                     : b.kind == BlockKind::kError ? Terminal::kError
                                                    : Terminal::kExited;
        continue;
      }
      const auto& ops = dumps_[b.dump].summary.in_flight;
      if (b.kind == BlockKind::kHostMissing) {
        // Its host is held by its oldest blocked operation, if any; an old operation that its
        // peers completed means its own GPU is stuck; with neither it is busy elsewhere.
        bool stuck_alone = false;
        for (const OpRecord& op : ops) {
          if (op.state.Is(OpState::Completed)) continue;
          int t = UnitOfOp(b.dump, op);
          if (t >= 0 && t != ui) {
            b.target = t;
            break;
          }
          stuck_alone = stuck_alone || (t < 0 && CompletedByPeers(b.dump, op));
        }
        if (b.target < 0) b.terminal = stuck_alone ? Terminal::kGpuStuck : Terminal::kBusy;
        continue;
      }
      // GPU lag: the operation ahead of it on its stream holds the GPU. Without its own op
      // record we cannot tell what is ahead of it.
      const OpRecord* mine = b.lag_op >= 0 ? &ops[b.lag_op] : nullptr;
      for (int i = b.lag_op - 1; mine && i >= 0; --i) {
        const OpRecord& ahead = ops[i];
        if (ahead.state.Is(OpState::Completed)) continue;
        if (!mine->stream.empty() && !ahead.stream.empty() && ahead.stream != mine->stream) continue;
        int t = UnitOfOp(b.dump, ahead);
        b.target = t == ui ? -1 : t;
        break;
      }
      if (b.target < 0) b.terminal = Terminal::kGpuStuck;
    }
  }

  // ------------------------------------------------------------------------------------------
  // Deadlocks: strongly connected components of the unit wait-for graph (iterative Tarjan).

  void FindCycles() {
    size_t n = units_.size();
    scc_.assign(n, -1);
    std::vector<int> index(n, -1), low(n, 0);
    std::vector<bool> on_stack(n, false);
    std::vector<int> stack;
    int counter = 0, comps = 0;
    auto targets = [&](int v) {
      std::vector<int> t;
      for (const auto& b : units_[v].blockers)
        if (b.target >= 0) t.push_back(b.target);
      return t;
    };
    std::vector<std::vector<int>> adj(n);
    for (size_t v = 0; v < n; ++v) adj[v] = targets(static_cast<int>(v));
    for (size_t root = 0; root < n; ++root) {
      if (index[root] >= 0) continue;
      std::vector<std::pair<int, size_t>> call{{static_cast<int>(root), 0}};
      index[root] = low[root] = counter++;
      stack.push_back(static_cast<int>(root));
      on_stack[root] = true;
      while (!call.empty()) {
        auto& [v, i] = call.back();
        if (i < adj[v].size()) {
          int w = adj[v][i++];
          if (index[w] < 0) {
            index[w] = low[w] = counter++;
            stack.push_back(w);
            on_stack[w] = true;
            call.emplace_back(w, 0);
          } else if (on_stack[w]) {
            low[v] = std::min(low[v], index[w]);
          }
          continue;
        }
        int done = v;
        call.pop_back();
        if (low[done] == index[done]) {
          int w;
          do {
            w = stack.back();
            stack.pop_back();
            on_stack[w] = false;
            scc_[w] = comps;
          } while (w != done);
          ++comps;
        }
        if (!call.empty()) low[call.back().first] = std::min(low[call.back().first], low[done]);
      }
    }
    std::vector<int> comp_size(comps, 0);
    for (int c : scc_) ++comp_size[c];
    cyclic_.assign(n, false);
    for (size_t v = 0; v < n; ++v) {
      cyclic_[v] = comp_size[scc_[v]] > 1;
      for (int t : adj[v]) cyclic_[v] = cyclic_[v] || t == static_cast<int>(v);
    }
  }

  // ------------------------------------------------------------------------------------------
  // Verdicts.

  struct CulpritRef {
    int global = -1;
    int comm_rank = -1;
    int dump = -1;
  };

  struct Draft {
    Verdict v;               // culprit lists are filled from `culprits` at the end
    std::vector<int> units;  // root units; units[0] is the primary
    std::vector<CulpritRef> culprits;
    std::string merge_key;  // drafts with equal keys describe one root cause
  };

  void BuildVerdicts() {
    std::vector<Draft> drafts;
    std::vector<bool> cycle_done(units_.size(), false);
    for (size_t ui = 0; ui < units_.size(); ++ui) {
      Unit& u = units_[ui];
      int i = static_cast<int>(ui);
      if (u.init) {
        std::vector<const Blocker*> bs;
        for (const auto& b : u.blockers) bs.push_back(&b);
        drafts.push_back(TerminalDraft(i, Cause::InitHang, bs));
        continue;
      }
      if (u.mismatch) {
        drafts.push_back(MismatchDraft(i));
        continue;
      }
      if (u.blockers.empty()) {
        drafts.push_back(TerminalDraft(i, Cause::StuckInCollective, {}));
        continue;
      }
      for (const TerminalRule& rule : kTerminalRules) {
        std::vector<const Blocker*> bs;
        for (const auto& b : u.blockers)
          if (b.terminal == rule.terminal) bs.push_back(&b);
        // Ranks that only heard of another's failure (ncclRemoteError) are not its cause.
        if (rule.terminal == Terminal::kError) {
          auto remote = [&](const Blocker* b) { return IsRemoteError(b->dump); };
          if (!std::all_of(bs.begin(), bs.end(), remote)) bs.erase(std::remove_if(bs.begin(), bs.end(), remote), bs.end());
        }
        if (!bs.empty()) drafts.push_back(TerminalDraft(i, u.p2p ? rule.p2p : rule.collective, bs));
      }
      if (cyclic_[ui] && !cycle_done[ui]) drafts.push_back(CycleDraft(i, &cycle_done));
    }
    AddCrashedRanksNobodyWaitsFor(&drafts);
    // Without a sign of a hang, ranks at different sequence numbers are a job stopped (or
    // snapshotted) while healthy: the dumps were taken at slightly different moments.
    if (!JobShowsHang()) {
      size_t before = drafts.size();
      drafts.erase(std::remove_if(drafts.begin(), drafts.end(),
                                  [](const Draft& d) { return RuleOf(d.v.cause).needs_hang; }),
                   drafts.end());
      stopped_while_healthy_ = drafts.size() < before || stopped_while_healthy_;
    }
    std::vector<Draft> merged = Merge(std::move(drafts));
    for (auto& d : merged) AddConsequences(&d);

    std::sort(merged.begin(), merged.end(), [&](const Draft& a, const Draft& b) {
      size_t ia = Impact(a), ib = Impact(b);
      if (ia != ib) return ia > ib;
      int pa = CausePriority(a.v.cause), pb = CausePriority(b.v.cause);
      if (pa != pb) return pa < pb;
      return std::tie(a.v.comm, a.v.seq) < std::tie(b.v.comm, b.v.seq);
    });
    for (auto& d : merged) {
      FillCulpritLists(&d);
      AddEvidence(&d);
      AddAdviceFacts(&d);
      verdicts_.push_back(std::move(d.v));
    }
  }

  // Whether anything in the dumps shows a hang rather than a job stopped while healthy: an
  // operation past its deadline (a stall, or a request from one), the framework's abort with
  // an operation waiting longer than a shutdown takes, an NCCL error, a crash.
  bool JobShowsHang() const {
    using R = trace::DumpReason;
    const std::string stall = trace::DumpReasonName(R::Stall);
    for (size_t i = 0; i < dumps_.size(); ++i) {
      int d = static_cast<int>(i);
      const DumpSummary& s = dumps_[i].summary;
      // An error of a call that created nothing (a failed ncclCommInitRank) hangs nobody.
      if (Is(d, R::Stall) || Is(d, R::FatalSignal) || Is(d, R::AsyncError) || s.failed) return true;
      if (s.trigger && s.trigger->reason == stall) return true;
      for (const auto& op : s.in_flight) {
        if (op.deadline_s > 0 && op.age_s >= op.deadline_s) return true;
        if (Is(d, R::Abort) && op.age_s >= kFrameworkTimeoutMinS) return true;
      }
    }
    return false;
  }

  void AddStaleEvidenceNotes(Report* report) const {
    int64_t newest = 0;
    for (const auto& d : dumps_) newest = std::max(newest, d.summary.time_unix_ns);
    for (const auto& d : dumps_) {
      double behind = static_cast<double>(newest - d.summary.time_unix_ns) / 1e9;
      if (d.summary.time_unix_ns > 0 && behind > kStaleEvidenceS)
        report->notes.push_back("rank " + std::to_string(d.summary.rank) + "'s evidence (" + d.file_name + ", " +
                                d.summary.reason + ") is " + FormatSeconds(behind) +
                                " older than the newest dump: it may describe an earlier state");
    }
    if (report->attempts.size() > 1)
      report->notes.push_back(std::to_string(report->attempts.size()) + " attempts of the job in this directory; " +
                              "analyzing attempt " + std::to_string(report->attempt) +
                              (report->attempt == static_cast<int>(report->attempts.size()) ? " (the latest)" : "") +
                              "; --attempt N picks another");
  }

  std::vector<int> Globals(const Unit& u, const std::vector<int>& comm_ranks) const {
    std::vector<int> g;
    for (int r : comm_ranks)
      if (comms_[u.comm].global[r] >= 0) g.push_back(comms_[u.comm].global[r]);
    std::sort(g.begin(), g.end());
    return g;
  }

  Verdict BaseVerdict(int ui, Cause cause) const {
    const Unit& u = units_[ui];
    const CommIndex& c = comms_[u.comm];
    Verdict v;
    v.cause = cause;
    v.comm = c.id;
    v.comm_name = c.name;
    v.comm_size = c.size;
    v.seq = u.seq;
    v.p2p = u.p2p;
    if (u.p2p) {
      v.p2p_src = c.global[u.src];
      v.p2p_dst = c.global[u.dst];
    }
    if (u.op) {
      v.op = u.op->OpName();
      v.bytes = u.op->bytes;
    }
    if (u.init)  // the creation call the members are inside
      for (int r : u.waiting)
        for (const auto& t : dumps_[DumpOfMember(c, r)].summary.in_nccl)
          if (v.op.empty()) v.op = t.function;
    v.waiting_ranks = Globals(u, u.waiting);
    v.waited_s = u.waited_s;
    return v;
  }

  void AddCulprit(Draft* d, int global, int comm_rank, int dump) {
    for (const auto& c : d->culprits)
      if (global >= 0 ? c.global == global : (c.global < 0 && c.comm_rank == comm_rank)) return;
    d->culprits.push_back({global, comm_rank, dump});
  }

  static std::string CulpritKey(const Draft& d) {
    std::vector<std::pair<int, int>> ids;
    for (const auto& c : d.culprits) ids.emplace_back(c.global, c.global < 0 ? c.comm_rank : -1);
    std::sort(ids.begin(), ids.end());
    std::string key;
    for (const auto& [g, cr] : ids) key += g >= 0 ? std::to_string(g) + "," : "c" + std::to_string(cr) + ",";
    return key;
  }

  void FillCulpritLists(Draft* d) const {
    std::stable_sort(d->culprits.begin(), d->culprits.end(), [](const CulpritRef& a, const CulpritRef& b) {
      return (a.global < 0) != (b.global < 0) ? a.global >= 0 : a.global < b.global;
    });
    for (const auto& c : d->culprits) {
      if (c.global >= 0) d->v.culprit_ranks.push_back(c.global);
      else d->v.culprit_comm_ranks.push_back(c.comm_rank);
    }
  }

  Draft TerminalDraft(int ui, Cause cause, const std::vector<const Blocker*>& blockers) {
    Draft d;
    d.v = BaseVerdict(ui, cause);
    d.units.push_back(ui);
    bool comm_ranks_only = false;
    for (const Blocker* b : blockers) {
      AddCulprit(&d, b->global, b->comm_rank, b->dump);
      comm_ranks_only = comm_ranks_only || b->global < 0;
    }
    // Communicator ranks of different communicators are different ranks: never merge those.
    d.merge_key = std::string(trace::CauseName(cause)) + ":" + CulpritKey(d) +
                  (comm_ranks_only ? comms_[units_[ui].comm].id : "");
    return d;
  }

  Draft MismatchDraft(int ui) {
    const Unit& u = units_[ui];
    Draft d;
    d.v = BaseVerdict(ui, Cause::Mismatch);
    d.units.push_back(ui);
    d.v.groups = u.groups;
    d.v.tie = u.tie;
    d.v.call_count_divergence = u.divergence;
    // Everyone inside the collective is waiting, the minority included; blame the minority.
    std::vector<int> waiting;
    for (const auto& g : u.groups) waiting.insert(waiting.end(), g.ranks.begin(), g.ranks.end());
    std::sort(waiting.begin(), waiting.end());
    d.v.waiting_ranks.clear();
    for (int g : waiting)
      if (std::find(u.minority.begin(), u.minority.end(), g) == u.minority.end())
        d.v.waiting_ranks.push_back(g);
    for (int g : u.minority) AddCulprit(&d, g, -1, set_.IndexOfRank(g));
    d.merge_key = "mismatch:" + std::to_string(ui);
    return d;
  }

  // Walks the cycle through unit ui (edges staying in its component) and names its ranks.
  Draft CycleDraft(int ui, std::vector<bool>* done) {
    std::vector<std::pair<int, const Blocker*>> path;  // (unit, blocker leading out of it)
    std::map<int, size_t> seen;
    int v = ui;
    while (!seen.count(v)) {
      seen[v] = path.size();
      // Prefer a host that never issued the call (the order inversion) over a GPU queued
      // behind a blocked operation on its stream (a bystander of the cycle).
      const Blocker* next = nullptr;
      for (const auto& b : units_[v].blockers)
        if (b.target >= 0 && scc_[b.target] == scc_[v] &&
            (!next || (next->kind != BlockKind::kHostMissing && b.kind == BlockKind::kHostMissing)))
          next = &b;
      if (!next) break;  // cannot happen for a cyclic unit; be safe
      path.emplace_back(v, next);
      v = next->target;
    }
    std::vector<std::pair<int, const Blocker*>> cycle(path.begin() + (seen.count(v) ? seen[v] : 0), path.end());
    for (size_t i = 0; i < units_.size(); ++i)
      if (scc_[i] == scc_[ui]) (*done)[i] = true;
    // Start at the unit with the most waiting ranks: it is the one users see timing out.
    size_t start = 0;
    for (size_t i = 0; i < cycle.size(); ++i)
      if (units_[cycle[i].first].waiting.size() > units_[cycle[start].first].waiting.size()) start = i;
    std::rotate(cycle.begin(), cycle.begin() + start, cycle.end());

    std::set<int> comms_in_cycle;
    for (const auto& step : cycle) comms_in_cycle.insert(units_[step.first].comm);
    Cause cause = comms_in_cycle.size() > 1 ? Cause::CrossCommDeadlock : Cause::P2pUnmatched;
    Draft d;
    d.v = BaseVerdict(cycle.empty() ? ui : cycle[0].first, cause);
    d.units.push_back(cycle.empty() ? ui : cycle[0].first);
    for (size_t i = 1; i < cycle.size(); ++i) d.units.push_back(cycle[i].first);  // not consequences
    if (cycle.empty()) return d;
    // Everyone inside an operation of the cycle waits on the deadlock.
    for (const auto& step : cycle) {
      const Unit& cu = units_[step.first];
      std::vector<int> w = Globals(cu, cu.waiting);
      d.v.waiting_ranks.insert(d.v.waiting_ranks.end(), w.begin(), w.end());
      d.v.waited_s = std::max(d.v.waited_s, cu.waited_s);
    }
    std::sort(d.v.waiting_ranks.begin(), d.v.waiting_ranks.end());
    d.v.waiting_ranks.erase(std::unique(d.v.waiting_ranks.begin(), d.v.waiting_ranks.end()), d.v.waiting_ranks.end());
    // Rank b_{i-1} waits inside unit i for rank b_i.
    const Blocker* prev = cycle.back().second;
    d.v.cycle.push_back(prev->global);
    for (const auto& [unit, b] : cycle) {
      d.v.cycle.push_back(b->global);
      d.v.cycle_steps.push_back("rank " + std::to_string(prev->global) + " waits in " + UnitLabel(unit) +
                                " for rank " + std::to_string(b->global));
      AddCulprit(&d, b->global, b->comm_rank, b->dump);
      prev = b;
    }
    d.merge_key = "cycle:" + std::to_string(ui);
    return d;
  }

  std::string UnitLabel(int ui) const {
    const Unit& u = units_[ui];
    const CommIndex& c = comms_[u.comm];
    std::string op = u.op ? u.op->OpName() : "?";
    std::string s = OpLabel(op, u.seq);
    if (u.p2p)
      s += " " + std::to_string(c.global[u.src]) + "->" + std::to_string(c.global[u.dst]);
    return s + " on " + CommLabel(c.id, c.name);
  }

  // A crash dump nobody waits on (yet) is still a verdict: the job cannot go on without it.
  void AddCrashedRanksNobodyWaitsFor(std::vector<Draft>* drafts) {
    std::set<int> named;
    for (const auto& d : *drafts)
      for (const auto& c : d.culprits) named.insert(c.global);
    for (size_t i = 0; i < dumps_.size(); ++i) {
      const DumpSummary& s = dumps_[i].summary;
      if (!IsDead(static_cast<int>(i)) || named.count(s.rank)) continue;
      Draft d;
      d.v.cause = Cause::RankDead;
      AddCulprit(&d, s.rank, -1, static_cast<int>(i));
      d.merge_key = std::string(trace::CauseName(Cause::RankDead)) + ":" + CulpritKey(d);
      drafts->push_back(std::move(d));
    }
  }

  std::vector<Draft> Merge(std::vector<Draft> drafts) {
    std::vector<Draft> out;
    std::map<std::string, size_t> by_key;
    for (auto& d : drafts) {
      // A transport failure sticks many communicators at once: one verdict for all of them.
      if (d.v.cause == Cause::StuckInCollective) d.merge_key = "stuck";
      auto it = by_key.find(d.merge_key);
      if (it == by_key.end()) {
        by_key[d.merge_key] = out.size();
        out.push_back(std::move(d));
        continue;
      }
      Draft& m = out[it->second];
      // Keep as primary the unit with the most waiting ranks.
      if (!d.units.empty() && (m.units.empty() || units_[d.units[0]].waiting.size() > units_[m.units[0]].waiting.size())) {
        std::vector<int> units = std::move(m.units);
        d.units.insert(d.units.end(), units.begin(), units.end());
        m.v = std::move(d.v);
        m.units = std::move(d.units);
        m.culprits = std::move(d.culprits);
      } else {
        m.units.insert(m.units.end(), d.units.begin(), d.units.end());
      }
    }
    return out;
  }

  Consequence ConsequenceOf(int ui) const {
    const Unit& u = units_[ui];
    const CommIndex& c = comms_[u.comm];
    Consequence q;
    q.comm = c.id;
    q.comm_name = c.name;
    q.comm_size = c.size;
    q.seq = u.seq;
    q.op = u.op ? u.op->OpName() : "";
    q.waiting_ranks = Globals(u, u.waiting);
    return q;
  }

  // Units that wait, directly or through others, on this verdict's root units.
  void AddConsequences(Draft* d) {
    if (d->units.empty()) return;
    if (reverse_.empty() && !units_.empty()) {
      reverse_.resize(units_.size());
      for (size_t v = 0; v < units_.size(); ++v)
        for (const auto& b : units_[v].blockers)
          if (b.target >= 0) reverse_[b.target].push_back(static_cast<int>(v));
    }
    std::vector<bool> seen(units_.size(), false);
    std::vector<int> queue(d->units.begin(), d->units.end());
    for (int u : queue) seen[u] = true;
    for (size_t i = 0; i < queue.size(); ++i)
      for (int w : reverse_[queue[i]])
        if (!seen[w]) {
          seen[w] = true;
          queue.push_back(w);
        }
    // Units of the root itself (a deadlock's cycle) are not consequences; other merged roots are.
    bool cycle = d->v.cause == Cause::CrossCommDeadlock || !d->v.cycle.empty();
    for (size_t i = 1; i < queue.size(); ++i)
      if (!(cycle && i < d->units.size())) d->v.consequences.push_back(ConsequenceOf(queue[i]));
  }

  size_t Impact(const Draft& d) const {
    std::set<int> ranks(d.v.waiting_ranks.begin(), d.v.waiting_ranks.end());
    for (const auto& q : d.v.consequences) ranks.insert(q.waiting_ranks.begin(), q.waiting_ranks.end());
    return ranks.size();
  }

  // ------------------------------------------------------------------------------------------
  // Evidence: stacks of the culprits, read from their full dumps.

  void AddEvidence(Draft* d) {
    const Unit* u = d->units.empty() ? nullptr : &units_[d->units[0]];
    size_t n = std::min(d->culprits.size(), options_.max_evidence);
    for (size_t i = 0; i < n; ++i) {
      int dump = d->culprits[i].dump;
      CulpritEvidence e;
      e.rank = d->culprits[i].global;
      e.comm_rank = d->culprits[i].comm_rank;
      if (u && e.rank >= 0) {
        const CommIndex& c = comms_[u->comm];
        for (int r = 0; r < c.size; ++r)
          if (c.global[r] == e.rank) e.comm_rank = r;
      }
      FillEvidence(u, dump, &e);
      d->v.evidence.push_back(std::move(e));
    }
    if (d->v.cause == Cause::StuckInCollective && !d->v.waiting_ranks.empty()) {
      int w = set_.IndexOfRank(d->v.waiting_ranks.front());
      const DumpDetail* det = w >= 0 ? set_.Detail(w) : nullptr;
      if (det)
        for (const auto& [k, val] : det->process.env)
          if (k.rfind("NCCL_", 0) == 0) d->v.nccl_env[k] = val;
    }
  }

  void FillEvidence(const Unit* u, int dump, CulpritEvidence* e) {
    if (dump < 0) {
      auto it = e->rank >= 0 ? set_.unreadable_ranks().find(e->rank) : set_.unreadable_ranks().end();
      if (it != set_.unreadable_ranks().end()) {
        e->file = it->second;
        e->where = "its dump is unreadable (" + it->second + ")";
      } else {
        e->where = "left no dump";
      }
      e->stack_note = "no stacks: no usable dump";
      return;
    }
    const Dump& dm = dumps_[dump];
    const DumpSummary& s = dm.summary;
    e->host = s.host;
    e->pid = s.pid;
    e->file = dm.file_name;
    e->where = Where(u, dump);

    const DumpDetail* det = set_.Detail(dump);
    if (!det) {
      e->stack_note = "no stacks: " + (dm.detail_problem.empty() ? std::string("details unreadable") : dm.detail_problem);
      return;
    }
    // Call site: its operation in the blocked unit, else its last on that communicator, else
    // its last at all (all from the ring when not in flight).
    const OpRecord* op = s.failed ? &*s.failed : nullptr;
    if (u && !op) {
      const std::string& comm = comms_[u->comm].id;
      int oi = u->p2p ? -1 : FindInFlight(dump, comm, u->seq);
      if (oi >= 0) op = &s.in_flight[oi];
      for (auto it = s.in_flight.begin(); !op && u->p2p && it != s.in_flight.end(); ++it)
        if (it->comm == comm && it->IsP2p()) op = &*it;
      for (auto it = s.in_flight.rbegin(); !op && it != s.in_flight.rend(); ++it)
        if (it->comm == comm) op = &*it;
      for (auto it = det->ring.entries.rbegin(); !op && it != det->ring.entries.rend(); ++it)
        if (it->comm == comm) op = &*it;
    }
    if (!op && !s.in_flight.empty()) op = &s.in_flight.back();
    if (!op && !det->ring.entries.empty()) op = &det->ring.entries.back();
    if (op) {
      auto cit = comm_by_id_.find(op->comm);
      e->callsite_op = OpLabel(op->OpName(), op->IsP2p() ? op->p2p_seq : op->seq) + " on " +
                       CommLabel(op->comm, cit == comm_by_id_.end() ? "" : comms_[cit->second].name);
      if (const Callsite* cs = det->FindCallsite(op->callsite)) e->callsite = cs->stack;
    }
    // Current stack: the thread inside NCCL, else the main thread, else one with Python frames.
    const ThreadStack* t = nullptr;
    if (!s.in_nccl.empty()) t = det->FindThread(s.in_nccl.front().tid);
    if (!t) t = det->FindThread(s.pid);
    for (const auto& th : det->threads)
      if (!t && !th.stack.python.empty()) t = &th;
    if (!t && !det->threads.empty()) t = &det->threads.front();
    if (t) {
      e->current_thread = (t->name.empty() ? "thread" : t->name) + " (tid " + std::to_string(t->tid) + ")";
      e->current = t->stack;
      if (t->stack.Empty() && !t->note.empty()) e->stack_note = t->note;
    } else {
      e->stack_note = "no thread stacks in its dump";
    }
  }

  std::string Where(const Unit* u, int dump) const {
    const DumpSummary& s = dumps_[dump].summary;
    if (IsDead(dump)) return "crashed: " + (s.detail.empty() ? std::string("fatal signal") : s.detail);
    std::string where;
    if (IsErrored(dump)) {
      where = "NCCL error: " + (s.detail.empty() ? std::string("an NCCL call failed") : s.detail);
    } else if (IsExited(dump)) {
      where = "exited" + (s.exit_status >= 0 ? " with status " + std::to_string(s.exit_status) : std::string()) +
              (Is(dump, trace::DumpReason::ExitInFlight) ? " with operations in flight" : "");
    } else if (s.in_nccl.empty()) {
      where = "not inside NCCL";
    } else {
      const InNcclThread& t = s.in_nccl.front();
      where = "inside " + t.function + " for " + FormatSeconds(t.since_s) + " (tid " + std::to_string(t.tid) + ")";
    }
    if (u && !u->p2p) {
      const CommSummary* cs = StateOf(dump, u->comm);
      if (!cs) {
        where += "; it has not created this communicator";
      } else if (cs->last_enqueued < u->seq && cs->last_completed < cs->last_enqueued) {
        where += "; its GPU has not finished #" + std::to_string(cs->last_completed + 1) +
                 ", which the others completed";
      } else if (cs->last_enqueued < u->seq) {
        where += "; last call on this communicator #" + std::to_string(cs->last_enqueued);
      } else {
        int oi = FindInFlight(dump, comms_[u->comm].id, u->seq);
        std::string age = oi >= 0 && s.in_flight[oi].age_s >= 0
                              ? " (issued " + FormatSeconds(s.in_flight[oi].age_s) + " ago)"
                              : "";
        where += cs->last_gpu_reached >= u->seq ? "; its GPU is inside #" + std::to_string(u->seq) + age
                                                : "; its GPU has not reached #" + std::to_string(u->seq) + age;
      }
    }
    if (!dumps_[dump].then.empty()) {
      where += "; then";
      for (const auto& r : dumps_[dump].then) where += " " + r;
    }
    return where;
  }

  // ------------------------------------------------------------------------------------------
  // Facts the advice sentence needs (the sentence itself is the renderer's).

  void AddAdviceFacts(Draft* d) const {
    for (const auto& c : d->culprits) {
      if (c.dump < 0) continue;
      const DumpSummary& s = dumps_[c.dump].summary;
      d->v.culprit_in_nccl = d->v.culprit_in_nccl || !s.in_nccl.empty();
      d->v.culprit_crashed = true;
      if (!d->v.culprit_detail.empty()) continue;
      if (IsErrored(c.dump)) d->v.culprit_detail = s.detail;
      else if (IsExited(c.dump)) d->v.culprit_detail = Where(nullptr, c.dump);
    }
  }

  Verdict NoHangVerdict(const Report& r) const {
    Verdict v;
    v.cause = Cause::NoHang;
    v.stopped_while_healthy = stopped_while_healthy_;
    for (const auto& d : dumps_)
      for (const auto& op : d.summary.in_flight) v.oldest_in_flight_s = std::max(v.oldest_in_flight_s, op.age_s);
    return v;
  }

  DumpSet& set_;
  const std::vector<Dump>& dumps_;
  AttributionOptions options_;
  std::vector<CommIndex> comms_;
  std::unordered_map<std::string, int> comm_by_id_;
  std::vector<Unit> units_;
  std::map<std::tuple<int, int, int, int64_t>, int> p2p_units_;
  std::vector<int> scc_;
  std::vector<bool> cyclic_;
  std::vector<std::vector<int>> reverse_;
  std::vector<Verdict> verdicts_;
  bool stopped_while_healthy_ = false;
};

}  // namespace

Report Attribute(DumpSet& set, const AttributionOptions& options) {
  return Attributor(set, options).Run();
}

}  // namespace analysis
}  // namespace ncclwatch
