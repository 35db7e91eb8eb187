#include "rules/attribution.h"

#include "model/clock_align.h"
#include "rules/recovered_stalls.h"
#include "rules/slow_ranks.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "model/wait_graph.h"
#include "rules/causes.h"
#include "rules/evidence.h"

namespace ncclwatch {
namespace analysis {

using trace::OpState;

namespace {

// Evidence this much older than the newest dump of the attempt may describe an earlier state.
constexpr double kStaleEvidenceS = 60.0;
// A wait this much longer than the spread of the dumps' times is not explained by dumps taken
// at slightly different moments (one peer poll, a loaded machine's scheduling).
constexpr double kNotYetMarginS = 1.0;
// The rows named by a blocker's terminal, lower priority first (sorted once).
const std::vector<const CauseRule*>& TerminalRulesByPriority() {
  static const std::vector<const CauseRule*> rows = [] {
    std::vector<const CauseRule*> r;
    for (const auto& row : kCauseRules)
      if (row.terminal != Terminal::kNone) r.push_back(&row);
    std::sort(r.begin(), r.end(), [](const CauseRule* a, const CauseRule* b) { return a->priority < b->priority; });
    return r;
  }();
  return rows;
}

class Attributor {
 public:
  Attributor(DumpSet& set, const AttributionOptions& options) : set_(set), g_(set), options_(options) {}

  Report Run() {
    BuildVerdicts();

    Report report;
    report.world_size = set_.world_size();
    report.ranks_seen = static_cast<int>(g_.dumps().size());
    for (int r = 0; r < std::min(report.world_size, kMaxCommSize); ++r)
      if (set_.IndexOfRank(r) < 0) report.ranks_without_dump.push_back(r);
    report.verdicts = std::move(verdicts_);
    if (report.verdicts.empty()) report.verdicts.push_back(NoHangVerdict(report));
    report.attempts = set_.attempts();
    report.attempt = set_.chosen_attempt();
    AddStaleEvidence(&report);
    for (const auto& [rank, u] : set_.unanswered_ranks())
      report.unanswered.push_back({rank, u.file, trace::DumpReasonName(trace::DumpReason::PeerRequest), u.behind_s});
    for (const auto& h : set_.history()) {
      int i = set_.IndexOfRank(h.summary.rank);
      const Dump* evidence = i >= 0 ? &set_.dumps()[i] : nullptr;
      bool later = evidence && evidence->ProcessKey() == h.ProcessKey() && h.WriteOrder() > evidence->WriteOrder();
      report.earlier_dumps.push_back({h.summary.rank, h.file_name, h.summary.reason, later});
    }
    std::sort(report.earlier_dumps.begin(), report.earlier_dumps.end(),
              [](const auto& a, const auto& b) { return std::tie(a.rank, a.file) < std::tie(b.rank, b.file); });
    report.problems = set_.problems();  // after reading details: includes their problems
    return report;
  }

