#include "watchdog/nonblocking.h"

namespace ncclwatch {

void PendingLaunches::Defer(const GroupedOp* ops, Marker* const* marker_of, int n) {
  std::vector<Launch> pending;
  for (int i = 0; i < n; ++i) {
    Marker* marker = marker_of[i];
    if (!marker) continue;
    auto it = pending.begin();
    while (it != pending.end() && it->marker != marker) ++it;
    if (it == pending.end())
      it = pending.insert(pending.end(), Launch{ops[i].comm, marker, reinterpret_cast<CUstream>(ops[i].op.stream), {}});
    it->items.push_back(InflightItem::Of(ops[i].op, ops[i].comm, marker));
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& p : pending) waiting_.push_back(std::move(p));
}

void PendingLaunches::Settle(const CommInfo* comm, ncclResult_t async_state) {
  if (async_state == ncclInProgress) return;
  std::vector<Launch> ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (it->comm == comm) {
        ready.push_back(std::move(*it));
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& p : ready) {
    bool ok = async_state == ncclSuccess && markers_->End(p.marker, p.stream);
    if (ok) p.marker->refs.store(static_cast<int>(p.items.size()), std::memory_order_relaxed);
    for (auto& item : p.items) {
      if (!ok) {
        ring_->SetState(item.index, async_state == ncclSuccess ? trace::OpState::Unmonitored : trace::OpState::Error);
        continue;
      }
      if (!watchdog_->Submit(item)) {
        markers_->Release(p.marker);
        ring_->SetState(item.index, trace::OpState::Unmonitored);
      }
    }
    if (!ok && async_state != ncclSuccess) markers_->Abandon(p.marker);
  }
}

}  // namespace ncclwatch
