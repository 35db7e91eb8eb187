#include "rules/attribution.h"

#include "model/clock_align.h"
#include "rules/slow_ranks.h"

#include <algorithm>
#include <iterator>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "render/text_format.h"
#include "model/wait_graph.h"

namespace ncclwatch {
namespace analysis {

using analysis::Cause;
using trace::OpState;

namespace {

// Below this, the framework did not abort because of a hang: an ncclCommAbort with only younger
// operations in flight is a shutdown (frameworks tear down with abort), not a timeout.
constexpr double kFrameworkTimeoutMinS = 1.0;
// Evidence this much older than the newest dump of the attempt may describe an earlier state.
constexpr double kStaleEvidenceS = 60.0;
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

int CausePriority(Cause c) { return RuleOf(c).priority; }

class Attributor : public WaitGraph {
 public:
  Attributor(DumpSet& set, const AttributionOptions& options) : WaitGraph(set), options_(options) {}

  Report Run() {
    Build();
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








  // ------------------------------------------------------------------------------------------
  // Blocked operations.










  // ------------------------------------------------------------------------------------------
  // Deadlocks: strongly connected components of the unit wait-for graph (iterative Tarjan).


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
      const trace::Summary& s = dumps_[i].summary;
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
    d.merge_key = std::string(analysis::CauseName(cause)) + ":" + CulpritKey(d) +
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
      const trace::Summary& s = dumps_[i].summary;
      if (!IsDead(static_cast<int>(i)) || named.count(s.rank)) continue;
      Draft d;
      d.v.cause = Cause::RankDead;
      AddCulprit(&d, s.rank, -1, static_cast<int>(i));
      d.merge_key = std::string(analysis::CauseName(Cause::RankDead)) + ":" + CulpritKey(d);
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
      evidence_.FillEvidence(u, dump, &e);
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
    for (const auto& c : d->culprits) {
      if (c.dump < 0) continue;
      const trace::Summary& s = dumps_[c.dump].summary;
      d->v.culprit_in_nccl = d->v.culprit_in_nccl || !s.in_nccl.empty();
      d->v.culprit_crashed = true;
      if (!d->v.culprit_detail.empty()) continue;
      if (IsErrored(c.dump)) d->v.culprit_detail = s.detail;
      else if (IsExited(c.dump)) d->v.culprit_detail = evidence_.Where(nullptr, c.dump);
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

  AttributionOptions options_;
  Evidence evidence_{*this, set_};
  std::vector<std::vector<int>> reverse_;
  std::vector<Verdict> verdicts_;
  bool stopped_while_healthy_ = false;
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
  return report;
}

}  // namespace analysis
}  // namespace ncclwatch
