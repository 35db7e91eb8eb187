#include "rules/recovered_stalls.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "rules/attribution.h"

namespace ncclwatch {
namespace analysis {

namespace {

// The stalled operation of a stall dump; for a communicator's creation (no `stalled`
// operation), the creation call: its communicator, sequence number 0, the function it is in.
trace::Op StalledOp(const Dump& d) {
  if (d.summary.stalled) return *d.summary.stalled;
  trace::Op op;
  op.op_name = "communicator creation";
  const std::string initializing = trace::CommStateName(trace::CommState::Initializing);
  for (const auto& c : d.summary.comms)
    if (c.state == initializing) {
      op.comm = c.id;
      break;
    }
  for (const auto& t : d.summary.in_nccl)
    if (t.function.rfind("ncclComm", 0) == 0) {
      op.op_name = t.function;
      op.age_s = t.since_s;
      break;
    }
  return op;
}

// One stalled operation, whichever rank reported it.
using StallKey = std::tuple<std::string, int64_t, std::string, int, int64_t>;
StallKey KeyOf(const trace::Op& op) { return {op.comm, op.seq, op.OpName(), op.peer, op.p2p_seq}; }

// The dumps of the stall's moment: the stall itself, and of every other process the first
// answer to a stall's request taken since the operation got stuck, whichever rank asked (the
// first to get stuck writes the request; the others find it fresh and write none), or its own
// stall dump of the same operation when it answered none. Later dumps, which saw the operation
// complete, are left out.
std::vector<Dump> EpisodeOf(const DumpSet& set, const Dump& stall) {
  const trace::Op stalled = StalledOp(stall);
  const StallKey key = KeyOf(stalled);
  const int64_t stuck_since = stall.summary.time_unix_ns - static_cast<int64_t>(std::max(0.0, stalled.age_s) * 1e9);
  std::map<std::string, const Dump*> chosen;  // process -> its dump of that moment
  chosen[stall.ProcessKey()] = &stall;
  auto consider = [&](const Dump& d) {
    if (d.ProcessKey() == stall.ProcessKey()) return;
    bool answer = d.summary.answered && d.summary.answered->reason == trace::DumpReasonName(trace::DumpReason::Stall) &&
                  d.summary.time_unix_ns >= stuck_since;
    bool same_stall = d.summary.reason.Is(trace::DumpReason::Stall) && KeyOf(StalledOp(d)) == key;
    if (!answer && !same_stall) return;
    auto [it, inserted] = chosen.emplace(d.ProcessKey(), &d);
    if (inserted) return;
    const Dump* have = it->second;
    bool have_answer = have->summary.answered.has_value();
    // An answer to the request beats the process's own stall; of two alike, the earlier.
    if ((answer && !have_answer) || (answer == have_answer && d.summary.dump_seq < have->summary.dump_seq))
      it->second = &d;
  };
  for (const auto* list : {&set.dumps(), &set.history()})
    for (const auto& d : *list) consider(d);
  std::vector<Dump> out;
  for (const auto& [key, d] : chosen) out.push_back(*d);
  return out;
}

}  // namespace

std::vector<RecoveredStall> FindRecoveredStalls(DumpSet& set, size_t* more) {
  *more = 0;
  // One entry per stalled operation: the ranks that reported it, the lowest rank's dump as the
  // episode's origin.
  std::map<StallKey, std::vector<const Dump*>> stalls;
  for (const auto* list : {&set.dumps(), &set.history()})
    for (const auto& d : *list)
      if (set.StallRecovered(d)) stalls[KeyOf(StalledOp(d))].push_back(&d);
  std::vector<std::vector<const Dump*>> ordered;
  for (auto& [key, ds] : stalls) {
    std::sort(ds.begin(), ds.end(), [](const Dump* a, const Dump* b) { return a->summary.rank < b->summary.rank; });
    ordered.push_back(ds);
  }
  // Oldest first, by the wall clock of the origin's dump (only an order for the reader).
  std::sort(ordered.begin(), ordered.end(), [](const auto& a, const auto& b) {
    return a.front()->summary.time_unix_ns < b.front()->summary.time_unix_ns;
  });
  std::vector<RecoveredStall> out;
  for (const auto& ds : ordered) {
    if (out.size() >= kMaxRecoveredStallsExplained) {
      ++*more;
      continue;
    }
    const Dump& origin = *ds.front();
    const trace::Op op = StalledOp(origin);
    RecoveredStall r;
    r.rank = origin.summary.rank;
    r.host = origin.summary.host;
    r.pid = origin.summary.pid;
    r.op.op = op.OpName();
    r.op.seq = op.seq;
    r.op.comm = op.comm;
    if (const trace::CommSummary* c = origin.summary.Comm(op.comm)) r.op.comm_name = c->name;
    for (const Dump* d : ds) r.reported_by.push_back(d->summary.rank);
    r.stalled_after_s = op.age_s;
    if (const trace::Recovery* rec = set.RecoveryOf(origin, op.comm, op.seq)) {
      r.stalled_after_s = rec->stalled_after_s;
      r.recovered_after_s = rec->recovered_after_s;
    }
    // What held it up: the verdict the hang would have had at that moment.
    DumpSet episode;
    episode.LoadFromDumps(EpisodeOf(set, origin));
    AttributionOptions options;
    options.max_evidence = 1;
    options.slow_ranks = 0;
    options.recovered_stalls = false;
    Report at_the_time = Attribute(episode, options);
    const Verdict& v = at_the_time.verdicts.front();
    r.cause = v.cause;
    r.waiting_for = v.culprit_ranks;
    if (!v.evidence.empty()) r.culprit = v.evidence.front();
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace analysis
}  // namespace ncclwatch
