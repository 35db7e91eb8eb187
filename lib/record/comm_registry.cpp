#include "record/comm_registry.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <unordered_set>

namespace ncclwatch {

CommRegistry::CommRegistry() : slots_(new Slot[kCapacity]) {}

size_t CommRegistry::Hash(const void* p) {
  auto v = reinterpret_cast<uintptr_t>(p);
  v ^= v >> 17;
  v *= 0x9e3779b97f4a7c15ull;
  return static_cast<size_t>(v >> 20);
}

void CommRegistry::UseStorage(CommRecord* records, size_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  records_ = records;
  records_capacity_ = capacity;
  records_used_ = 0;
}

namespace {

// The fields a CommRecord keeps of a CommInfo, copied either way.
#define NCCLWATCH_COMM_RECORD_FIELDS(X) \
  X(size) X(rank) X(device) X(color) X(key) X(blocking) X(id) X(parent_id) X(created_ns)

void CopyLive(const CommLive& from, CommLive* to) {
  to->state.store(from.state.load());
  to->ended_ns.store(from.ended_ns.load());
  to->last_enqueued.store(from.last_enqueued.load());
  to->last_gpu_reached.store(from.last_gpu_reached.load());
  to->last_completed.store(from.last_completed.load());
}

void FillRecord(const CommInfo& c, CommRecord* r) {
#define NCCLWATCH_COPY(field) r->field = c.field;
  NCCLWATCH_COMM_RECORD_FIELDS(NCCLWATCH_COPY)
#undef NCCLWATCH_COPY
  r->kind = static_cast<uint8_t>(c.kind);
  strncpy(r->name, c.name.c_str(), sizeof r->name - 1);
  CopyLive(c.live(), &r->live);
  r->published.store(1, std::memory_order_release);
}

}  // namespace

std::unique_ptr<CommInfo> CommInfoOf(const CommRecord& r) {
  auto c = std::make_unique<CommInfo>();
#define NCCLWATCH_COPY(field) c->field = r.field;
  NCCLWATCH_COMM_RECORD_FIELDS(NCCLWATCH_COPY)
#undef NCCLWATCH_COPY
  c->kind = static_cast<CommKind>(r.kind);
  c->name.assign(r.name, strnlen(r.name, sizeof r.name));
  CopyLive(r.live, &c->live());
  return c;
}

CommInfo* CommRegistry::Register(std::unique_ptr<CommInfo> info) {
  std::lock_guard<std::mutex> lock(mu_);
  if (info->size > 0 && info->size <= kMaxPeerTracking) info->peers.reset(new PeerCounters[info->size]);
  int record = -1;
  if (!free_records_.empty()) {
    record = free_records_.back();
    free_records_.pop_back();
  } else if (records_ && records_used_ < records_capacity_) {
    record = static_cast<int>(records_used_++);
  }
  if (record >= 0) {
    CommRecord* r = &records_[record];
    FillRecord(*info, r);
    info->MoveLiveTo(&r->live, record);
  }
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

size_t CommRegistry::EndedCount() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (auto& c : all_) n += c->Ended() ? 1 : 0;
  return n;
}

size_t CommRegistry::ForgetEnded(size_t keep, uint64_t ended_before_ns, const std::vector<const CommInfo*>& in_use) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<CommInfo*> ended;
  for (auto& c : all_)
    if (c->Ended()) ended.push_back(c.get());
  if (ended.size() <= keep) return 0;
  std::sort(ended.begin(), ended.end(), [](const CommInfo* a, const CommInfo* b) {
    return a->live().ended_ns.load() < b->live().ended_ns.load();
  });
  ended.resize(ended.size() - keep);  // the oldest; the newest `keep` stay
  std::unordered_set<const CommInfo*> gone;
  for (CommInfo* c : ended) {
    const uint64_t at = c->live().ended_ns.load();
    if (at == 0 || at >= ended_before_ns || std::find(in_use.begin(), in_use.end(), c) != in_use.end()) continue;
    // Lookup no longer finds it (the handle stays in its probe chain: NCCL may hand it out
    // again, and Register then points it at the new communicator).
    for (size_t i = 0, s = Hash(c->handle); i < kCapacity; ++i) {
      Slot& slot = slots_[(s + i) % kCapacity];
      const void* h = slot.handle.load(std::memory_order_relaxed);
      if (h == nullptr) break;
      if (h == c->handle && slot.info.load(std::memory_order_relaxed) == c) slot.info.store(nullptr, std::memory_order_release);
    }
    if (c->record_index >= 0) {
      records_[c->record_index].published.store(0, std::memory_order_release);
      free_records_.push_back(c->record_index);
    }
    gone.insert(c);
  }
  all_.erase(std::remove_if(all_.begin(), all_.end(),
                            [&](const std::unique_ptr<CommInfo>& c) {
                              return gone.count(c.get()) != 0;
                            }),
             all_.end());
  return gone.size();
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
