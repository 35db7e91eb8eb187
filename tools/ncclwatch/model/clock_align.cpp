#include "model/clock_align.h"

#include <algorithm>
#include <functional>
#include <set>
#include <unordered_map>

namespace ncclwatch {
namespace analysis {

namespace {

int64_t Percentile(std::vector<int64_t> v, double p) {
  if (v.empty()) return 0;
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  std::nth_element(v.begin(), v.begin() + static_cast<long>(i), v.end());
  return v[i];
}

// (comm, seq) -> this host's completion time of it (the earliest among its ranks).
using Completions = std::unordered_map<uint64_t, std::unordered_map<int64_t, int64_t>>;

}  // namespace

std::vector<RankTimes> CollectRankTimes(DumpSet& set) {
  std::vector<RankTimes> out;
  for (size_t i = 0; i < set.dumps().size(); ++i) {
    const Dump& d = set.dumps()[i];
    RankTimes r;
    r.dump_index = i;
    r.rank = d.summary.rank;
    r.host = d.summary.host;
    r.unix_minus_mono_ns = d.summary.time_unix_ns - d.summary.time_mono_ns;
    if (const trace::Detail* detail = set.JoinedDetail(i)) {
      r.collectives.reserve(detail->ring.entries.size());
      for (const auto& op : detail->ring.entries) {
        if (op.enqueue_ns > 0 && (r.earliest_ns == 0 || op.enqueue_ns < r.earliest_ns)) r.earliest_ns = op.enqueue_ns;
        if (op.seq > 0 && !op.IsP2p())
          r.collectives.push_back({std::hash<std::string>()(op.comm), op.seq, op.enqueue_ns, op.completed_ns,
                                   static_cast<int32_t>(op.callsite)});
      }
    }
    set.DropDetail(i);  // one full dump in memory at a time
    out.push_back(std::move(r));
  }
  return out;
}

ClockAlignment AlignClocks(const std::vector<RankTimes>& ranks) {
  ClockAlignment a;
  std::map<std::string, Completions> by_host;
  std::map<std::string, std::vector<int64_t>> wall;  // unix - mono per rank of the host
  int lowest = -1;
  for (const auto& r : ranks) {
    if (r.rank >= 0 && (lowest < 0 || r.rank < lowest)) {
      lowest = r.rank;
      a.reference_host = r.host;
    }
    wall[r.host].push_back(r.unix_minus_mono_ns);
    Completions& c = by_host[r.host];
    for (const auto& op : r.collectives) {
      if (op.completed_ns <= 0) continue;
      auto [it, fresh] = c[op.comm_key].emplace(op.seq, op.completed_ns);
      if (!fresh) it->second = std::min(it->second, op.completed_ns);
    }
  }
  if (a.reference_host.empty() && !ranks.empty()) a.reference_host = ranks.front().host;
  if (by_host.empty()) return a;
  a.hosts[a.reference_host] = HostClock{0, 0, 0, "reference", ""};
  // Grow the aligned set one host at a time, each from the aligned host it shares most with
  // (Prim's maximum spanning tree: the number of shared operations does not depend on the
  // offsets, so each pair is counted once, when the second of the two is aligned; ties go to the
  // first host, then the first aligned host, by name).
  auto shared = [&](const Completions& mine, const Completions& theirs, int64_t offset_ns,
                    std::vector<int64_t>* diffs) {
    size_t n = 0;
    for (const auto& [comm, seqs] : mine) {
      auto t = theirs.find(comm);
      if (t == theirs.end()) continue;
      for (const auto& [seq, ns] : seqs) {
        auto s = t->second.find(seq);
        if (s == t->second.end()) continue;
        ++n;
        if (diffs) diffs->push_back(s->second + offset_ns - ns);
      }
    }
    return n;
  };
  struct Candidate {
    size_t count = 0;
    std::string via;  // the aligned host it shares `count` operations with
  };
  std::map<std::string, Candidate> unaligned;
  for (const auto& entry : by_host)
    if (!a.hosts.count(entry.first)) unaligned[entry.first];
  std::string newest = a.reference_host;
  while (!unaligned.empty()) {
    const Completions& theirs = by_host[newest];
    for (auto& [host, c] : unaligned) {
      size_t n = shared(by_host[host], theirs, 0, nullptr);
      if (n > c.count || (n == c.count && n > 0 && newest < c.via)) c = Candidate{n, newest};
    }
    auto best = unaligned.begin();
    for (auto it = unaligned.begin(); it != unaligned.end(); ++it)
      if (it->second.count > best->second.count) best = it;
    if (best->second.count < kMinClockSamples) break;
    std::vector<int64_t> diffs;
    shared(by_host[best->first], by_host[best->second.via], a.hosts[best->second.via].offset_ns, &diffs);
    a.hosts[best->first] = HostClock{Percentile(diffs, 0.5), Percentile(diffs, 0.9) - Percentile(diffs, 0.1),
                                     diffs.size(), "collectives", best->second.via};
    newest = best->first;
    unaligned.erase(best);
  }
  // The rest: the wall clocks (NTP-synchronized at best; milliseconds off at worst).
  const int64_t ref_wall = Percentile(wall[a.reference_host], 0.5);
  for (const auto& [host, w] : wall)
    if (!a.hosts.count(host)) a.hosts[host] = HostClock{Percentile(w, 0.5) - ref_wall, 0, 0, "wall_clock", a.reference_host};
  return a;
}

}  // namespace analysis
}  // namespace ncclwatch