 private:
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
    std::vector<bool> cycle_done(g_.units().size(), false);
    std::vector<bool> split_ids = SplitIdDrafts(&drafts);
    for (size_t ui = 0; ui < g_.units().size(); ++ui) {
      const BlockedOp& u = g_.units()[ui];
      int i = static_cast<int>(ui);
      if (u.init && split_ids[ui]) continue;
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
      // Terminal causes in priority order, as many as the blockers' terminals name.
      for (const CauseRule* rule : TerminalRulesByPriority()) {
        if (!AppliesTo(*rule, u.p2p)) continue;
        std::vector<const Blocker*> bs;
        for (const auto& b : u.blockers)
          if (b.terminal == rule->terminal) bs.push_back(&b);
        // Ranks that only heard of another's failure (ncclRemoteError) are not its cause.
        if (rule->terminal == Terminal::kError) {
          auto remote = [&](const Blocker* b) { return g_.IsRemoteError(b->dump); };
          if (!std::all_of(bs.begin(), bs.end(), remote)) bs.erase(std::remove_if(bs.begin(), bs.end(), remote), bs.end());
        }
        if (!bs.empty()) drafts.push_back(TerminalDraft(i, rule->cause, bs));
      }
      if (g_.Cyclic(ui) && !cycle_done[ui]) drafts.push_back(CycleDraft(i, &cycle_done));
    }
    AddCrashedRanksNobodyWaitsFor(&drafts);
    // Without a sign of a hang, ranks at different sequence numbers are a job stopped (or
    // snapshotted) while healthy: the dumps were taken at slightly different moments.
    if (!JobShowsHang()) {
      NotYetDue(drafts);
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
      int pa = RuleOf(a.v.cause).priority, pb = RuleOf(b.v.cause).priority;
      if (pa != pb) return pa < pb;
      return std::tie(a.v.comm, a.v.seq) < std::tie(b.v.comm, b.v.seq);
    });
    for (auto& d : merged) {
      FillCulpritLists(&d);
      AddFrameworkEndings(&d);
      AddEvidence(&d);
      AddAdviceFacts(&d);
      verdicts_.push_back(std::move(d.v));
    }
  }

  // Communicators of one size being created with different ids, each waiting for members that
  // are inside another's creation: the ranks did not agree on the unique id (half of them read
  // a stale id file, or rendezvoused elsewhere). One verdict naming who holds which id, not one
  // init_hang per id blaming the other half for never joining. Returns the units it covers.
  std::vector<bool> SplitIdDrafts(std::vector<Draft>* drafts) {
    std::vector<bool> covered(g_.units().size(), false);
    std::map<int, std::vector<int>> by_size;  // communicator size -> init units
    for (size_t ui = 0; ui < g_.units().size(); ++ui)
      if (g_.units()[ui].init) by_size[g_.comms()[g_.units()[ui].comm].size].push_back(static_cast<int>(ui));
    for (auto& [size, units] : by_size) {
      if (units.size() < 2) continue;
      std::set<int> inside;  // global ranks inside one of these creations
      for (int ui : units)
        for (int g : Globals(g_.units()[ui], g_.units()[ui].waiting)) inside.insert(g);
      bool others_inside_another = true;  // every member missing from one is inside another
      for (int ui : units)
        for (const auto& b : g_.units()[ui].blockers)
          others_inside_another = others_inside_another && b.global >= 0 && inside.count(b.global);
      if (!others_inside_another) continue;
      std::vector<std::pair<std::vector<int>, int>> groups;  // (global ranks inside, unit)
      for (int ui : units) groups.emplace_back(Globals(g_.units()[ui], g_.units()[ui].waiting), ui);
      std::sort(groups.begin(), groups.end());  // the group with the lowest rank first
      Draft d;
      d.v = BaseVerdict(groups.front().second, Cause::InitHang);
      for (const auto& [ranks, ui] : groups) {
        const BlockedOp& u = g_.units()[ui];
        const CommIndex& c = g_.comms()[u.comm];
        d.units.push_back(ui);
        covered[ui] = true;
        d.v.id_groups.push_back({c.id, c.name, ranks});
        d.v.waited_s = std::max(d.v.waited_s, u.waited_s);
        // Those that hold another id than the lowest rank (whose id the others would read,
        // as rank 0 usually writes it) are named; all of them are in id_groups.
        if (ui == groups.front().second) continue;
        for (int r : u.waiting) AddCulprit(&d, c.global[r], r, g_.DumpOfMember(c, r));
      }
      d.merge_key = "split_ids:" + std::to_string(size);
      drafts->push_back(std::move(d));
    }
    return covered;
  }

