#include "model/rank_split.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <utility>

namespace ncclwatch {
namespace analysis {

bool RankShare::Holds(const std::string& comm, int64_t comm_rank) const {
  for (const auto& [id, rank] : comms)
    if (id == comm && (comm_rank < 0 || rank == comm_rank)) return true;
  return false;
}

bool RankShare::Owns(const trace::Op& op) const {
  // An operation of no known communicator: the process's first rank keeps it.
  if (op.comm.empty()) return !process_ranks.empty() && global_rank == process_ranks.front();
  return Holds(op.comm, op.comm_rank);
}

namespace {

template <typename T, typename Keep>
void KeepOnly(std::vector<T>* v, Keep keep) {
  v->erase(std::remove_if(v->begin(), v->end(), [&](const T& x) { return !keep(x); }), v->end());
}

void CutSummary(const RankShare& share, trace::Summary* s) {
  KeepOnly(&s->comms, [&](const trace::CommSummary& c) { return share.Holds(c.id, c.rank); });
  KeepOnly(&s->in_flight, [&](const trace::Op& op) { return share.Owns(op); });
  if (s->stalled && !share.Owns(*s->stalled)) s->stalled.reset();
  if (s->failed && !share.Owns(*s->failed)) s->failed.reset();
}

}  // namespace

std::shared_ptr<const trace::Detail> ShareOf(const RankShare& share, std::shared_ptr<const trace::Detail> detail) {
  if (!detail) return detail;
  auto cut = std::make_shared<trace::Detail>(*detail);
  KeepOnly(&cut->communicators, [&](const trace::Communicator& c) { return share.Holds(c.id, c.rank); });
  KeepOnly(&cut->ring.entries, [&](const trace::Op& op) { return share.Owns(op); });
  KeepOnly(&cut->recoveries, [&](const trace::Recovery& r) { return share.Holds(r.comm, -1); });
  return cut;
}

std::vector<Dump> SplitByRank(Dump d) {
  const trace::Summary& s = d.summary;
  // Several ranks: one communicator id held as two ranks, each communicator's device written.
  // (Asked of every dump read: the ids are sorted in place of a map, and the dump is moved,
  // never copied, when it is one rank's.)
  std::vector<std::pair<std::string_view, int>> held;
  held.reserve(s.comms.size());
  for (const auto& c : s.comms)
    if (c.rank >= 0) held.emplace_back(c.id, c.rank);
  std::sort(held.begin(), held.end());
  bool several = false;
  for (size_t i = 1; i < held.size() && !several; ++i)
    several = held[i].first == held[i - 1].first && held[i].second != held[i - 1].second;
  if (!several) {
    std::vector<Dump> one;
    one.push_back(std::move(d));
    return one;
  }
  std::map<int64_t, std::vector<const trace::CommSummary*>> by_device;
  std::vector<const trace::CommSummary*> no_device;
  int world = 0;
  for (const auto& c : s.comms) {
    if (c.device >= 0) by_device[c.device].push_back(&c);
    else no_device.push_back(&c);
    world = std::max(world, c.size);
  }
  if (by_device.size() < 2) return {std::move(d)};  // written before devices were: one dump as it is

  std::vector<std::shared_ptr<RankShare>> shares;
  for (const auto& [device, comms] : by_device) {
    auto share = std::make_shared<RankShare>();
    share->device = device;
    share->process_rank = s.rank;
    const trace::CommSummary* largest = nullptr;
    for (const auto* c : comms) {
      share->comms.emplace_back(c->id, c->rank);
      if (c->rank >= 0 && (!largest || c->size > largest->size)) largest = c;
    }
    share->global_rank = largest ? largest->rank : -1;
    if (share->global_rank >= 0) shares.push_back(std::move(share));
  }
  // Communicators still being created have no device yet: a world-size one is the rank of that
  // number, any other belongs to every rank of the process (which one is not written).
  for (const auto* c : no_device)
    for (auto& share : shares)
      if (c->size != world || c->rank == share->global_rank) share->comms.emplace_back(c->id, c->rank);
  std::vector<int> ranks;
  for (const auto& share : shares) ranks.push_back(share->global_rank);
  std::sort(ranks.begin(), ranks.end());
  if (ranks.size() < 2 || std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end()) return {std::move(d)};
  std::vector<Dump> out;
  for (auto& share : shares) {
    share->process_ranks = ranks;
    Dump r = d;
    r.summary.rank = share->global_rank;
    r.summary.local_rank = static_cast<int>(share->device);
    r.summary.world_size = std::max(world, s.world_size);
    CutSummary(*share, &r.summary);
    r.detail = ShareOf(*share, d.detail);
    r.share = std::move(share);
    out.push_back(std::move(r));
  }
  std::sort(out.begin(), out.end(), [](const Dump& a, const Dump& b) { return a.summary.rank < b.summary.rank; });
  return out;
}

}  // namespace analysis
}  // namespace ncclwatch
