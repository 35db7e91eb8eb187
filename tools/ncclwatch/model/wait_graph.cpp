#include "model/wait_graph.h"

#include <algorithm>
#include <set>


namespace ncclwatch {
namespace analysis {

using trace::OpState;

bool StateUnknownToGpu(const trace::Op& op) {
  return !op.state.known || op.state.Is(OpState::Unmonitored) || op.state.Is(OpState::Captured) ||
         op.state.Is(OpState::Unknown);
}

bool NotStarted(const trace::Op& op) {
  return op.state.Is(OpState::Enqueued) || op.state.Is(OpState::PendingLaunch);
}

WaitGraph::WaitGraph(const DumpSet& set) : WaitGraph(set, DetailReader()) {}

WaitGraph::WaitGraph(const DumpSet& set, DetailReader details)
    : set_(set), dumps_(set.dumps()), details_(std::move(details)) {
  IndexCommunicators();
  for (size_t c = 0; c < comms_.size(); ++c) {
    BuildInitBlockedOp(static_cast<int>(c));
    BuildCollectiveBlockedOp(static_cast<int>(c));
    if (comms_[c].blocked_op < 0) BuildReplayBlockedOp(static_cast<int>(c));
  }
  BuildP2pBlockedOps();
  for (size_t bi = 0; bi < blocked_ops_.size(); ++bi) ResolveBlockers(static_cast<int>(bi));
  LinkP2pGroups();
  FindCycles();
}

void WaitGraph::IndexCommunicators() {
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

void WaitGraph::InferMissingGlobals(CommIndex* c) {
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

const trace::CommSummary* WaitGraph::StateOf(int dump, int comm) const {
  return dump < 0 ? nullptr : dumps_[dump].summary.Comm(comms_[comm].id);
}

int WaitGraph::DumpOfMember(const CommIndex& c, int comm_rank) const {
  if (c.dump[comm_rank] >= 0) return c.dump[comm_rank];
  return c.global[comm_rank] >= 0 ? set_.IndexOfRank(c.global[comm_rank]) : -1;
}

int WaitGraph::CommOf(const std::string& id) const {
  auto it = comm_by_id_.find(id);
  return it == comm_by_id_.end() ? -1 : it->second;
}

namespace {
// Wall clocks of two hosts agree to within this (NTP); closer times are not ordered.
constexpr int64_t kCrossHostClockMarginNs = 1'000'000'000;
}  // namespace

bool WaitGraph::Is(int dump, trace::DumpReason r) const { return dumps_[dump].summary.reason.Is(r); }

bool WaitGraph::IsDead(int dump) const {
  // A process its framework ended after it aborted its wait did not die on its own account.
  if (dump >= 0 && dumps_[dump].framework_ending) return false;
  return dump < 0 || Is(dump, trace::DumpReason::FatalSignal) || IsKilled(dump);
}

bool WaitGraph::IsKilled(int dump) const {
  return dump >= 0 && (Is(dump, trace::DumpReason::Postmortem) || dumps_[dump].gone_before_teardown);
}

bool WaitGraph::IsStopped(int dump) const {
  return dump >= 0 && dumps_[dump].summary.stopped &&
         (Is(dump, trace::DumpReason::Stopped) || Is(dump, trace::DumpReason::Postmortem));
}

bool WaitGraph::IsExited(int dump) const {
  return dump >= 0 && (Is(dump, trace::DumpReason::Exit) || Is(dump, trace::DumpReason::ExitInFlight));
}

bool WaitGraph::EndedNormally(int dump) const {
  if (dump < 0 || !Is(dump, trace::DumpReason::Exit)) return false;
  const trace::Summary& s = dumps_[dump].summary;
  if (s.exit_status != 0 || s.exception || s.failed || !s.in_flight.empty()) return false;
  for (const auto& c : s.comms)
    if (c.last_completed < c.last_enqueued) return false;
  return true;
}

bool WaitGraph::IsErrored(int dump) const {
  return dump >= 0 && (Is(dump, trace::DumpReason::NcclError) || Is(dump, trace::DumpReason::AsyncError) ||
                       dumps_[dump].summary.failed.has_value());
}

bool WaitGraph::IsRemoteError(int dump) const {
  const trace::Summary& s = dumps_[dump].summary;
  if (s.error_result != 0) return s.error_result == kNcclRemoteError;
  return s.failed && s.failed->result == kNcclRemoteError;
}

BlockKind WaitGraph::KindFromDump(int dump) const {
  if (IsStopped(dump)) return BlockKind::kStopped;  // killed while stopped too: the stop is the story
  if (IsDead(dump)) return BlockKind::kDead;
  if (IsErrored(dump)) return BlockKind::kError;
  if (IsExited(dump)) return BlockKind::kExited;
  return BlockKind::kGpuLag;
}

int WaitGraph::FindInFlight(int dump, const std::string& comm, int64_t seq) const {
  const auto& ops = dumps_[dump].summary.in_flight;
  for (size_t i = 0; i < ops.size(); ++i)
    if (!ops[i].IsP2p() && ops[i].comm == comm && ops[i].seq == seq) return static_cast<int>(i);
  return -1;
}

int WaitGraph::FindP2pInFlight(int dump, const std::string& comm, trace::OpKind kind, int peer, int64_t p2p_seq) const {
  const auto& ops = dumps_[dump].summary.in_flight;
  for (size_t i = 0; i < ops.size(); ++i) {
    const trace::Op& o = ops[i];
    if (o.op_known && o.op == kind && o.comm == comm && o.peer == peer && o.p2p_seq == p2p_seq)
      return static_cast<int>(i);
  }
  return -1;
}

int64_t WaitGraph::BlockedSeq(int ci) const {
  const CommIndex& c = comms_[ci];
  std::vector<const trace::CommSummary*> states;
  bool someone_absent = false;  // no usable state: never entered anything we can see
  for (int r = 0; r < c.size; ++r) {
    const trace::CommSummary* cs = StateOf(DumpOfMember(c, r), ci);
    if (cs) states.push_back(cs);
    else someone_absent = true;
  }
  std::vector<int64_t> candidates;
  for (const trace::CommSummary* cs : states) candidates.push_back(cs->last_completed + 1);
  std::sort(candidates.begin(), candidates.end());
  candidates.erase(std::unique(candidates.begin(), candidates.end()), candidates.end());
  for (int64_t s : candidates) {
    size_t completed = 0, inside = 0, missing = 0;
    for (const trace::CommSummary* cs : states) {
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

void WaitGraph::BuildInitBlockedOp(int ci) {
  const CommIndex& c = comms_[ci];
  const std::string initializing = trace::CommStateName(trace::CommState::Initializing);
  BlockedOp blocked;
  blocked.init = true;
  blocked.comm = ci;
  for (int r = 0; r < c.size; ++r) {
    int d = DumpOfMember(c, r);
    const trace::CommSummary* cs = StateOf(d, ci);
    if (cs && cs->state == initializing) {
      blocked.waiting.push_back(r);
      for (const auto& t : dumps_[d].summary.in_nccl) blocked.waited_s = std::max(blocked.waited_s, t.since_s);
    } else if (!cs) {
      Blocker b;
      b.comm_rank = r;
      b.global = c.global[r];
      b.dump = d;
      b.kind = BlockKind::kHostMissing;
      blocked.blockers.push_back(b);
    }
  }
  if (blocked.waiting.empty()) return;
  blocked_ops_.push_back(std::move(blocked));
}

void WaitGraph::BuildCollectiveBlockedOp(int ci) {
  CommIndex& c = comms_[ci];
  int64_t s = BlockedSeq(ci);
  if (s < 0) return;

  BlockedOp blocked;
  blocked.comm = ci;
  blocked.seq = s;
  std::map<Signature, std::vector<int>> by_signature;  // -> global ranks
  bool someone_completed = false;  // then it completed everywhere: a collective ends together
  for (int r = 0; r < c.size; ++r) {
    const trace::CommSummary* cs = StateOf(DumpOfMember(c, r), ci);
    someone_completed = someone_completed || (cs && cs->last_completed >= s);
  }
  // When the members waiting in #s gave up: the first abort of the communicator by one of them
  // with #s in flight for longer than a shutdown takes (the framework's timeout). A member that
  // issued #s only after that, or completed it, came too late for them: to them it never entered
  // (the culprit back from its checkpoint just after PyTorch's timeout), whatever its own wait
  // says after. Wall clocks of two hosts are compared only past a margin.
  const std::string aborted = trace::CommStateName(trace::CommState::Aborted);
  int64_t gave_up_unix = 0;
  std::string gave_up_host;
  auto entered_unix = [&](int d, const trace::Op& op) -> int64_t {
    const trace::Summary& sm = dumps_[d].summary;
    if (sm.time_unix_ns <= 0 || sm.time_mono_ns <= 0 || op.enqueue_ns <= 0) return 0;
    return sm.time_unix_ns - (sm.time_mono_ns - op.enqueue_ns);
  };
  for (int r = 0; r < c.size; ++r) {
    int d = DumpOfMember(c, r);
    const trace::CommSummary* cs = StateOf(d, ci);
    if (!cs || cs->state != aborted || !Is(d, trace::DumpReason::Abort)) continue;
    int oi = FindInFlight(d, c.id, s);
    if (oi < 0 || dumps_[d].summary.in_flight[oi].age_s < kFrameworkTimeoutMinS) continue;
    const int64_t t = dumps_[d].summary.time_unix_ns;
    if (t > 0 && (gave_up_unix == 0 || t < gave_up_unix)) {
      gave_up_unix = t;
      gave_up_host = dumps_[d].summary.host;
    }
  }
  for (int r = 0; r < c.size; ++r) {
    int d = DumpOfMember(c, r);
    const trace::CommSummary* cs = StateOf(d, ci);
    Blocker b;
    b.comm_rank = r;
    b.global = c.global[r];
    b.dump = d;
    if (cs && cs->last_completed >= s) {  // a member that completed it (see BlockedSeq)
      // ... while others had given up waiting in it: it came last, after their abort or as it
      // happened (a simulator completes its side from what they had posted; hardware ends it
      // with theirs), so to them it never came.
      if (gave_up_unix > 0) {
        b.kind = BlockKind::kHostMissing;
        blocked.blockers.push_back(b);
      }
      continue;
    }
    // One that ended after issuing it owes nothing if it completed anywhere (its own record
    // may predate its watchdog's last look).
    if (cs && d >= 0 && KindFromDump(d) != BlockKind::kGpuLag && cs->last_enqueued >= s && someone_completed) continue;
    if (KindFromDump(d) != BlockKind::kGpuLag) {
      b.kind = KindFromDump(d);
      blocked.blockers.push_back(b);
      continue;
    }
    if (!cs || cs->last_enqueued < s) {
      b.kind = BlockKind::kHostMissing;
      blocked.blockers.push_back(b);
      continue;
    }
    int oi = FindInFlight(d, c.id, s);
    const trace::Op* op = oi >= 0 ? &dumps_[d].summary.in_flight[oi] : nullptr;
    if (op && gave_up_unix > 0) {
      const int64_t entered = entered_unix(d, *op);
      const int64_t margin = dumps_[d].summary.host == gave_up_host ? 0 : kCrossHostClockMarginNs;
      if (entered > 0 && entered > gave_up_unix + margin) {
        b.kind = BlockKind::kHostMissing;
        blocked.blockers.push_back(b);
        continue;
      }
    }
    if (op) {
      by_signature[{op->OpName(), op->count, op->dtype, op->root, op->redop}].push_back(b.global);
      if (!blocked.op) blocked.op = op;
    }
    bool reached = cs->last_gpu_reached >= s || (op && StateUnknownToGpu(*op)) || (op && GroupStarted(d, *op));
    if (reached) {
      blocked.waiting.push_back(r);
      if (op && op->age_s > blocked.waited_s) blocked.waited_s = op->age_s;
      if (op) blocked.op = op;
    } else {
      b.kind = BlockKind::kGpuLag;
      b.lag_op = oi;
      blocked.blockers.push_back(b);
    }
  }
  AddCollectiveBlockedOp(c, s, by_signature, std::move(blocked));
}

// Collectives captured into CUDA graphs count as completed at capture on every rank: a hang in
// a replay shows only in the watched captured operations that are in a replay (in_flight with
// `replays`). The one most members wait inside (started on their GPU) is blocked; a member
// with the same operation launched but not reached lags on its GPU (an earlier kernel of the
// graph, or of its stream); one inside another captured operation of the communicator replayed
// the graphs in another order (the calls disagree: a mismatch); one with neither never began
// that replay (its host is elsewhere).
void WaitGraph::BuildReplayBlockedOp(int ci) {
  CommIndex& c = comms_[ci];
  auto in_replay = [&](const trace::Op& op) { return op.replays >= 0 && !op.IsP2p() && op.comm == c.id; };
  std::map<int64_t, int> inside;  // capture-time seq -> members whose GPU is inside it
  for (int r = 0; r < c.size; ++r) {
    const int d = DumpOfMember(c, r);
    if (d < 0) continue;
    for (const trace::Op& op : dumps_[d].summary.in_flight)
      if (in_replay(op) && op.state.Is(OpState::GpuReached)) ++inside[op.seq];
  }
  if (inside.empty()) return;
  int64_t s = inside.begin()->first;
  for (const auto& kv : inside)
    if (kv.second > inside[s]) s = kv.first;
  BlockedOp blocked;
  blocked.comm = ci;
  blocked.seq = s;
  blocked.captured = true;
  std::map<Signature, std::vector<int>> by_signature;
  for (int r = 0; r < c.size; ++r) {
    const int d = DumpOfMember(c, r);
    Blocker b;
    b.comm_rank = r;
    b.global = c.global[r];
    b.dump = d;
    if (KindFromDump(d) != BlockKind::kGpuLag) {
      b.kind = KindFromDump(d);
      blocked.blockers.push_back(b);
      continue;
    }
    const auto& ops = dumps_[d].summary.in_flight;
    int oi = -1, other = -1;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (!in_replay(ops[i])) continue;
      if (ops[i].seq == s && oi < 0) oi = static_cast<int>(i);
      else if (ops[i].seq != s && other < 0 && ops[i].state.Is(OpState::GpuReached)) other = static_cast<int>(i);
    }
    // Inside it; else inside another captured collective of the communicator (even with this
    // one launched behind it: the graphs run in another order there); else launched only.
    if (oi >= 0 && !ops[oi].state.Is(OpState::GpuReached) && other >= 0) oi = -1;
    const trace::Op* op = oi >= 0 ? &ops[oi] : other >= 0 ? &ops[other] : nullptr;
    if (!op) {
      b.kind = BlockKind::kHostMissing;
      blocked.blockers.push_back(b);
      continue;
    }
    by_signature[{op->OpName(), op->count, op->dtype, op->root, op->redop}].push_back(b.global);
    if (!blocked.op) blocked.op = op;
    if (oi < 0 || op->state.Is(OpState::GpuReached)) {
      blocked.waiting.push_back(r);
      blocked.waited_s = std::max(blocked.waited_s, op->age_s);
      blocked.replays = std::max(blocked.replays, op->replays);
      if (oi >= 0) blocked.op = op;
    } else {
      b.kind = BlockKind::kGpuLag;
      b.lag_op = oi;
      blocked.blockers.push_back(b);
    }
  }
  AddCollectiveBlockedOp(c, s, by_signature, std::move(blocked));
}

void WaitGraph::AddCollectiveBlockedOp(CommIndex& c, int64_t s, const std::map<Signature, std::vector<int>>& by_signature,
                                       BlockedOp blocked) {
  if (by_signature.size() > 1) DescribeMismatch(c, s, by_signature, &blocked);
  c.blocked_op = static_cast<int>(blocked_ops_.size());
  blocked_ops_.push_back(std::move(blocked));
}

void WaitGraph::DescribeMismatch(const CommIndex& c, int64_t s, const std::map<Signature, std::vector<int>>& by_signature, BlockedOp* blocked) {
  blocked->mismatch = true;
  std::vector<std::pair<Signature, std::vector<int>>> groups(by_signature.begin(), by_signature.end());
  for (auto& g : groups) std::sort(g.second.begin(), g.second.end());
  // Majority first; on a tie the group holding the lowest rank counts as the majority.
  std::sort(groups.begin(), groups.end(), [](const auto& a, const auto& b) {
    if (a.second.size() != b.second.size()) return a.second.size() > b.second.size();
    return a.second.front() < b.second.front();
  });
  blocked->tie = groups[0].second.size() == groups[1].second.size();
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
        if (i == 0) blocked->op = &dumps_[d].summary.in_flight[oi];
        break;
      }
    }
    if (i > 0) blocked->minority.insert(blocked->minority.end(), mg.ranks.begin(), mg.ranks.end());
    blocked->groups.push_back(std::move(mg));
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
  for (size_t i = 1; i < groups.size() && !blocked->divergence; ++i) {
    std::string minor_next = op_after(groups[i].second);
    std::string major_next = op_after(major.second);
    blocked->divergence = (!minor_next.empty() && minor_next == major.first.op && groups[i].first.op != major.first.op) ||
                    (!major_next.empty() && major_next == groups[i].first.op && groups[i].first.op != major.first.op);
  }
}

void WaitGraph::BuildP2pBlockedOps() {
  for (size_t d = 0; d < dumps_.size(); ++d) {
    for (const trace::Op& op : dumps_[d].summary.in_flight) {
      if (!op.IsP2p() || op.state.Is(OpState::Completed) || op.p2p_seq <= 0) continue;
      auto cit = comm_by_id_.find(op.comm);
      if (cit == comm_by_id_.end()) continue;
      const trace::CommSummary* cs = StateOf(static_cast<int>(d), cit->second);
      if (!cs || cs->rank < 0 || op.peer < 0 || op.peer >= comms_[cit->second].size) continue;
      bool send = op.op == trace::OpKind::Send;
      int src = send ? cs->rank : op.peer, dst = send ? op.peer : cs->rank;
      auto k = std::make_tuple(cit->second, src, dst, op.p2p_seq);
      if (p2p_blocked_ops_.count(k)) continue;
      BlockedOp blocked;
      blocked.p2p = true;
      blocked.comm = cit->second;
      blocked.src = src;
      blocked.dst = dst;
      blocked.seq = op.p2p_seq;
      blocked.op = &op;
      // A side that ended owing nothing did its part: the transfer happened, and whoever still
      // shows it in flight waits on something else (the rest of its group).
      const int src_dump = DumpOfMember(comms_[blocked.comm], src), dst_dump = DumpOfMember(comms_[blocked.comm], dst);
      if ((src_dump >= 0 && KindFromDump(src_dump) != BlockKind::kGpuLag && EndedOwingNothing(blocked, src_dump, src, true)) ||
          (dst_dump >= 0 && KindFromDump(dst_dump) != BlockKind::kGpuLag && EndedOwingNothing(blocked, dst_dump, dst, false)))
        continue;
      AddP2pSide(&blocked, src, true);
      AddP2pSide(&blocked, dst, false);
      if (blocked.waiting.empty() && blocked.blockers.empty()) continue;  // both sides done
      MatchP2pSides(&blocked);
      p2p_blocked_ops_[k] = static_cast<int>(blocked_ops_.size());
      blocked_ops_.push_back(std::move(blocked));
    }
  }
}

void WaitGraph::AddP2pSide(BlockedOp* blocked, int comm_rank, bool send) {
  const CommIndex& c = comms_[blocked->comm];
  int other = send ? blocked->dst : blocked->src;
  Blocker b;
  b.comm_rank = comm_rank;
  b.global = c.global[comm_rank];
  b.dump = DumpOfMember(c, comm_rank);
  P2pSide& side = send ? blocked->send : blocked->recv;
  side.comm_rank = comm_rank;
  side.dump = b.dump;
  if (KindFromDump(b.dump) != BlockKind::kGpuLag) {
    b.kind = KindFromDump(b.dump);
    blocked->blockers.push_back(b);
    return;
  }
  auto kind = send ? trace::OpKind::Send : trace::OpKind::Recv;
  int oi = FindP2pInFlight(b.dump, c.id, kind, other, blocked->seq);
  if (oi >= 0) {
    const trace::Op& op = dumps_[b.dump].summary.in_flight[oi];
    side.op = op;
    side.done = op.state.Is(OpState::Completed);
    if (op.state.Is(OpState::Completed)) return;
    if (NotStarted(op) && !GroupStarted(b.dump, op)) {
      b.kind = BlockKind::kGpuLag;
      b.lag_op = oi;
      blocked->blockers.push_back(b);
    } else {
      blocked->waiting.push_back(comm_rank);
      blocked->waited_s = std::max(blocked->waited_s, op.age_s);
      blocked->op = &op;
    }
    return;
  }
  // Not in flight: the p2p counters say whether it was issued (and completed) at all.
  const trace::CommSummary* cs = StateOf(b.dump, blocked->comm);
  const trace::P2pCounters* pc = cs ? cs->P2pWith(other) : nullptr;
  int64_t issued = pc ? (send ? pc->send_enqueued : pc->recv_enqueued) : 0;
  if (issued >= blocked->seq) {  // issued and no longer in flight: completed
    side.done = true;
    return;
  }
  b.kind = BlockKind::kHostMissing;
  blocked->blockers.push_back(b);
}

bool WaitGraph::GroupStarted(int dump, const trace::Op& op) const {
  if (op.group <= 0 || dump < 0) return false;
  for (const trace::Op& o : dumps_[dump].summary.in_flight)
    if (o.group == op.group && o.stream == op.stream && (o.state.Is(OpState::GpuReached) || o.state.Is(OpState::Completed)))
      return true;
  return false;
}

void WaitGraph::MatchP2pSides(BlockedOp* blocked) {
  const std::string& comm = comms_[blocked->comm].id;
  for (P2pSide* side : {&blocked->send, &blocked->recv}) {
    if (side->op || !side->done || side->dump < 0 || !details_) continue;
    // Completed: its ring may still hold it (the latest record of that transfer).
    const trace::Detail* d = details_(static_cast<size_t>(side->dump));
    if (!d) continue;
    const bool send = side == &blocked->send;
    const auto kind = send ? trace::OpKind::Send : trace::OpKind::Recv;
    const int peer = send ? blocked->dst : blocked->src;
    for (auto it = d->ring.entries.rbegin(); it != d->ring.entries.rend(); ++it)
      if (it->op_known && it->op == kind && it->comm == comm && it->peer == peer && it->p2p_seq == blocked->seq) {
        side->op = *it;
        break;
      }
  }
  blocked->match = P2pMatch::kUnknown;
  if (!blocked->send.op || !blocked->recv.op) return;
  const trace::Op& s = *blocked->send.op;
  const trace::Op& r = *blocked->recv.op;
  if (s.dtype.empty() || r.dtype.empty() || s.count < 0 || r.count < 0) return;
  if (s.dtype != r.dtype) blocked->match = P2pMatch::kTypeMismatch;
  else if (s.count != r.count) blocked->match = P2pMatch::kSizeMismatch;
  else blocked->match = P2pMatch::kMatch;
}

bool WaitGraph::HeldOnlyByItsGroup(const BlockedOp& b) const {
  if (b.waiting.empty() || b.init || b.mismatch || (b.p2p && b.match != P2pMatch::kMatch)) return false;
  return std::all_of(b.blockers.begin(), b.blockers.end(), [](const Blocker& x) { return x.kind == BlockKind::kGroup; });
}

void WaitGraph::LinkP2pGroups() {
  // Edges only from a transfer that its sides' agreement leaves nothing to wait on but its group,
  // to a group member that is blocked for a reason of its own: no cycle among held transfers.
  std::vector<std::vector<int>> links(blocked_ops_.size());
  for (size_t bi = 0; bi < blocked_ops_.size(); ++bi) {
    const BlockedOp& x = blocked_ops_[bi];
    if (!HeldOnlyByItsGroup(x)) continue;
    for (int w : x.waiting) {
      // Its own operation in the transfer (p2p) or the collective, on this waiting rank.
      const trace::Op* own = nullptr;
      int own_dump = -1;
      if (x.p2p) {
        const P2pSide& mine = w == x.send.comm_rank ? x.send : x.recv;
        own = mine.op ? &*mine.op : nullptr;
        own_dump = mine.dump;
      } else {
        own_dump = DumpOfMember(comms_[x.comm], w);
        const int oi = own_dump >= 0 ? FindInFlight(own_dump, comms_[x.comm].id, x.seq) : -1;
        own = oi >= 0 ? &dumps_[own_dump].summary.in_flight[oi] : nullptr;
      }
      if (!own || own->group <= 0 || own_dump < 0) continue;
      struct {
        const trace::Op* op;
        int dump;
      } mine{own, own_dump};
      for (const trace::Op& op : dumps_[mine.dump].summary.in_flight) {
        if (op.group != mine.op->group || op.state.Is(OpState::Completed)) continue;
        const int t = BlockedOpOf(mine.dump, op);
        if (t < 0 || t == static_cast<int>(bi) || HeldOnlyByItsGroup(blocked_ops_[t])) continue;
        if (std::find(links[bi].begin(), links[bi].end(), t) != links[bi].end()) continue;
        links[bi].push_back(t);
        Blocker b;
        b.comm_rank = w;
        b.global = comms_[x.comm].global[w];
        b.dump = mine.dump;
        b.kind = BlockKind::kGroup;
        b.target = t;
        blocked_ops_[bi].blockers.push_back(b);
      }
    }
  }
}

bool WaitGraph::EndedOwingNothing(const BlockedOp& blocked, int dump, int comm_rank, bool send) const {
  const CommIndex& c = comms_[blocked.comm];
  const int other = send ? blocked.dst : blocked.src;
  const trace::CommSummary* cs = StateOf(dump, blocked.comm);
  const trace::P2pCounters* pc = cs ? cs->P2pWith(other) : nullptr;
  if (!pc) return false;
  if ((send ? pc->send_completed : pc->recv_completed) >= blocked.seq) return true;
  if ((send ? pc->send_enqueued : pc->recv_enqueued) < blocked.seq) return false;
  // Issued, not seen completed (its record may predate its watchdog's last look): the peer's
  // side of the same transfer completed, so it happened.
  const int peer_dump = DumpOfMember(c, other);
  const trace::CommSummary* ps = StateOf(peer_dump, blocked.comm);
  const trace::P2pCounters* pp = ps ? ps->P2pWith(comm_rank) : nullptr;
  return pp && (send ? pp->recv_completed : pp->send_completed) >= blocked.seq;
}

int WaitGraph::BlockedOpOf(int dump, const trace::Op& op) const {
  auto cit = comm_by_id_.find(op.comm);
  if (cit == comm_by_id_.end()) return -1;
  if (op.IsP2p()) {
    const trace::CommSummary* cs = StateOf(dump, cit->second);
    if (!cs) return -1;
    bool send = op.op == trace::OpKind::Send;
    auto it = p2p_blocked_ops_.find(std::make_tuple(cit->second, send ? cs->rank : op.peer,
                                              send ? op.peer : cs->rank, op.p2p_seq));
    return it == p2p_blocked_ops_.end() ? -1 : it->second;
  }
  int bi = comms_[cit->second].blocked_op;
  if (bi >= 0 && blocked_ops_[bi].captured) return op.replays >= 0 ? bi : -1;  // any replayed op of the comm
  return bi >= 0 && op.seq >= blocked_ops_[bi].seq ? bi : -1;
}

bool WaitGraph::CompletedByPeers(int dump, const trace::Op& op) const {
  if (op.IsP2p() || (op.age_s >= 0 && op.age_s < kStuckAloneAfterS)) return false;
  auto cit = comm_by_id_.find(op.comm);
  if (cit == comm_by_id_.end()) return false;
  const CommIndex& c = comms_[cit->second];
  bool others = false;
  for (int r = 0; r < c.size; ++r) {
    const trace::CommSummary* cs = StateOf(c.dump[r], cit->second);
    if (!cs || c.dump[r] == dump) continue;
    if (cs->last_completed < op.seq) return false;
    others = true;
  }
  return others;
}

void WaitGraph::ResolveBlockers(int bi) {
  BlockedOp& blocked = blocked_ops_[bi];
  if (blocked.mismatch || blocked.init) return;  // the calls disagree / nobody joined: nothing to follow
  for (Blocker& b : blocked.blockers) {
    if (b.kind == BlockKind::kGroup) continue;  // LinkP2pGroups sets its target
    if (b.kind == BlockKind::kDead || b.kind == BlockKind::kStopped || b.kind == BlockKind::kError ||
        b.kind == BlockKind::kExited) {
      b.terminal = b.kind == BlockKind::kDead      ? Terminal::kDead
                   : b.kind == BlockKind::kStopped ? Terminal::kStopped
                   : b.kind == BlockKind::kError   ? Terminal::kError
                   : !blocked.p2p && EndedNormally(b.dump) ? Terminal::kEnded
                                                     : Terminal::kExited;
      continue;
    }
    const auto& ops = dumps_[b.dump].summary.in_flight;
    if (b.kind == BlockKind::kHostMissing) {
      // Its host is held by its oldest blocked operation, if any; an old operation that its
      // peers completed means its own GPU is stuck; with neither it is busy elsewhere.
      bool stuck_alone = false;
      // Inside the creation of another communicator (a checkpoint group made mid-job, a
      // split): held by the members that never joined it.
      const std::string initializing = trace::CommStateName(trace::CommState::Initializing);
      for (const auto& cs : dumps_[b.dump].summary.comms) {
        const int ci = cs.state == initializing ? CommOf(cs.id) : -1;
        for (size_t t = 0; ci >= 0 && b.target < 0 && t < blocked_ops_.size(); ++t)
          if (blocked_ops_[t].init && blocked_ops_[t].comm == ci && static_cast<int>(t) != bi) b.target = static_cast<int>(t);
      }
      if (b.target >= 0) continue;
      for (const trace::Op& op : ops) {
        if (op.state.Is(OpState::Completed)) continue;
        int t = BlockedOpOf(b.dump, op);
        if (t >= 0 && t != bi) {
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
    const trace::Op* mine = b.lag_op >= 0 ? &ops[b.lag_op] : nullptr;
    for (int i = b.lag_op - 1; mine && i >= 0; --i) {
      const trace::Op& ahead = ops[i];
      if (ahead.state.Is(OpState::Completed)) continue;
      if (mine->group > 0 && ahead.group == mine->group) continue;  // the same launch
      if (!mine->stream.empty() && !ahead.stream.empty() && ahead.stream != mine->stream) continue;
      int t = BlockedOpOf(b.dump, ahead);
      b.target = t == bi ? -1 : t;
      break;
    }
    if (b.target < 0) b.terminal = Terminal::kGpuStuck;
  }
}

void WaitGraph::FindCycles() {
  size_t n = blocked_ops_.size();
  scc_.assign(n, -1);
  std::vector<int> index(n, -1), low(n, 0);
  std::vector<bool> on_stack(n, false);
  std::vector<int> stack;
  int counter = 0, comps = 0;
  auto targets = [&](int v) {
    std::vector<int> t;
    for (const auto& b : blocked_ops_[v].blockers)
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

}  // namespace analysis
}  // namespace ncclwatch