  // Whether anything in the dumps shows a hang rather than a job stopped while healthy: an
  // operation past its deadline (a stall, or a request from one), the framework's abort with
  // an operation waiting longer than a shutdown takes, an NCCL error, a crash.
  bool JobShowsHang() const {
    using R = trace::DumpReason;
    const std::string stall = trace::DumpReasonName(R::Stall);
    for (size_t i = 0; i < g_.dumps().size(); ++i) {
      int d = static_cast<int>(i);
      const trace::Summary& s = g_.dumps()[i].summary;
      const Dump& dump = g_.dumps()[i];
      // An error of a call that created nothing (a failed ncclCommInitRank) hangs nobody.
      if (g_.Is(d, R::FatalSignal) || g_.Is(d, R::AsyncError) || s.failed) return true;
      // A stall whose operation completed later recovered: the job went on, it is no hang.
      if (g_.Is(d, R::Stall) && !set_.StallRecovered(dump)) return true;
      if (s.trigger && s.trigger->reason == stall && !set_.RequestFromRecoveredStall(*s.trigger)) return true;
      for (const auto& op : s.in_flight) {
        if (set_.CompletedLater(dump, op)) continue;
        if (op.deadline_s > 0 && op.age_s >= op.deadline_s) return true;
        if (g_.Is(d, R::Abort) && op.age_s >= kFrameworkTimeoutMinS) return true;
      }
    }
    return false;
  }

  // Before any deadline: the hang-only drafts whose waiting ranks have waited longer than the
  // dumps' times spread (so not an artifact of dumps taken moments apart) are what a later
  // dump would call a hang; the no_hang verdict names them.
  void NotYetDue(std::vector<Draft>& drafts) {
    int64_t first = INT64_MAX, last = 0;
    for (const auto& d : g_.dumps())
      if (d.summary.time_unix_ns > 0) {
        first = std::min(first, d.summary.time_unix_ns);
        last = std::max(last, d.summary.time_unix_ns);
      }
    const double spread_s = last >= first ? static_cast<double>(last - first) / 1e9 : 0;
    for (auto& d : drafts) {
      if (!RuleOf(d.v.cause).needs_hang || d.v.waited_s <= spread_s + kNotYetMarginS) continue;
      NotYet n;
      n.cause = d.v.cause;
      for (const auto& c : d.culprits)
        if (c.global >= 0) n.culprit_ranks.push_back(c.global);
      std::sort(n.culprit_ranks.begin(), n.culprit_ranks.end());
      n.waiting_ranks = d.v.waiting_ranks;
      n.op = d.v.op;
      n.seq = d.v.seq;
      n.waited_s = d.v.waited_s;
      for (int w : d.v.waiting_ranks) {
        int i = set_.IndexOfRank(w);
        if (i < 0) continue;
        for (const auto& op : set_.dumps()[i].summary.in_flight)
          if (op.comm == d.v.comm && op.seq == d.v.seq && op.deadline_s > 0)
            n.deadline_s = std::max(n.deadline_s, op.deadline_s);
      }
      not_yet_.push_back(std::move(n));
    }
    std::sort(not_yet_.begin(), not_yet_.end(), [](const NotYet& a, const NotYet& b) { return a.waited_s > b.waited_s; });
  }

  void AddStaleEvidence(Report* report) const {
    int64_t newest = 0;
    for (const auto& d : g_.dumps()) newest = std::max(newest, d.summary.time_unix_ns);
    for (const auto& d : g_.dumps()) {
      double behind = static_cast<double>(newest - d.summary.time_unix_ns) / 1e9;
      if (d.summary.time_unix_ns > 0 && behind > kStaleEvidenceS)
        report->stale_evidence.push_back({d.summary.rank, d.file_name, d.summary.reason, behind});
    }
  }

  std::vector<int> Globals(const BlockedOp& u, const std::vector<int>& comm_ranks) const {
    std::vector<int> g;
    for (int r : comm_ranks)
      if (g_.comms()[u.comm].global[r] >= 0) g.push_back(g_.comms()[u.comm].global[r]);
    std::sort(g.begin(), g.end());
    return g;
  }

