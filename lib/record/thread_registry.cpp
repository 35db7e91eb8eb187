#include "record/thread_registry.h"

namespace ncclwatch {

ThreadSlot* ThreadRegistry::Claim(int32_t tid) {
  for (auto& s : slots_) {
    int32_t expected = 0;
    if (s.tid.compare_exchange_strong(expected, tid, std::memory_order_acq_rel)) return &s;
  }
  return nullptr;
}

void ThreadRegistry::Release(ThreadSlot* slot) {
  if (!slot) return;
  slot->function.store(nullptr, std::memory_order_release);
  slot->tid.store(0, std::memory_order_release);
}

std::vector<ThreadRegistry::InCall> ThreadRegistry::InsideNccl() const {
  std::vector<InCall> out;
  for (auto& s : slots_) {
    int32_t tid = s.tid.load(std::memory_order_acquire);
    const char* fn = s.function.load(std::memory_order_acquire);
    if (tid != 0 && fn) out.push_back({tid, fn, s.since_ns.load(std::memory_order_relaxed),
                                        s.op_index1.load(std::memory_order_relaxed),
                                        s.creating.load(std::memory_order_relaxed)});
  }
  return out;
}

}  // namespace ncclwatch
