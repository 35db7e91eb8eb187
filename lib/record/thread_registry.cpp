#include "record/thread_registry.h"

#include <cstring>

namespace ncclwatch {

ThreadRegistry::ThreadRegistry() : owned_(new ThreadSlot[kCapacity]), slots_(owned_.get()) {}

ThreadSlot* ThreadRegistry::Claim(int32_t tid) {
  for (size_t i = 0; i < kCapacity; ++i) {
    ThreadSlot& s = slots_[i];
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
  InsideNccl(&out);
  return out;
}

void ThreadRegistry::InsideNccl(std::vector<InCall>* out) const {
  out->clear();
  for (size_t i = 0; i < kCapacity; ++i) {
    ThreadSlot& s = slots_[i];
    int32_t tid = s.tid.load(std::memory_order_acquire);
    const char* fn = s.function.load(std::memory_order_acquire);
    if (tid != 0 && fn) out->push_back({tid, fn, s.since_ns.load(std::memory_order_relaxed),
                                         s.op_index1.load(std::memory_order_relaxed),
                                         s.creating.load(std::memory_order_relaxed)});
  }
}

}  // namespace ncclwatch

namespace ncclwatch {

std::vector<int> ThreadRegistry::Threads() const {
  std::vector<int> out;
  for (size_t i = 0; i < kCapacity; ++i)
    if (int32_t tid = slots_[i].tid.load(std::memory_order_acquire)) out.push_back(tid);
  return out;
}

void ThreadRegistry::NameCalls() {
  for (size_t i = 0; i < kCapacity; ++i) {
    ThreadSlot& s = slots_[i];
    const char* fn = s.function.load(std::memory_order_acquire);
    const auto value = reinterpret_cast<uintptr_t>(fn);
    if (!fn || s.named.load(std::memory_order_relaxed) == value) continue;
    s.named.store(0, std::memory_order_release);  // a reader never pairs the old text with the new call
    strncpy(s.function_name, fn, sizeof s.function_name - 1);
    s.function_name[sizeof s.function_name - 1] = '\0';
    s.named.store(value, std::memory_order_release);
  }
}

std::string ThreadRegistry::CallName(const ThreadSlot& slot) {
  const auto fn = reinterpret_cast<uintptr_t>(slot.function.load(std::memory_order_acquire));
  if (!fn || slot.tid.load(std::memory_order_acquire) == 0) return std::string();
  if (slot.named.load(std::memory_order_acquire) != fn) return "an NCCL call";
  return std::string(slot.function_name, strnlen(slot.function_name, sizeof slot.function_name));
}

}  // namespace ncclwatch