  Verdict BaseVerdict(int ui, Cause cause) const {
    const BlockedOp& u = g_.units()[ui];
    const CommIndex& c = g_.comms()[u.comm];
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
        for (const auto& t : g_.dumps()[g_.DumpOfMember(c, r)].summary.in_nccl)
          if (v.op.empty()) v.op = t.function;
    v.waiting_ranks = Globals(u, u.waiting);
    v.waited_s = WaitedAsOfNewest(u);
    return v;
  }

  // How long the waiting ranks have waited as of their processes' newest dumps: the evidence
  // is the moment the hang began (a stall dump), a later dump (the teardown's SIGTERM) that
  // still shows the operation unfinished says how long the wait lasted.
  double WaitedAsOfNewest(const BlockedOp& u) const {
    double waited = u.waited_s;
    if (u.p2p || u.init) return waited;
    const CommIndex& c = g_.comms()[u.comm];
    for (int r : u.waiting) {
      int d = g_.DumpOfMember(c, r);
      if (d < 0) continue;
      const Dump& dm = g_.dumps()[d];
      int oi = g_.FindInFlight(d, c.id, u.seq);
      if (oi < 0 || dm.last_time_unix_ns <= dm.summary.time_unix_ns || set_.CompletedLater(dm, dm.summary.in_flight[oi])) continue;
      const double later = static_cast<double>(dm.last_time_unix_ns - dm.summary.time_unix_ns) / 1e9;
      waited = std::max(waited, dm.summary.in_flight[oi].age_s + later);
    }
    return waited;
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
    d.merge_key = std::string(analysis::CauseName(cause)) + ":" + CulpritKey(d) +
                  (comm_ranks_only ? g_.comms()[g_.units()[ui].comm].id : "");
    return d;
  }

  Draft MismatchDraft(int ui) {
    const BlockedOp& u = g_.units()[ui];
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
      for (const auto& b : g_.units()[v].blockers)
        if (b.target >= 0 && g_.Component(b.target) == g_.Component(v) &&
            (!next || (next->kind != BlockKind::kHostMissing && b.kind == BlockKind::kHostMissing)))
          next = &b;
      if (!next) break;  // cannot happen for a cyclic unit; be safe
      path.emplace_back(v, next);
      v = next->target;
    }
    std::vector<std::pair<int, const Blocker*>> cycle(path.begin() + (seen.count(v) ? seen[v] : 0), path.end());
    for (size_t i = 0; i < g_.units().size(); ++i)
      if (g_.Component(i) == g_.Component(ui)) (*done)[i] = true;
    // Start at the unit with the most waiting ranks: it is the one users see timing out.
    size_t start = 0;
    for (size_t i = 0; i < cycle.size(); ++i)
      if (g_.units()[cycle[i].first].waiting.size() > g_.units()[cycle[start].first].waiting.size()) start = i;
    std::rotate(cycle.begin(), cycle.begin() + start, cycle.end());

    std::set<int> comms_in_cycle;
    for (const auto& step : cycle) comms_in_cycle.insert(g_.units()[step.first].comm);
    Cause cause = comms_in_cycle.size() > 1 ? Cause::CrossCommDeadlock : Cause::P2pUnmatched;
    Draft d;
    d.v = BaseVerdict(cycle.empty() ? ui : cycle[0].first, cause);
    d.units.push_back(cycle.empty() ? ui : cycle[0].first);
    for (size_t i = 1; i < cycle.size(); ++i) d.units.push_back(cycle[i].first);  // not consequences
    if (cycle.empty()) return d;
    // Everyone inside an operation of the cycle waits on the deadlock.
    for (const auto& step : cycle) {
      const BlockedOp& cu = g_.units()[step.first];
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
      d.v.cycle_steps.push_back(StepOf(unit, prev->global, b->global));
      AddCulprit(&d, b->global, b->comm_rank, b->dump);
      prev = b;
    }
    d.merge_key = "cycle:" + std::to_string(ui);
    return d;
  }

