#include "scenario.h"

#include <algorithm>
#include <cstdio>

namespace ncclwatch {
namespace gen {

using analysis::Cause;
using trace::OpKind;

namespace {

constexpr int kFloat32 = 7, kBfloat16 = 9;
constexpr int kSum = 0;

// Callsite indices (see dump_renderer.cpp, kCallsites).
enum Callsite {
  kCsTpAllGather = 0,
  kCsTpReduceScatter,
  kCsDpAllReduce,
  kCsLossAllReduce,
  kCsSendForward,
  kCsZeroGather,
  kCsFinishedFlags,
  kCsFinalMetrics,
};

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

Operation Collective(CommKind comm, OpKind op, int64_t count, int dtype, int redop, int callsite) {
  Operation o;
  o.comm = comm;
  o.op = op;
  o.count = count;
  o.dtype = dtype;
  o.redop = redop;
  o.callsite = callsite;
  return o;
}

Operation LossAllReduce() {
  return Collective(CommKind::kWorld, OpKind::AllReduce, 1, kFloat32, kSum, kCsLossAllReduce);
}
Operation TpAllGather() {
  return Collective(CommKind::kTp, OpKind::AllGather, 4 << 20, kBfloat16, -1, kCsTpAllGather);
}

ExtraOp At(Operation op, Stage stage, int64_t group = 0) { return {op, stage, group}; }

Operation P2p(OpKind kind, int peer, int64_t count, int dtype) {
  Operation o = Collective(CommKind::kWorld, kind, count, dtype, -1, kCsSendForward);
  o.peer = peer;
  return o;
}

bool InGroupOf(const Topology& t, CommKind k, int a, int b) {
  return t.GroupIndex(k, a) == t.GroupIndex(k, b);
}

// The common shape of "one rank (or a set) keeps the world from completing": members of the
// culprits' TP group wait in their next TP all-gather; everyone else got past it and waits in
// the world all-reduce. Without TP groups everyone waits in the world all-reduce.
void WaitBehind(const Topology& t, const std::vector<int>& culprits, std::vector<RankPlan>* plans) {
  for (int r = 0; r < t.ranks; ++r) {
    bool culprit = false, same_tp = false;
    for (int c : culprits) {
      culprit = culprit || c == r;
      same_tp = same_tp || (t.HasSubComms() && InGroupOf(t, CommKind::kTp, c, r));
    }
    if (culprit) continue;
    RankPlan& p = (*plans)[r];
    if (same_tp) {
      p.extras = {At(TpAllGather(), Stage::kGpuReached)};
    } else {
      if (t.HasSubComms()) p.extras.push_back(At(TpAllGather(), Stage::kCompleted));
      p.extras.push_back(At(LossAllReduce(), Stage::kGpuReached));
    }
  }
}

void MarkFirstWaiter(std::vector<RankPlan>* plans) {
  for (auto& p : *plans)
    if (p.write && !p.fatal && !p.exited && !p.nccl_error && !p.stopped && !p.killed &&
        (p.in_setup || (!p.extras.empty() && p.extras.back().stage != Stage::kCompleted))) {
      p.first_to_stall = true;
      return;
    }
}

}  // namespace

int Topology::CommSize(CommKind k) const {
  switch (k) {
    case CommKind::kTp: return tp;
    case CommKind::kDp: return ranks / tp;
    default: return ranks;
  }
}

int Topology::CommRank(CommKind k, int rank) const {
  switch (k) {
    case CommKind::kTp: return rank % tp;
    case CommKind::kDp: return rank / tp;
    default: return rank;
  }
}

int Topology::GroupIndex(CommKind k, int rank) const {
  switch (k) {
    case CommKind::kTp: return rank / tp;
    case CommKind::kDp: return rank % tp;
    default: return 0;
  }
}

int Topology::GlobalRank(CommKind k, int group, int comm_rank) const {
  switch (k) {
    case CommKind::kTp: return group * tp + comm_rank;
    case CommKind::kDp: return comm_rank * tp + group;
    default: return comm_rank;
  }
}

std::string Topology::CommName(CommKind k, int rank) const {
  switch (k) {
    case CommKind::kTp: return "tp-" + std::to_string(GroupIndex(k, rank));
    case CommKind::kDp: return "dp-" + std::to_string(GroupIndex(k, rank));
    default: return "world";
  }
}

std::string Topology::CommId(CommKind k, int rank) const {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx",
                static_cast<unsigned long long>(Fnv1a(CommName(k, rank) + "/" + std::to_string(ranks))));
  return buf;
}

std::vector<CommKind> Topology::Kinds() const {
  if (HasSubComms()) return {CommKind::kWorld, CommKind::kTp, CommKind::kDp};
  return {CommKind::kWorld};
}

std::vector<Operation> StepOperations(const Topology& topo) {
  if (!topo.HasSubComms())
    return {Collective(CommKind::kWorld, OpKind::AllGather, 4 << 20, kBfloat16, -1, kCsTpAllGather),
            Collective(CommKind::kWorld, OpKind::ReduceScatter, 4 << 20, kBfloat16, kSum, kCsTpReduceScatter),
            LossAllReduce()};
  return {TpAllGather(),
          Collective(CommKind::kTp, OpKind::ReduceScatter, 4 << 20, kBfloat16, kSum, kCsTpReduceScatter),
          Collective(CommKind::kDp, OpKind::AllReduce, 32 << 20, kBfloat16, kSum, kCsDpAllReduce),
          LossAllReduce()};
}

std::vector<std::string> ScenarioNames() {
  std::vector<std::string> names;
  for (const char* n : analysis::kCauseNames) names.push_back(n);
  names.push_back("mixed");
  names.push_back("p2p_mismatch_dtype");
  names.push_back("p2p_missing_recv");
  names.push_back("p2p_pairing_unknown");
  return names;
}

bool BuildScenario(const std::string& name, const Topology& t, int culprit, bool fatal,
                   std::vector<RankPlan>* plans, std::vector<ExpectedVerdict>* truth, std::string* error) {
  plans->assign(t.ranks, RankPlan{});
  truth->clear();
  // The world's next operation, and the culprit's TP group's when the scenario blocks it too.
  const std::vector<CommKind> world = {CommKind::kWorld};
  const std::vector<CommKind> world_or_tp =
      t.HasSubComms() ? std::vector<CommKind>{CommKind::kWorld, CommKind::kTp} : world;
  auto expect = [&](Cause c, std::vector<int> culprits, std::vector<CommKind> comms, bool p2p = false) {
    std::sort(culprits.begin(), culprits.end());
    truth->push_back({c, culprits, comms, p2p});
  };
  auto need = [&](bool ok, const char* what) {
    if (!ok) *error = "scenario " + name + " needs " + what;
    return ok;
  };
  if (!need(culprit >= 0 && culprit < t.ranks, "--culprit within 0..ranks-1")) return false;
  const auto all_waiting_in_world = [&](Stage s) {
    for (auto& p : *plans) p.extras = {At(LossAllReduce(), s)};
  };

  if (name == analysis::CauseName(Cause::NoHang)) {
    for (auto& p : *plans) p.stack = StackKind::kIdle;
    expect(Cause::NoHang, {}, {});
  } else if (name == analysis::CauseName(Cause::RankMissing)) {
    WaitBehind(t, {culprit}, plans);
    (*plans)[culprit].stack = StackKind::kCheckpoint;
    expect(Cause::RankMissing, {culprit}, world_or_tp);
  } else if (name == analysis::CauseName(Cause::RankDead)) {
    WaitBehind(t, {culprit}, plans);
    expect(Cause::RankDead, {culprit}, world_or_tp);
    RankPlan& p = (*plans)[culprit];
    p.write = fatal;
    p.fatal = fatal;
    p.stack = StackKind::kCrash;
  } else if (name == analysis::CauseName(Cause::RankStopped)) {
    // Stopped with SIGSTOP (a debugger) while saving a checkpoint: its host writes its stand-in.
    WaitBehind(t, {culprit}, plans);
    (*plans)[culprit].stopped = true;
    (*plans)[culprit].stack = StackKind::kCheckpoint;
    expect(Cause::RankStopped, {culprit}, world_or_tp);
  } else if (name == analysis::CauseName(Cause::RankExited)) {
    // Uneven inputs: the culprit ran out of batches and left the loop; the others wait.
    WaitBehind(t, {culprit}, plans);
    (*plans)[culprit].exited = true;
    (*plans)[culprit].stack = StackKind::kIdle;
    expect(Cause::RankExited, {culprit}, world_or_tp);
  } else if (name == analysis::CauseName(Cause::ExtraCall)) {
    // The others finished the loop and exited normally; the culprit issues one more all-reduce
    // (its final metrics) and waits in it.
    for (int r = 0; r < t.ranks; ++r) {
      (*plans)[r].exited = r != culprit;
      (*plans)[r].stack = StackKind::kIdle;
    }
    Operation final_metrics = LossAllReduce();
    final_metrics.callsite = kCsFinalMetrics;
    (*plans)[culprit].extras = {At(final_metrics, Stage::kGpuReached)};
    (*plans)[culprit].stack = StackKind::kWaitingSync;
    expect(Cause::ExtraCall, {culprit}, world);
  } else if (name == analysis::CauseName(Cause::JobKilled)) {
    // Every rank SIGKILLed within a few ms while healthy (the scheduler's time limit): some
    // inside the step's all-reduce, the culprit not yet in it.
    for (int r = 0; r < t.ranks; ++r) {
      RankPlan& p = (*plans)[r];
      p.killed = true;
      p.killed_at_ms = 200 + r % 5;
      if (r != culprit) p.extras = {At(LossAllReduce(), Stage::kGpuReached)};
    }
    (*plans)[culprit].killed_at_ms = 300;  // its last issue was 100 ms earlier than theirs
    expect(Cause::JobKilled, {}, {});
  } else if (name == analysis::CauseName(Cause::HostLost)) {
    // The culprit's host is lost: all its ranks end without a word within a few ms; the ranks
    // of the other hosts wait in the world all-reduce.
    std::vector<int> lost;
    for (int r = 0; r < t.ranks; ++r)
      if (r / 8 == culprit / 8) lost.push_back(r);  // ncclwatch-gen puts 8 ranks on a host
    if (!need(static_cast<int>(lost.size()) < t.ranks && lost.size() >= 2, "ranks on at least two hosts (8 a host)"))
      return false;
    WaitBehind(t, lost, plans);
    for (int r : lost) {
      (*plans)[r].killed = true;
      (*plans)[r].killed_at_ms = 400 + r % 7;
    }
    expect(Cause::HostLost, lost, world);
  } else if (name == analysis::CauseName(Cause::NcclError)) {
    // The culprit's next call returned an error; its peers wait inside theirs.
    WaitBehind(t, {culprit}, plans);
    RankPlan& p = (*plans)[culprit];
    p.extras = {At(t.HasSubComms() ? TpAllGather() : LossAllReduce(), Stage::kEnqueued)};
    p.nccl_error = true;
    expect(Cause::NcclError, {culprit}, world_or_tp);
  } else if (name == analysis::CauseName(Cause::InitHang)) {
    // Setup: the culprit never calls ncclCommInitRank; the others wait inside it.
    for (auto& p : *plans) p.in_setup = true;
    (*plans)[culprit].write = false;
    expect(Cause::InitHang, {culprit}, {});
  } else if (name == analysis::CauseName(Cause::GpuNotReached)) {
    all_waiting_in_world(Stage::kGpuReached);
    (*plans)[culprit].extras[0].stage = Stage::kEnqueued;
    (*plans)[culprit].stack = StackKind::kItemSync;
    expect(Cause::GpuNotReached, {culprit}, world);
  } else if (name == analysis::CauseName(Cause::StuckInCollective)) {
    all_waiting_in_world(Stage::kGpuReached);
    expect(Cause::StuckInCollective, {}, world);
  } else if (name == analysis::CauseName(Cause::Mismatch)) {
    // ZeRO-3 generation: the culprit issues one more parameter all-gather than the others.
    for (auto& p : *plans) {
      p.extras = {At(LossAllReduce(), Stage::kGpuReached)};
      p.stack = StackKind::kGenerateSync;
    }
    Operation gather = Collective(CommKind::kWorld, OpKind::AllGather, 1 << 20, kBfloat16, -1, kCsZeroGather);
    (*plans)[culprit].extras = {At(gather, Stage::kGpuReached), At(LossAllReduce(), Stage::kEnqueued)};
    (*plans)[culprit].stack = StackKind::kGenerateGather;
    expect(Cause::Mismatch, {culprit}, world);
  } else if (name == analysis::CauseName(Cause::P2pUnmatched)) {
    // Two pipeline neighbours both send first, with blocking sends: neither posts its receive.
    if (!need(t.ranks >= 2, "2 ranks")) return false;
    int a = culprit, b = (culprit + 1) % t.ranks;
    all_waiting_in_world(Stage::kGpuReached);
    for (auto [me, peer] : {std::pair<int, int>{a, b}, {b, a}}) {
      Operation send = Collective(CommKind::kWorld, OpKind::Send, 8 << 20, kBfloat16, -1, kCsSendForward);
      send.peer = peer;
      (*plans)[me].extras = {At(send, Stage::kGpuReached)};
      (*plans)[me].stack = StackKind::kPipelineSend;
    }
    expect(Cause::P2pUnmatched, {a, b}, world, /*p2p=*/true);
  } else if (name == analysis::CauseName(Cause::CrossCommDeadlock)) {
    // a enters the world all-reduce first, b its TP all-gather first; both then block.
    if (!need(t.HasSubComms(), "--tp > 1 dividing --ranks")) return false;
    int a = culprit, b = t.GlobalRank(CommKind::kTp, t.GroupIndex(CommKind::kTp, a),
                                      (t.CommRank(CommKind::kTp, a) + 1) % t.tp);
    for (int r = 0; r < t.ranks; ++r) {
      RankPlan& p = (*plans)[r];
      if (r == a) p.extras = {At(LossAllReduce(), Stage::kGpuReached)};
      else if (r == b) p.extras = {At(TpAllGather(), Stage::kGpuReached)};
      else if (InGroupOf(t, CommKind::kTp, a, r))
        p.extras = {At(TpAllGather(), Stage::kGpuReached), At(LossAllReduce(), Stage::kEnqueued)};
      else
        p.extras = {At(TpAllGather(), Stage::kCompleted), At(LossAllReduce(), Stage::kGpuReached)};
    }
    expect(Cause::CrossCommDeadlock, {a, b}, world_or_tp);
  } else if (name == analysis::CauseName(Cause::P2pMismatch)) {
    // An expert-parallel token all-to-all, one group of Send/Recv to every peer on each rank; the
    // culprit sends rank b half the elements b expects (a stale capacity). As on NCCL, the send
    // completes (and the culprit's group with it), b's receive never does: b's group waits, its
    // GPU never reaches the loss all-reduce the others wait in.
    if (!need(t.ranks >= 3, "3 ranks")) return false;
    const int a = culprit, b = (culprit + 3) % t.ranks == culprit ? (culprit + 1) % t.ranks : (culprit + 3) % t.ranks;
    const int64_t tokens = 1 << 16;
    for (int r = 0; r < t.ranks; ++r) {
      RankPlan& p = (*plans)[r];
      const Stage s = r == b ? Stage::kGpuReached : Stage::kCompleted;
      p.extras.clear();
      for (int q = 0; q < t.ranks; ++q) {
        if (q == r) continue;
        p.extras.push_back(At(P2p(OpKind::Send, q, r == a && q == b ? tokens / 2 : tokens, kBfloat16), s, 1000 + r));
        p.extras.push_back(At(P2p(OpKind::Recv, q, tokens, kBfloat16), s, 1000 + r));
      }
      p.extras.push_back(At(LossAllReduce(), r == b ? Stage::kEnqueued : Stage::kGpuReached));
    }
    expect(Cause::P2pMismatch, {a, b}, world, /*p2p=*/true);
  } else if (name == "p2p_mismatch_dtype") {
    // A pipeline pair: stage a sends its activations as bfloat16, stage b = a + 1 receives
    // float32 (a cast on one side only): b's receive never completes.
    if (!need(t.ranks >= 2, "2 ranks")) return false;
    const int a = culprit, b = (culprit + 1) % t.ranks;
    all_waiting_in_world(Stage::kGpuReached);
    (*plans)[a].extras = {At(P2p(OpKind::Send, b, 8 << 20, kBfloat16), Stage::kCompleted),
                          At(LossAllReduce(), Stage::kGpuReached)};
    (*plans)[b].extras = {At(P2p(OpKind::Recv, a, 8 << 20, kFloat32), Stage::kGpuReached),
                          At(LossAllReduce(), Stage::kEnqueued)};
    (*plans)[a].stack = (*plans)[b].stack = StackKind::kPipelineSend;
    expect(Cause::P2pMismatch, {a, b}, world, /*p2p=*/true);
  } else if (name == "p2p_missing_recv") {
    // The all-to-all of p2p_mismatch, in which rank b posts no receive from the culprit: the
    // culprit's send (a rendezvous) never completes, nor its group; b's group completes and b
    // waits in the loss all-reduce with the others, which the culprit's GPU never reaches.
    if (!need(t.ranks >= 3, "3 ranks")) return false;
    const int a = culprit, b = (culprit + 3) % t.ranks == culprit ? (culprit + 1) % t.ranks : (culprit + 3) % t.ranks;
    for (int r = 0; r < t.ranks; ++r) {
      RankPlan& p = (*plans)[r];
      const Stage s = r == a ? Stage::kGpuReached : Stage::kCompleted;
      p.extras.clear();
      for (int q = 0; q < t.ranks; ++q) {
        if (q == r) continue;
        p.extras.push_back(At(P2p(OpKind::Send, q, 1 << 16, kBfloat16), s, 1000 + r));
        if (!(r == b && q == a)) p.extras.push_back(At(P2p(OpKind::Recv, q, 1 << 16, kBfloat16), s, 1000 + r));
      }
      p.extras.push_back(At(LossAllReduce(), r == a ? Stage::kEnqueued : Stage::kGpuReached));
    }
    expect(Cause::P2pUnmatched, {b}, world, /*p2p=*/true);
  } else if (name == "p2p_pairing_unknown") {
    // p2p_mismatch_dtype's pipeline pair with matching calls, whose send the sender's ring no
    // longer holds (generate with --ring 1): the sizes cannot be compared, and the report says so.
    if (!need(t.ranks >= 2, "2 ranks")) return false;
    const int a = culprit, b = (culprit + 1) % t.ranks;
    all_waiting_in_world(Stage::kGpuReached);
    (*plans)[a].extras = {At(P2p(OpKind::Send, b, 8 << 20, kBfloat16), Stage::kCompleted),
                          At(LossAllReduce(), Stage::kGpuReached)};
    (*plans)[b].extras = {At(P2p(OpKind::Recv, a, 8 << 20, kBfloat16), Stage::kGpuReached),
                          At(LossAllReduce(), Stage::kEnqueued)};
    expect(Cause::StuckInCollective, {}, world, /*p2p=*/true);
  } else if (name == analysis::CauseName(Cause::P2pOutOfOrder)) {
    // Two pipeline neighbours both receive first, each in a group of its own, then send in a
    // second group: each send is queued behind its own rank's receive.
    if (!need(t.ranks >= 2, "2 ranks")) return false;
    const int a = culprit, b = (culprit + 1) % t.ranks;
    all_waiting_in_world(Stage::kGpuReached);
    for (auto [me, peer] : {std::pair<int, int>{a, b}, {b, a}}) {
      (*plans)[me].extras = {At(P2p(OpKind::Recv, peer, 8 << 20, kBfloat16), Stage::kGpuReached, 2000 + me),
                             At(P2p(OpKind::Send, peer, 8 << 20, kBfloat16), Stage::kEnqueued, 3000 + me),
                             At(LossAllReduce(), Stage::kEnqueued)};
      (*plans)[me].stack = StackKind::kPipelineSend;
    }
    expect(Cause::P2pOutOfOrder, {a, b}, world, /*p2p=*/true);
  } else if (name == "mixed") {
    // Two independent roots in two TP groups; the world all-reduce waits on both.
    if (!need(t.HasSubComms() && t.ranks / t.tp >= 2, "--tp > 1 and at least 2 TP groups")) return false;
    int m = t.GlobalRank(CommKind::kTp, 0, t.tp - 1);  // calls with another dtype
    int g = t.GlobalRank(CommKind::kTp, 1, t.tp - 1);  // GPU never reaches its all-gather
    WaitBehind(t, {m, g}, plans);
    for (int r = 0; r < t.ranks; ++r)
      if (InGroupOf(t, CommKind::kTp, r, m) || InGroupOf(t, CommKind::kTp, r, g))
        (*plans)[r].extras = {At(TpAllGather(), Stage::kGpuReached)};
    Operation wrong = TpAllGather();
    wrong.dtype = kFloat32;
    (*plans)[m].extras = {At(wrong, Stage::kGpuReached)};
    (*plans)[g].extras = {At(TpAllGather(), Stage::kEnqueued)};
    (*plans)[g].stack = StackKind::kItemSync;
    expect(Cause::Mismatch, {m}, {CommKind::kTp});
    expect(Cause::GpuNotReached, {g}, {CommKind::kTp});
  } else {
    *error = "unknown scenario " + name;
    return false;
  }
  MarkFirstWaiter(plans);
  return true;
}

}  // namespace gen
}  // namespace ncclwatch
