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
// Ranks whose last signs of life lie this close ended together: one kill from outside (the
// launcher, the scheduler, a node), not each its own death. Their black boxes say when they
// last lived (the watchdog's poll, every NCCLWATCH_POLL_MS, 100 ms by default).
constexpr double kKilledTogetherMs = 1000.0;
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
  Attributor(DumpSet& set, const AttributionOptions& options)
      : set_(set), g_(set, [&set](size_t dump) { return set.Detail(dump); }), options_(options) {}

  Report Run() {
    BuildVerdicts();

    Report report;
    report.world_size = set_.world_size();
    report.ranks_seen = static_cast<int>(g_.dumps().size());
    if (!set_.shared_launches().launches.empty()) {
      report.launches_comm = set_.shared_launches().comm;
      for (const auto& l : set_.shared_launches().launches) report.launches.push_back({l.first_rank, l.world_size});
    }
    for (int r = 0; r < std::min(report.world_size, kMaxCommSize); ++r)
      if (set_.IndexOfRank(r) < 0) report.ranks_without_dump.push_back(r);
    report.verdicts = std::move(verdicts_);
    if (report.verdicts.empty()) report.verdicts.push_back(NoHangVerdict(report));
    report.attempts = set_.attempts();
    report.attempt = set_.chosen_attempt();
    AddStaleEvidence(&report);
    for (const auto& [rank, blocked] : set_.unanswered_ranks())
      report.unanswered.push_back({rank, blocked.file, trace::DumpReasonName(trace::DumpReason::PeerRequest), blocked.behind_s});
    for (const auto& h : set_.history()) {
      int i = set_.IndexOfRank(h.summary.rank);
      const Dump* evidence = i >= 0 ? &set_.dumps()[i] : nullptr;
      bool later = evidence && evidence->ProcessKey() == h.ProcessKey() && h.WriteOrder() > evidence->WriteOrder();
      report.earlier_dumps.push_back({h.summary.rank, h.file_name, h.summary.reason.Name(), later});
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
    std::vector<int> roots;  // its root blocked operations; roots[0] is the primary
    std::vector<CulpritRef> culprits;
    std::string merge_key;  // drafts with equal keys describe one root cause
  };

  void BuildVerdicts() {
    std::vector<Draft> drafts;
    std::vector<bool> cycle_done(g_.blocked_ops().size(), false);
    std::vector<bool> split_ids = SplitIdDrafts(&drafts);
    for (size_t bi = 0; bi < g_.blocked_ops().size(); ++bi) {
      const BlockedOp& blocked = g_.blocked_ops()[bi];
      int i = static_cast<int>(bi);
      if (blocked.init && split_ids[bi]) continue;
      if (blocked.init) {
        std::vector<const Blocker*> bs;
        for (const auto& b : blocked.blockers) bs.push_back(&b);
        drafts.push_back(TerminalDraft(i, Cause::InitHang, bs));
        continue;
      }
      if (blocked.mismatch) {
        drafts.push_back(MismatchDraft(i));
        continue;
      }
      // Both sides called, nothing else holds either, and they disagree: the transfer itself
      // can never complete (a side still queued or missing is a story of its own first).
      if (blocked.p2p && blocked.blockers.empty() &&
          (blocked.match == P2pMatch::kSizeMismatch || blocked.match == P2pMatch::kTypeMismatch)) {
        drafts.push_back(P2pMismatchDraft(i));
        continue;
      }
      if (blocked.blockers.empty()) {
        Draft d = TerminalDraft(i, Cause::StuckInCollective, {});
        if (blocked.p2p && blocked.match == P2pMatch::kUnknown) {  // say that the pairing is unknown, never guess
          d.v.p2p_mismatch = "unknown";
          for (const P2pSide* side : {&blocked.send, &blocked.recv}) d.v.p2p_calls.push_back(CallOf(blocked, *side));
        }
        drafts.push_back(std::move(d));
        continue;
      }
      // Terminal causes in priority order, as many as the blockers' terminals name.
      for (const CauseRule* rule : TerminalRulesByPriority()) {
        if (!AppliesTo(*rule, blocked.p2p)) continue;
        std::vector<const Blocker*> bs;
        for (const auto& b : blocked.blockers)
          if (b.terminal == rule->terminal) bs.push_back(&b);
        // Ranks that only heard of another's failure (ncclRemoteError) are not its cause.
        if (rule->terminal == Terminal::kError) {
          auto remote = [&](const Blocker* b) { return g_.IsRemoteError(b->dump); };
          if (!std::all_of(bs.begin(), bs.end(), remote)) bs.erase(std::remove_if(bs.begin(), bs.end(), remote), bs.end());
        }
        if (!bs.empty())
          drafts.push_back(rule->terminal == Terminal::kEnded ? EndedDraft(i, bs) : TerminalDraft(i, rule->cause, bs));
      }
      if (g_.Cyclic(bi) && !cycle_done[bi]) drafts.push_back(CycleDraft(i, &cycle_done));
    }
    AddCrashedRanksNobodyWaitsFor(&drafts);
    KilledTogether(&drafts);
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
  // init_hang per id blaming the other half for never joining. Returns the blocked operations it covers.
  std::vector<bool> SplitIdDrafts(std::vector<Draft>* drafts) {
    std::vector<bool> covered(g_.blocked_ops().size(), false);
    std::map<int, std::vector<int>> by_size;  // communicator size -> blocked inits
    for (size_t bi = 0; bi < g_.blocked_ops().size(); ++bi)
      if (g_.blocked_ops()[bi].init) by_size[g_.comms()[g_.blocked_ops()[bi].comm].size].push_back(static_cast<int>(bi));
    for (auto& [size, inits] : by_size) {
      if (inits.size() < 2) continue;
      std::set<int> inside;  // global ranks inside one of these creations
      for (int bi : inits)
        for (int g : Globals(g_.blocked_ops()[bi], g_.blocked_ops()[bi].waiting)) inside.insert(g);
      bool others_inside_another = true;  // every member missing from one is inside another
      for (int bi : inits)
        for (const auto& b : g_.blocked_ops()[bi].blockers)
          others_inside_another = others_inside_another && b.global >= 0 && inside.count(b.global);
      if (!others_inside_another) continue;
      std::vector<std::pair<std::vector<int>, int>> groups;  // (global ranks inside, blocked init)
      for (int bi : inits) groups.emplace_back(Globals(g_.blocked_ops()[bi], g_.blocked_ops()[bi].waiting), bi);
      std::sort(groups.begin(), groups.end());  // the group with the lowest rank first
      Draft d;
      d.v = BaseVerdict(groups.front().second, Cause::InitHang);
      for (const auto& [ranks, bi] : groups) {
        const BlockedOp& blocked = g_.blocked_ops()[bi];
        const CommIndex& c = g_.comms()[blocked.comm];
        d.roots.push_back(bi);
        covered[bi] = true;
        d.v.id_groups.push_back({c.id, c.name, ranks});
        d.v.waited_s = std::max(d.v.waited_s, blocked.waited_s);
        // Those that hold another id than the lowest rank (whose id the others would read,
        // as rank 0 usually writes it) are named; all of them are in id_groups.
        if (bi == groups.front().second) continue;
        for (int r : blocked.waiting) AddCulprit(&d, c.global[r], r, g_.DumpOfMember(c, r));
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
      if (s.answered && s.answered->reason == stall && !set_.RequestFromRecoveredStall(*s.answered)) return true;
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
        report->stale_evidence.push_back({d.summary.rank, d.file_name, d.summary.reason.Name(), behind});
    }
  }

  std::vector<int> Globals(const BlockedOp& blocked, const std::vector<int>& comm_ranks) const {
    std::vector<int> g;
    for (int r : comm_ranks)
      if (g_.comms()[blocked.comm].global[r] >= 0) g.push_back(g_.comms()[blocked.comm].global[r]);
    std::sort(g.begin(), g.end());
    return g;
  }

  Verdict BaseVerdict(int bi, Cause cause) const {
    const BlockedOp& blocked = g_.blocked_ops()[bi];
    const CommIndex& c = g_.comms()[blocked.comm];
    Verdict v;
    v.cause = cause;
    v.comm = c.id;
    v.comm_name = c.name;
    v.comm_size = c.size;
    v.seq = blocked.seq;
    v.p2p = blocked.p2p;
    if (blocked.p2p) {
      v.p2p_src = c.global[blocked.src];
      v.p2p_dst = c.global[blocked.dst];
    }
    if (blocked.op) {
      v.op = blocked.op->OpName();
      v.bytes = blocked.op->bytes;
    }
    if (blocked.init)  // the creation call the members are inside
      for (int r : blocked.waiting)
        for (const auto& t : g_.dumps()[g_.DumpOfMember(c, r)].summary.in_nccl)
          if (v.op.empty()) v.op = t.function;
    v.waiting_ranks = Globals(blocked, blocked.waiting);
    v.waited_s = WaitedAsOfNewest(blocked);
    v.captured = blocked.captured;
    v.replays = blocked.replays;
    return v;
  }

  // How long the waiting ranks have waited as of their processes' newest dumps: the evidence
  // is the moment the hang began (a stall dump), a later dump (the teardown's SIGTERM) that
  // still shows the operation unfinished says how long the wait lasted.
  double WaitedAsOfNewest(const BlockedOp& blocked) const {
    double waited = blocked.waited_s;
    if (blocked.p2p || blocked.init) return waited;
    const CommIndex& c = g_.comms()[blocked.comm];
    for (int r : blocked.waiting) {
      int d = g_.DumpOfMember(c, r);
      if (d < 0) continue;
      const Dump& dm = g_.dumps()[d];
      int oi = g_.FindInFlight(d, c.id, blocked.seq);
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

  Draft TerminalDraft(int bi, Cause cause, const std::vector<const Blocker*>& blockers) {
    Draft d;
    d.v = BaseVerdict(bi, cause);
    d.roots.push_back(bi);
    bool comm_ranks_only = false;
    for (const Blocker* b : blockers) {
      AddCulprit(&d, b->global, b->comm_rank, b->dump);
      comm_ranks_only = comm_ranks_only || b->global < 0;
    }
    // Communicator ranks of different communicators are different ranks: never merge those.
    d.merge_key = std::string(analysis::CauseName(cause)) + ":" + CulpritKey(d) +
                  (comm_ranks_only ? g_.comms()[g_.blocked_ops()[bi].comm].id : "");
    return d;
  }

  // Whether a waiting member's call at the blocked seq repeats a call site it used before on
  // that communicator (a loop's next step): 1; a call site of its own, new there (a final metric
  // after the loop): 0; -1 unknown (no dump or details, no call site, nothing earlier in its ring).
  int RepeatsCallsite(const BlockedOp& blocked, int comm_rank) {
    const CommIndex& c = g_.comms()[blocked.comm];
    const int d = g_.DumpOfMember(c, comm_rank);
    const int oi = d < 0 ? -1 : g_.FindInFlight(d, c.id, blocked.seq);
    if (oi < 0) return -1;
    const int64_t callsite = g_.dumps()[d].summary.in_flight[oi].callsite;
    const trace::Detail* det = callsite < 0 ? nullptr : set_.Detail(d);
    if (!det) return -1;
    bool earlier = false;
    for (const auto& e : det->ring.entries) {
      if (e.comm != c.id || e.IsP2p() || e.seq >= blocked.seq) continue;
      if (e.callsite == callsite) return 1;
      earlier = true;
    }
    return earlier ? 0 : -1;
  }

  // Members that ended normally after completing everything never issue the blocked collective.
  // When the waiting ranks issued it from a call site of its own (not their loop's next step: a
  // final metric, a last barrier or log on some ranks), that call is the story (extra_call),
  // with its call site. When it repeats their earlier calls, the ended ranks left the loop
  // early (uneven inputs: rank_exited names them). When the call sites cannot tell, the fewer
  // side is the odd one: the ended ranks when they are fewer. rank_exited too when a member
  // that is not done (busy, dead) is missing as well.
  Draft EndedDraft(int bi, const std::vector<const Blocker*>& ended) {
    const BlockedOp& blocked = g_.blocked_ops()[bi];
    const bool all_ended = std::all_of(blocked.blockers.begin(), blocked.blockers.end(),
                                       [](const Blocker& b) { return b.terminal == Terminal::kEnded; });
    int repeats = -1;  // 1 when any waiting rank repeats a call site, 0 when all are new
    for (int r : blocked.waiting) {
      const int one = RepeatsCallsite(blocked, r);
      if (one == 1 || (one == 0 && repeats == -1)) repeats = one;
    }
    const bool extra = repeats == 0 || (repeats == -1 && blocked.waiting.size() <= ended.size());
    if (!all_ended || blocked.waiting.empty() || !extra) return TerminalDraft(bi, Cause::RankExited, ended);
    const CommIndex& c = g_.comms()[blocked.comm];
    Draft d;
    d.v = BaseVerdict(bi, Cause::ExtraCall);
    d.roots.push_back(bi);
    for (int r : blocked.waiting) AddCulprit(&d, c.global[r], r, g_.DumpOfMember(c, r));
    for (const Blocker* b : ended)
      if (b->global >= 0) d.v.ended_ranks.push_back(b->global);
    std::sort(d.v.ended_ranks.begin(), d.v.ended_ranks.end());
    d.v.ended_after_seq = blocked.seq - 1;  // they completed everything they issued, and not blocked.seq
    d.merge_key = "extra_call:" + CulpritKey(d) + c.id;
    return d;
  }

  // How far apart the last signs of life of these dumps lie, in ms: by their monotonic clock
  // when they share a host, else by their hosts' wall clocks.
  double SpreadMs(const std::vector<int>& dumps) const {
    bool one_host = true;
    for (int d : dumps) one_host = one_host && g_.dumps()[d].summary.host == g_.dumps()[dumps.front()].summary.host;
    int64_t lo = INT64_MAX, hi = INT64_MIN;
    for (int d : dumps) {
      const trace::Summary& s = g_.dumps()[d].summary;
      const int64_t t = one_host ? s.time_mono_ns : s.time_unix_ns;
      lo = std::min(lo, t);
      hi = std::max(hi, t);
    }
    return static_cast<double>(hi - lo) / 1e6;
  }

  // Ranks that ended without a word within a moment of each other are one kill, not each its
  // own death: every rank of the job (job_killed: the launcher, the scheduler, an operator; no
  // rank waits on another), or every rank of one host while others live (host_lost: a node
  // failure, its ranks killed together). Their rank_dead drafts become that one story. A rank
  // the kernel's OOM killer named, or one stopped before, keeps its own.
  void KilledTogether(std::vector<Draft>* drafts) {
    std::vector<int> killed;
    for (size_t i = 0; i < g_.dumps().size(); ++i) {
      const int d = static_cast<int>(i);
      const Dump& dm = g_.dumps()[i];
      if (!g_.Is(d, trace::DumpReason::Postmortem) || g_.IsStopped(d) || dm.gone_before_teardown) continue;
      if (dm.summary.detail.rfind("killed by the kernel's OOM killer", 0) == 0) continue;
      killed.push_back(d);
    }
    if (killed.size() < 2) return;
    const double within_ms = SpreadMs(killed);
    if (within_ms > kKilledTogetherMs) return;
    std::set<int> ranks;
    for (int d : killed) ranks.insert(g_.dumps()[d].summary.rank);
    const std::string host = g_.dumps()[killed.front()].summary.host;
    const bool whole = killed.size() == g_.dumps().size() && set_.world_size() == static_cast<int>(killed.size());
    if (!whole) {  // one host's ranks, all of them, while ranks elsewhere live
      bool others_live = false;
      for (size_t i = 0; i < g_.dumps().size(); ++i) {
        const Dump& dm = g_.dumps()[i];
        if (ranks.count(dm.summary.rank)) continue;
        if (dm.summary.host == host) return;  // a rank of that host did not end so
        others_live = others_live || !g_.IsDead(static_cast<int>(i));
      }
      for (int d : killed)
        if (g_.dumps()[d].summary.host != host) return;
      if (!others_live) return;
    }
    auto folded = [&](const Draft& d) {
      if (d.v.cause != Cause::RankDead || d.culprits.empty()) return false;
      for (const auto& c : d.culprits)
        if (c.global < 0 || !ranks.count(c.global)) return false;
      return true;
    };
    Draft story;
    story.v.cause = whole ? Cause::JobKilled : Cause::HostLost;
    for (const auto& d : *drafts) {  // host_lost: on the operation most ranks wait in
      if (whole || !folded(d) || d.roots.empty()) continue;
      if (story.roots.empty() || d.v.waiting_ranks.size() > story.v.waiting_ranks.size()) {
        story.v = d.v;
        story.v.cause = Cause::HostLost;
        story.roots.insert(story.roots.begin(), d.roots.front());
      } else {
        story.roots.push_back(d.roots.front());
      }
    }
    drafts->erase(std::remove_if(drafts->begin(), drafts->end(), folded), drafts->end());
    story.v.killed_ranks.assign(ranks.begin(), ranks.end());
    story.v.killed_within_ms = within_ms;
    if (!whole) {
      story.v.killed_host = host;
      for (int d : killed) AddCulprit(&story, g_.dumps()[d].summary.rank, -1, d);
    }
    story.merge_key = std::string(CauseName(story.v.cause)) + ":" + host;
    drafts->push_back(std::move(story));
  }

  Draft MismatchDraft(int bi) {
    const BlockedOp& blocked = g_.blocked_ops()[bi];
    Draft d;
    d.v = BaseVerdict(bi, Cause::Mismatch);
    d.roots.push_back(bi);
    d.v.groups = blocked.groups;
    d.v.tie = blocked.tie;
    d.v.call_count_divergence = blocked.divergence;
    // Everyone inside the collective is waiting, the minority included; blame the minority.
    std::vector<int> waiting;
    for (const auto& g : blocked.groups) waiting.insert(waiting.end(), g.ranks.begin(), g.ranks.end());
    std::sort(waiting.begin(), waiting.end());
    d.v.waiting_ranks.clear();
    for (int g : waiting)
      if (std::find(blocked.minority.begin(), blocked.minority.end(), g) == blocked.minority.end())
        d.v.waiting_ranks.push_back(g);
    for (int g : blocked.minority) AddCulprit(&d, g, -1, set_.IndexOfRank(g));
    d.merge_key = "mismatch:" + std::to_string(bi);
    return d;
  }

  // Walks the cycle through blocked operation bi (edges staying in its component) and names its ranks.
  Draft CycleDraft(int bi, std::vector<bool>* done) {
    std::vector<std::pair<int, const Blocker*>> path;  // (blocked op, blocker leading out of it)
    std::map<int, size_t> seen;
    int v = bi;
    while (!seen.count(v)) {
      seen[v] = path.size();
      // Prefer a host that never issued the call (the order inversion) over a GPU queued
      // behind a blocked operation on its stream (a bystander of the cycle).
      const Blocker* next = nullptr;
      for (const auto& b : g_.blocked_ops()[v].blockers)
        if (b.target >= 0 && g_.Component(b.target) == g_.Component(v) &&
            (!next || (next->kind != BlockKind::kHostMissing && b.kind == BlockKind::kHostMissing)))
          next = &b;
      if (!next) break;  // cannot happen for a cyclic blocked operation; be safe
      path.emplace_back(v, next);
      v = next->target;
    }
    std::vector<std::pair<int, const Blocker*>> cycle(path.begin() + (seen.count(v) ? seen[v] : 0), path.end());
    for (size_t i = 0; i < g_.blocked_ops().size(); ++i)
      if (g_.Component(i) == g_.Component(bi)) (*done)[i] = true;
    // Start at the blocked operation with the most waiting ranks: it is the one users see timing out.
    size_t start = 0;
    for (size_t i = 0; i < cycle.size(); ++i)
      if (g_.blocked_ops()[cycle[i].first].waiting.size() > g_.blocked_ops()[cycle[start].first].waiting.size()) start = i;
    std::rotate(cycle.begin(), cycle.begin() + start, cycle.end());

    std::set<int> comms_in_cycle;
    for (const auto& step : cycle) comms_in_cycle.insert(g_.blocked_ops()[step.first].comm);
    // Within one communicator, Send/Recv only, every wait on a call the other rank issued but
    // queued behind its own wait (its GPU has not reached it): the calls are out of order
    // (both receive first, in separate groups). A call never issued is p2p_unmatched.
    bool issued_behind = !cycle.empty();
    for (const auto& step : cycle)
      issued_behind = issued_behind && g_.blocked_ops()[step.first].p2p && step.second->kind == BlockKind::kGpuLag;
    Cause cause = comms_in_cycle.size() > 1 ? Cause::CrossCommDeadlock
                  : issued_behind           ? Cause::P2pOutOfOrder
                                            : Cause::P2pUnmatched;
    // A rank that never posted its side of a transfer and went on to a collective, which the
    // other side's GPU reaches only after the transfer: the cycle closes through that collective,
    // but the story is the missing call (a missing Recv), blamed on the rank that never made it.
    const bool through_collective = std::any_of(cycle.begin(), cycle.end(), [&](const auto& step) {
      return !g_.blocked_ops()[step.first].p2p;
    });
    if (cause == Cause::P2pUnmatched && through_collective)
      for (const auto& [step_op, b] : cycle) {
        if (g_.blocked_ops()[step_op].p2p && b->kind == BlockKind::kHostMissing) {
          Draft d = TerminalDraft(step_op, Cause::P2pUnmatched, {b});
          for (size_t i = 0; i < cycle.size(); ++i)
            if (cycle[i].first != step_op) d.roots.push_back(cycle[i].first);
          return d;
        }
      }
    Draft d;
    d.v = BaseVerdict(cycle.empty() ? bi : cycle[0].first, cause);
    d.roots.push_back(cycle.empty() ? bi : cycle[0].first);
    for (size_t i = 1; i < cycle.size(); ++i) d.roots.push_back(cycle[i].first);  // not consequences
    if (cycle.empty()) return d;
    // Everyone inside an operation of the cycle waits on the deadlock.
    for (const auto& step : cycle) {
      const BlockedOp& cu = g_.blocked_ops()[step.first];
      std::vector<int> w = Globals(cu, cu.waiting);
      d.v.waiting_ranks.insert(d.v.waiting_ranks.end(), w.begin(), w.end());
      d.v.waited_s = std::max(d.v.waited_s, cu.waited_s);
    }
    std::sort(d.v.waiting_ranks.begin(), d.v.waiting_ranks.end());
    d.v.waiting_ranks.erase(std::unique(d.v.waiting_ranks.begin(), d.v.waiting_ranks.end()), d.v.waiting_ranks.end());
    // Rank b_{i-1} waits inside blocked operation i for rank b_i.
    const Blocker* prev = cycle.back().second;
    d.v.cycle.push_back(prev->global);
    for (const auto& [step_op, b] : cycle) {
      d.v.cycle.push_back(b->global);
      d.v.cycle_steps.push_back(StepOf(step_op, prev->global, b->global));
      AddCulprit(&d, b->global, b->comm_rank, b->dump);
      prev = b;
    }
    d.merge_key = "cycle:" + std::to_string(bi);
    return d;
  }

  // One side of a transfer as its rank called it, with the group it was issued in.
  P2pCall CallOf(const BlockedOp& blocked, const P2pSide& side) {
    const CommIndex& c = g_.comms()[blocked.comm];
    const bool send = &side == &blocked.send;
    P2pCall call;
    call.comm_rank = side.comm_rank;
    call.rank = side.comm_rank >= 0 ? c.global[side.comm_rank] : -1;
    call.op = send ? "Send" : "Recv";
    const int peer = send ? blocked.dst : blocked.src;
    call.peer = c.global[peer];
    call.p2p_seq = blocked.seq;
    if (side.op) {
      call.count = side.op->count;
      call.dtype = side.op->dtype;
      call.bytes = side.op->bytes;
      call.state = side.op->state.known ? trace::OpStateName(side.op->state.value) : "unknown";
    }
    if (side.op && NotStarted(*side.op) && g_.GroupStarted(side.dump, *side.op))
      call.state = trace::OpStateName(trace::OpState::GpuReached);
    if (side.done) call.state = trace::OpStateName(trace::OpState::Completed);
    if (side.op && side.dump >= 0) call.group = GroupOf(side.dump, *side.op);
    return call;
  }

  // The group an operation was issued in, from its rank's in-flight operations and ring.
  P2pGroup GroupOf(int dump, const trace::Op& op) {
    P2pGroup g;
    g.id = op.group;
    std::vector<const trace::Op*> ops;
    auto same = [](const trace::Op& a, const trace::Op& b) {
      return a.comm == b.comm && a.seq == b.seq && a.p2p_seq == b.p2p_seq && a.peer == b.peer && a.op == b.op &&
             a.op_known == b.op_known;
    };
    auto add = [&](const trace::Op& o) {
      if (op.group <= 0 ? !same(o, op) : o.group != op.group) return;
      for (const trace::Op* x : ops)
        if (same(*x, o)) return;
      ops.push_back(&o);
    };
    for (const trace::Op& o : g_.dumps()[dump].summary.in_flight) add(o);
    if (const trace::Detail* det = set_.Detail(dump))
      for (auto it = det->ring.entries.rbegin(); it != det->ring.entries.rend(); ++it) add(*it);  // group ids are the process's
    if (ops.empty()) add(op);
    std::set<int> peers, send_to, recv_from;
    size_t collectives = 0;
    bool one_seq = true;
    for (const trace::Op* o : ops) {
      P2pGroupMember m;
      m.op = o->OpName();
      m.comm = o->comm;
      const int ci = g_.CommOf(o->comm);
      m.peer = o->IsP2p() && ci >= 0 && o->peer >= 0 && o->peer < g_.comms()[ci].size ? g_.comms()[ci].global[o->peer] : -1;
      m.seq = o->IsP2p() ? o->p2p_seq : o->seq;
      m.count = o->count;
      m.dtype = o->dtype;
      m.bytes = o->bytes;
      m.state = o->state.known ? trace::OpStateName(o->state.value) : "unknown";
      if (NotStarted(*o) && g_.GroupStarted(dump, *o)) m.state = trace::OpStateName(trace::OpState::GpuReached);
      if (o->IsP2p()) {
        peers.insert(o->peer);
        (o->op == trace::OpKind::Send ? send_to : recv_from).insert(o->peer);
        if (g.p2p_seq < 0) g.p2p_seq = o->p2p_seq;
        one_seq = one_seq && g.p2p_seq == o->p2p_seq;
      } else {
        ++collectives;
      }
      g.ops.push_back(std::move(m));
    }
    if (!one_seq) g.p2p_seq = -1;
    g.peers = static_cast<int>(peers.size());
    const int ci = g_.CommOf(op.comm);
    const int size = ci >= 0 ? g_.comms()[ci].size : 0;
    g.shape = collectives > 0                                                         ? "mixed"
              : size > 2 && static_cast<int>(send_to.size()) == size - 1 && send_to == recv_from ? "alltoall_like"
              : send_to.size() == 1 && recv_from.size() == 1 && send_to != recv_from            ? "ring_exchange"
                                                                                                : "send_recv";
    return g;
  }

  Draft P2pMismatchDraft(int bi) {
    const BlockedOp& blocked = g_.blocked_ops()[bi];
    Draft d;
    d.v = BaseVerdict(bi, Cause::P2pMismatch);
    d.roots.push_back(bi);
    d.v.p2p_mismatch = blocked.match == P2pMatch::kTypeMismatch ? "datatype" : "size";
    const CommIndex& c = g_.comms()[blocked.comm];
    for (const P2pSide* side : {&blocked.send, &blocked.recv}) {
      AddCulprit(&d, c.global[side->comm_rank], side->comm_rank, side->dump);
      d.v.p2p_calls.push_back(CallOf(blocked, *side));
    }
    if (blocked.send.op) {
      d.v.op = "Send";
      d.v.bytes = blocked.send.op->bytes;
    }
    d.merge_key = "p2p_mismatch:" + std::to_string(bi);
    return d;
  }

  CycleStep StepOf(int bi, int from, int to) const {
    const BlockedOp& blocked = g_.blocked_ops()[bi];
    const CommIndex& c = g_.comms()[blocked.comm];
    CycleStep step;
    step.from = from;
    step.to = to;
    step.op = OpRef{blocked.op ? blocked.op->OpName() : "?", blocked.seq, c.id, c.name};
    step.p2p = blocked.p2p;
    if (blocked.p2p) {
      step.p2p_src = c.global[blocked.src];
      step.p2p_dst = c.global[blocked.dst];
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
      // Keep as primary the blocked operation with the most waiting ranks.
      if (!d.roots.empty() && (m.roots.empty() || g_.blocked_ops()[d.roots[0]].waiting.size() > g_.blocked_ops()[m.roots[0]].waiting.size())) {
        std::vector<int> roots = std::move(m.roots);
        d.roots.insert(d.roots.end(), roots.begin(), roots.end());
        m.v = std::move(d.v);
        m.roots = std::move(d.roots);
        m.culprits = std::move(d.culprits);
      } else {
        m.roots.insert(m.roots.end(), d.roots.begin(), d.roots.end());
      }
    }
    return out;
  }

  Consequence ConsequenceOf(int bi) const {
    const BlockedOp& blocked = g_.blocked_ops()[bi];
    const CommIndex& c = g_.comms()[blocked.comm];
    Consequence q;
    q.comm = c.id;
    q.comm_name = c.name;
    q.comm_size = c.size;
    q.seq = blocked.seq;
    q.op = blocked.op ? blocked.op->OpName() : "";
    q.waiting_ranks = Globals(blocked, blocked.waiting);
    q.p2p = blocked.p2p;
    if (blocked.p2p) {
      q.p2p_src = c.global[blocked.src];
      q.p2p_dst = c.global[blocked.dst];
    }
    return q;
  }

  // Blocked operations that wait, directly or through others, on this verdict's roots.
  void AddConsequences(Draft* d) {
    if (d->roots.empty()) return;
    if (reverse_.empty() && !g_.blocked_ops().empty()) {
      reverse_.resize(g_.blocked_ops().size());
      for (size_t v = 0; v < g_.blocked_ops().size(); ++v)
        for (const auto& b : g_.blocked_ops()[v].blockers)
          if (b.target >= 0) reverse_[b.target].push_back(static_cast<int>(v));
    }
    std::vector<bool> seen(g_.blocked_ops().size(), false);
    std::vector<int> queue(d->roots.begin(), d->roots.end());
    for (int bi : queue) seen[bi] = true;
    for (size_t i = 0; i < queue.size(); ++i)
      for (int w : reverse_[queue[i]])
        if (!seen[w]) {
          seen[w] = true;
          queue.push_back(w);
        }
    // Blocked operations of the root itself (a deadlock's cycle) are not consequences; other merged roots are.
    bool cycle = d->v.cause == Cause::CrossCommDeadlock || !d->v.cycle.empty();
    for (size_t i = 1; i < queue.size(); ++i)
      if (!(cycle && i < d->roots.size())) d->v.consequences.push_back(ConsequenceOf(queue[i]));
  }

  size_t Impact(const Draft& d) const {
    std::set<int> ranks(d.v.waiting_ranks.begin(), d.v.waiting_ranks.end());
    if (d.v.cause == Cause::JobKilled) ranks.insert(d.v.killed_ranks.begin(), d.v.killed_ranks.end());
    for (const auto& q : d.v.consequences) ranks.insert(q.waiting_ranks.begin(), q.waiting_ranks.end());
    return ranks.size();
  }

  // ------------------------------------------------------------------------------------------
  // Evidence: stacks of the culprits, read from their full dumps.

  void AddEvidence(Draft* d) {
    const BlockedOp* blocked = d->roots.empty() ? nullptr : &g_.blocked_ops()[d->roots[0]];
    size_t n = std::min(d->culprits.size(), options_.max_evidence);
    for (size_t i = 0; i < n; ++i) {
      int dump = d->culprits[i].dump;
      CulpritEvidence e;
      e.rank = d->culprits[i].global;
      e.comm_rank = d->culprits[i].comm_rank;
      if (blocked && e.rank >= 0) {
        const CommIndex& c = g_.comms()[blocked->comm];
        for (int r = 0; r < c.size; ++r)
          if (c.global[r] == e.rank) e.comm_rank = r;
      }
      evidence_.Fill(blocked, dump, &e);
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