  CycleStep StepOf(int ui, int from, int to) const {
    const BlockedOp& u = g_.units()[ui];
    const CommIndex& c = g_.comms()[u.comm];
    CycleStep step;
    step.from = from;
    step.to = to;
    step.unit = OpRef{u.op ? u.op->OpName() : "?", u.seq, c.id, c.name};
    step.p2p = u.p2p;
    if (u.p2p) {
      step.p2p_src = c.global[u.src];
      step.p2p_dst = c.global[u.dst];
    }
    return step;
  }

  // The waiting ranks whose framework ended them after the wait (DumpSet: an abort mid-wait,
  // then the end): said with the verdict, never a verdict of their own.
  void AddFrameworkEndings(Draft* d) const {
    for (int w : d->v.waiting_ranks) {
      const int i = set_.IndexOfRank(w);
      if (i < 0 || !g_.dumps()[i].framework_ending) continue;
      const Dump::FrameworkEnding& how = *g_.dumps()[i].framework_ending;
      FrameworkEnded e;
      e.rank = w;
      e.reason = how.reason;
      e.exit_status = how.exit_status;
      // A signal's dump says "signal SIGABRT (Aborted)".
      const std::string prefix = "signal ";
      if (how.detail.rfind(prefix, 0) == 0) e.signal = how.detail.substr(prefix.size(), how.detail.find(' ', prefix.size()) - prefix.size());
      d->v.ended_by_framework.push_back(std::move(e));
    }
  }

