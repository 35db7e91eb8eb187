#include "rules/slow_ranks.h"

#include <algorithm>
#include <map>
#include <unordered_map>

namespace ncclwatch {
namespace analysis {

namespace {

double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

struct Candidate {
  Finding f;
  std::map<int32_t, size_t> late_callsites;  // callsite id -> late collectives there
  size_t times_index = 0;
};

}  // namespace

std::vector<Finding> FindSlowRanks(DumpSet& set, const std::vector<RankTimes>& times, const ClockAlignment& clocks) {
  // comm -> member (index in times) -> (seq, aligned enqueue, callsite), sorted by seq.
  struct At {
    int64_t seq, ns;
    int32_t callsite;
    bool operator<(const At& o) const { return seq < o.seq; }
  };
  std::unordered_map<uint64_t, std::map<size_t, std::vector<At>>> comms;
  for (size_t i = 0; i < times.size(); ++i)
    for (const auto& c : times[i].collectives)
      if (c.enqueue_ns > 0) comms[c.comm_key][i].push_back({c.seq, clocks.Align(times[i].host, c.enqueue_ns), c.callsite});

  std::map<int, Candidate> best;  // per rank: the communicator where it is most clearly slow
  for (auto& [comm, members] : comms) {
    if (members.size() < 2) continue;
    const size_t n = members.size();
    std::vector<size_t> ids;
    std::vector<std::vector<At>*> rows;
    for (auto& [m, v] : members) {
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end(), [](const At& x, const At& y) { return x.seq == y.seq; }), v.end());
      ids.push_back(m);
      rows.push_back(&v);
    }
    // The collectives every member's ring holds.
    std::map<int64_t, size_t> holders;
    for (auto* v : rows)
      for (const At& a : *v) ++holders[a.seq];
    std::vector<int64_t> seqs;
    for (const auto& [seq, count] : holders)
      if (count == n) seqs.push_back(seq);
    if (seqs.size() < kSlowRankMinCollectives) continue;
    std::vector<std::vector<double>> lateness_ms(n);
    std::vector<size_t> last_count(n, 0);
    std::vector<std::map<int32_t, size_t>> late_sites(n);
    std::vector<std::pair<int64_t, size_t>> sorted(n);  // (aligned enqueue, member) of one seq
    std::vector<size_t> cursor(n, 0);
    for (int64_t seq : seqs) {
      for (size_t k = 0; k < n; ++k) {
        const std::vector<At>& v = *rows[k];
        while (v[cursor[k]].seq < seq) ++cursor[k];  // every member holds seq: the cursor stops on it
        sorted[k] = {v[cursor[k]].ns, k};
      }
      std::sort(sorted.begin(), sorted.end());
      const size_t last = sorted.back().second;
      ++last_count[last];
      ++late_sites[last][(*rows[last])[cursor[last]].callsite];
      // Each member against the median of the others: the others' sorted list is `sorted`
      // without it, so their median is one of two neighbours in `sorted`.
      const size_t mid = static_cast<size_t>(0.5 * static_cast<double>(n - 2) + 0.5);
      for (size_t pos = 0; pos < n; ++pos) {
        int64_t others_median = sorted[mid < pos ? mid : mid + 1].first;
        lateness_ms[sorted[pos].second].push_back(static_cast<double>(sorted[pos].first - others_median) / 1e6);
      }
    }
    for (size_t k = 0; k < n; ++k) {
      const std::vector<double>& late = lateness_ms[k];
      const RankTimes& r = times[ids[k]];
      double spread_ms = 0;  // the clocks' uncertainty between this rank's host and the others'
      for (size_t o : ids)
        if (times[o].host != r.host) {
          auto a = clocks.hosts.find(r.host), b = clocks.hosts.find(times[o].host);
          double s = ((a != clocks.hosts.end() ? a->second.spread_ns : 0) + (b != clocks.hosts.end() ? b->second.spread_ns : 0)) / 1e6;
          if ((a != clocks.hosts.end() && a->second.method == "wall_clock") ||
              (b != clocks.hosts.end() && b->second.method == "wall_clock"))
            s = std::max(s, 50.0);  // wall clocks: tens of ms apart at best
          spread_ms = std::max(spread_ms, s);
        }
      double share = static_cast<double>(last_count[k]) / static_cast<double>(seqs.size());
      if (share < kSlowRankMinLastShare) continue;
      double median = Quantile(late, 0.5);
      if (median < std::max(kSlowRankMinLatenessMs, 2 * spread_ms)) continue;
      Candidate c;
      c.times_index = ids[k];
      c.f.rank = r.rank;
      c.f.host = r.host;
      c.f.pid = set.dumps()[r.dump_index].summary.pid;
      for (const auto& cs : set.dumps()[r.dump_index].summary.comms)
        if (std::hash<std::string>()(cs.id) == comm) c.f.comm = cs.id, c.f.comm_name = cs.name;
      c.f.collectives = seqs.size();
      c.f.last_in = last_count[k];
      c.f.lateness_median_ms = median;
      c.f.lateness_p90_ms = Quantile(late, 0.9);
      c.f.clock_spread_ms = spread_ms;
      c.late_callsites = late_sites[k];
      auto it = best.find(r.rank);
      if (it == best.end() || it->second.f.lateness_median_ms < median) best[r.rank] = std::move(c);
    }
  }
  std::vector<Finding> out;
  for (auto& [rank, c] : best) {
    // The call site of most of its late arrivals, from its full dump.
    int32_t site = -1;
    size_t most = 0;
    for (const auto& [id, n] : c.late_callsites)
      if (id >= 0 && n > most) site = id, most = n;
    size_t index = times[c.times_index].dump_index;
    if (const trace::Detail* d = set.JoinedDetail(index)) {
      for (const auto& cs : d->callsites)
        if (cs.id == site) c.f.callsite = cs.stack;
      for (auto it = d->ring.entries.rbegin(); it != d->ring.entries.rend(); ++it)
        if (it->callsite == site) {
          c.f.callsite_op = it->OpName();
          break;
        }
    }
    set.DropDetail(index);
    out.push_back(std::move(c.f));
  }
  // The slowest first.
  std::sort(out.begin(), out.end(),
            [](const Finding& a, const Finding& b) { return a.lateness_median_ms > b.lateness_median_ms; });
  return out;
}

}  // namespace analysis
}  // namespace ncclwatch
