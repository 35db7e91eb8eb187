#include "record/comm_registry.h"

#include <algorithm>
#include <cstdio>

namespace ncclwatch {

CommRegistry::CommRegistry() : slots_(new Slot[kCapacity]) {}

size_t CommRegistry::Hash(const void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  v ^= v >> 17;
  v *= 0x9e3779b97f4a7c15ull;
  return static_cast<size_t>(v >> 20);
}

CommInfo* CommRegistry::Register(std::unique_ptr<CommInfo> info) {
  std::lock_guard<std::mutex> lock(mu_);
  if (info->size > 0 && info->size <= kMaxPeerTracking) info->peers.reset(new PeerCounters[info->size]);
  CommInfo* raw = info.get();
  all_.push_back(std::move(info));
  const void* h = raw->handle;
  // Reuse the handle's slot if NCCL handed the same pointer out again, else the first free one.
  size_t first_free = kCapacity;
  for (size_t i = 0, s = Hash(h); i < kCapacity; ++i) {
    Slot& slot = slots_[(s + i) % kCapacity];
    const void* cur = slot.handle.load(std::memory_order_relaxed);
    if (cur == h) {
      slot.info.store(raw, std::memory_order_release);
      return raw;
    }
    if (cur == nullptr) {
      if (first_free == kCapacity) first_free = (s + i) % kCapacity;
      break;  // handles are never removed, so the probe chain ends here
    }
  }
  if (first_free == kCapacity) return raw;  // table full: not found by Lookup, still dumped
  slots_[first_free].info.store(raw, std::memory_order_release);
  slots_[first_free].handle.store(h, std::memory_order_release);
  return raw;
}

CommInfo* CommRegistry::Lookup(const void* handle) const {
  if (!handle) return nullptr;
  for (size_t i = 0, s = Hash(handle); i < kCapacity; ++i) {
    const Slot& slot = slots_[(s + i) % kCapacity];
    const void* cur = slot.handle.load(std::memory_order_acquire);
    if (cur == handle) return slot.info.load(std::memory_order_acquire);
    if (cur == nullptr) return nullptr;
  }
  return nullptr;
}

std::vector<CommInfo*> CommRegistry::All() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CommInfo*> out;
  out.reserve(all_.size());
  for (auto& c : all_) out.push_back(c.get());
  return out;
}

size_t CommRegistry::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return all_.size();
}

uint64_t Fnv1a64(const void* data, size_t len, uint64_t seed) {
  uint64_t h = seed;
  auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < len; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t CommIdFromUniqueIds(const void* ids, size_t nbytes) { return Fnv1a64(ids, nbytes); }

namespace {
uint64_t MixChild(uint64_t parent_id, const char* tag, uint32_t child_index) {
  uint64_t h = Fnv1a64(&parent_id, sizeof parent_id);
  h = Fnv1a64(tag, 6, h);
  return Fnv1a64(&child_index, sizeof child_index, h);
}
}  // namespace

uint64_t CommIdForSplit(uint64_t parent_id, uint32_t child_index, int color) {
  return Fnv1a64(&color, sizeof color, MixChild(parent_id, "split:", child_index));
}

uint64_t CommIdForShrink(uint64_t parent_id, uint32_t child_index, const int* excluded, int nexcluded) {
  uint64_t h = MixChild(parent_id, "shrnk:", child_index);
  if (excluded && nexcluded > 0) {
    std::vector<int> sorted(excluded, excluded + nexcluded);
    std::sort(sorted.begin(), sorted.end());
    h = Fnv1a64(sorted.data(), sorted.size() * sizeof(int), h);
  }
  return h;
}

std::string CommIdHex(uint64_t id) {
  char buf[17];
  snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(id));
  return buf;
}

}  // namespace ncclwatch