  // A crash dump nobody waits on (yet) is still a verdict: the job cannot go on without it.
  void AddCrashedRanksNobodyWaitsFor(std::vector<Draft>* drafts) {
    std::set<int> named;
    for (const auto& d : *drafts)
      for (const auto& c : d.culprits) named.insert(c.global);
    for (size_t i = 0; i < g_.dumps().size(); ++i) {
      const trace::Summary& s = g_.dumps()[i].summary;
      if (!g_.IsDead(static_cast<int>(i)) || named.count(s.rank)) continue;
      Draft d;
      d.v.cause = g_.IsStopped(static_cast<int>(i)) ? Cause::RankStopped : Cause::RankDead;  // killed while stopped
      AddCulprit(&d, s.rank, -1, static_cast<int>(i));
      d.merge_key = std::string(analysis::CauseName(d.v.cause)) + ":" + CulpritKey(d);
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
      if (!d.units.empty() && (m.units.empty() || g_.units()[d.units[0]].waiting.size() > g_.units()[m.units[0]].waiting.size())) {
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
    const BlockedOp& u = g_.units()[ui];
    const CommIndex& c = g_.comms()[u.comm];
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
    if (reverse_.empty() && !g_.units().empty()) {
      reverse_.resize(g_.units().size());
      for (size_t v = 0; v < g_.units().size(); ++v)
        for (const auto& b : g_.units()[v].blockers)
          if (b.target >= 0) reverse_[b.target].push_back(static_cast<int>(v));
    }
    std::vector<bool> seen(g_.units().size(), false);
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
    const BlockedOp* u = d->units.empty() ? nullptr : &g_.units()[d->units[0]];
    size_t n = std::min(d->culprits.size(), options_.max_evidence);
    for (size_t i = 0; i < n; ++i) {
      int dump = d->culprits[i].dump;
      CulpritEvidence e;
      e.rank = d->culprits[i].global;
      e.comm_rank = d->culprits[i].comm_rank;
      if (u && e.rank >= 0) {
        const CommIndex& c = g_.comms()[u->comm];
        for (int r = 0; r < c.size; ++r)
          if (c.global[r] == e.rank) e.comm_rank = r;
      }
      evidence_.Fill(u, dump, &e);
      d->v.evidence.push_back(std::move(e));
    }
    if (d->v.cause == Cause::StuckInCollective && !d->v.waiting_ranks.empty()) {
      int w = set_.IndexOfRank(d->v.waiting_ranks.front());
      const trace::Detail* det = w >= 0 ? set_.Detail(w) : nullptr;
      if (det)
        for (const auto& [k, val] : det->process.env)
          if (k.rfind("NCCL_", 0) == 0) d->v.nccl_env[k] = val;
    }
  }



  // ------------------------------------------------------------------------------------------
  // Facts the advice sentence needs (the sentence itself is the renderer's).

  void AddAdviceFacts(Draft* d) const {
    bool all_unreadable = !d->culprits.empty();
    for (const auto& c : d->culprits) {
      const bool unreadable = c.dump < 0 && c.global >= 0 && set_.unreadable_ranks().count(c.global);
      all_unreadable = all_unreadable && unreadable;
      if (c.dump < 0 && c.global >= 0 && set_.unanswered_ranks().count(c.global)) d->v.culprit_unanswered = true;
    }
    d->v.culprit_unreadable = all_unreadable;
    for (const auto& c : d->culprits) {
      if (c.dump < 0) continue;
      const trace::Summary& s = g_.dumps()[c.dump].summary;
      d->v.culprit_in_nccl = d->v.culprit_in_nccl || !s.in_nccl.empty();
      if (g_.IsStopped(c.dump)) {  // the advice says what stopped it, and whether it was killed so
        d->v.culprit_stopped_killed = d->v.culprit_stopped_killed || g_.Is(c.dump, trace::DumpReason::Postmortem);
        if (!d->v.culprit_position) d->v.culprit_position = evidence_.PositionOf(nullptr, c.dump);
        continue;
      }
      if (g_.IsKilled(c.dump)) {  // the advice says how it ended
        d->v.culprit_killed = true;
        if (!d->v.culprit_position) d->v.culprit_position = evidence_.PositionOf(nullptr, c.dump);
        continue;
      }
      d->v.culprit_crashed = true;
      // The first that says something: an error without a detail leaves room for the next.
      const std::optional<CulpritPosition>& known = d->v.culprit_position;
      if (known && (known->state == CulpritState::Exited || !known->detail.empty())) continue;
      if ((g_.IsErrored(c.dump) && (!s.detail.empty() || !known)) || (!g_.IsErrored(c.dump) && g_.IsExited(c.dump)))
        d->v.culprit_position = evidence_.PositionOf(nullptr, c.dump);
    }
  }

  Verdict NoHangVerdict(const Report& r) const {
    Verdict v;
    v.cause = Cause::NoHang;
    v.not_yet = not_yet_;
    v.stopped_while_healthy = stopped_while_healthy_ && not_yet_.empty();
    for (const auto& d : g_.dumps())
      for (const auto& op : d.summary.in_flight) v.oldest_in_flight_s = std::max(v.oldest_in_flight_s, op.age_s);
    return v;
  }

  DumpSet& set_;
  const WaitGraph g_;  // built once, read-only
  AttributionOptions options_;
  Evidence evidence_{g_, set_};
  std::vector<std::vector<int>> reverse_;
  std::vector<Verdict> verdicts_;
  bool stopped_while_healthy_ = false;
  std::vector<NotYet> not_yet_;
};

}  // namespace

Report Attribute(DumpSet& set, const AttributionOptions& options) {
  Report report = Attributor(set, options).Run();
  bool slow_ranks = options.slow_ranks > 0 ||
                    (options.slow_ranks < 0 && set.dumps().size() <= kSlowRanksDefaultMaxRanks);
  if (slow_ranks && set.dumps().size() >= 2) {
    std::vector<RankTimes> times = CollectRankTimes(set);
    report.findings = FindSlowRanks(set, times, AlignClocks(times));
  }
  if (options.recovered_stalls) report.recovered_stalls = FindRecoveredStalls(set, &report.more_recovered_stalls);
  return report;
}

}  // namespace analysis
}  // namespace ncclwatch
