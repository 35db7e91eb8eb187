#include "slow_ranks.h"

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
  // comm -> members (index in times) -> seq -> (aligned enqueue, callsite)
  struct At {
    int64_t ns;
    int32_t callsite;
  };
  std::unordered_map<uint64_t, std::map<size_t, std::unordered_map<int64_t, At>>> comms;
  for (size_t i = 0; i < times.size(); ++i)
    for (const auto& c : times[i].collectives)
      if (c.enqueue_ns > 0) comms[c.comm_key][i][c.seq] = {clocks.Align(times[i].host, c.enqueue_ns), c.callsite};

  std::map<int, Candidate> best;  // per rank: the communicator where it is most clearly slow
  for (const auto& [comm, members] : comms) {
    if (members.size() < 2) continue;
    // The collectives every member's ring holds.
    const auto& first = members.begin()->second;
    std::vector<int64_t> seqs;
    for (const auto& [seq, at] : first) {
      bool everywhere = true;
      for (const auto& [m, by_seq] : members) everywhere = everywhere && by_seq.count(seq);
      if (everywhere) seqs.push_back(seq);
    }
    if (seqs.size() < kSlowRankMinCollectives) continue;
    std::map<size_t, std::vector<double>> lateness_ms;
    std::map<size_t, size_t> last_count;
    std::map<size_t, std::map<int32_t, size_t>> late_sites;
    for (int64_t seq : seqs) {
      size_t last = members.begin()->first;
      int64_t last_ns = INT64_MIN;
      for (const auto& [m, by_seq] : members) {
        int64_t ns = by_seq.at(seq).ns;
        if (ns > last_ns) last_ns = ns, last = m;
      }
      ++last_count[last];
      for (const auto& [m, by_seq] : members) {
        std::vector<double> others;
        for (const auto& [o, o_seq] : members)
          if (o != m) others.push_back(static_cast<double>(o_seq.at(seq).ns));
        double late = (static_cast<double>(by_seq.at(seq).ns) - Quantile(others, 0.5)) / 1e6;
        lateness_ms[m].push_back(late);
        if (m == last) ++late_sites[m][by_seq.at(seq).callsite];
      }
    }
    for (const auto& [m, late] : lateness_ms) {
      const RankTimes& r = times[m];
      double spread_ms = 0;  // the clocks' uncertainty between this rank's host and the others'
      for (const auto& [o, unused] : members)
        if (times[o].host != r.host) {
          auto a = clocks.hosts.find(r.host), b = clocks.hosts.find(times[o].host);
          double s = ((a != clocks.hosts.end() ? a->second.spread_ns : 0) + (b != clocks.hosts.end() ? b->second.spread_ns : 0)) / 1e6;
          if ((a != clocks.hosts.end() && a->second.method == "wall_clock") ||
              (b != clocks.hosts.end() && b->second.method == "wall_clock"))
            s = std::max(s, 50.0);  // wall clocks: tens of ms apart at best
          spread_ms = std::max(spread_ms, s);
        }
      double share = static_cast<double>(last_count[m]) / static_cast<double>(seqs.size());
      double median = Quantile(late, 0.5);
      if (share < kSlowRankMinLastShare || median < std::max(kSlowRankMinLatenessMs, 2 * spread_ms)) continue;
      Candidate c;
      c.times_index = m;
      c.f.rank = r.rank;
      c.f.host = r.host;
      c.f.pid = set.dumps()[r.dump_index].summary.pid;
      for (const auto& cs : set.dumps()[r.dump_index].summary.comms)
        if (std::hash<std::string>()(cs.id) == comm) c.f.comm = cs.id, c.f.comm_name = cs.name;
      c.f.collectives = seqs.size();
      c.f.last_in = last_count[m];
      c.f.lateness_median_ms = median;
      c.f.lateness_p90_ms = Quantile(late, 0.9);
      c.f.clock_spread_ms = spread_ms;
      c.late_callsites = late_sites[m];
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
    if (const DumpDetail* d = set.Detail(index)) {
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
