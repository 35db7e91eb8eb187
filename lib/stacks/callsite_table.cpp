#include "callsite_table.h"

#include <cstring>

namespace ncclwatch {
namespace stacks {
namespace detail {
namespace {

constexpr uint64_t kTagMask = 0xffffffff00000000ull;

inline uint64_t Mix(uint64_t h, uint64_t word) {
  h ^= word;
  h *= 0x9e3779b97f4a7c15ull;
  return h ^ (h >> 29);
}

// Copies only the used frames (the rest of a key on the stack is uninitialized).
void CopyKey(CallsiteKey* dst, const CallsiteKey& src) {
  dst->native_depth = src.native_depth;
  dst->python_depth = src.python_depth;
  dst->python_driven = src.python_driven;
  std::memcpy(dst->ips, src.ips, src.native_depth * sizeof(src.ips[0]));
  std::memcpy(dst->py_code, src.py_code, src.python_depth * sizeof(src.py_code[0]));
  std::memcpy(dst->py_position, src.py_position, src.python_depth * sizeof(src.py_position[0]));
}

}  // namespace

uint64_t CallsiteKey::Hash() const {
  // Two independent lanes: the multiply chain is the cost, and they run in parallel.
  uint64_t even = 0x6a09e667f3bcc909ull ^ native_depth;
  uint64_t odd = 0xbb67ae8584caa73bull ^ python_depth ^ (uint64_t{python_driven} << 32);
  int i = 0;
  for (; i + 1 < native_depth; i += 2) {
    even = Mix(even, ips[i]);
    odd = Mix(odd, ips[i + 1]);
  }
  if (i < native_depth) even = Mix(even, ips[i]);
  for (int j = 0; j < python_depth; ++j) odd = Mix(Mix(odd, py_code[j]), static_cast<uint32_t>(py_position[j]));
  // Final avalanche so that both the low bits (probe start) and the high bits (tag) vary.
  uint64_t h = even ^ (odd * 0xc2b2ae3d27d4eb4full);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

bool CallsiteKey::operator==(const CallsiteKey& other) const {
  return native_depth == other.native_depth && python_depth == other.python_depth &&
         python_driven == other.python_driven &&
         std::memcmp(ips, other.ips, native_depth * sizeof(ips[0])) == 0 &&
         std::memcmp(py_code, other.py_code, python_depth * sizeof(py_code[0])) == 0 &&
         std::memcmp(py_position, other.py_position, python_depth * sizeof(py_position[0])) == 0;
}

CallsiteTable::InternResult CallsiteTable::Intern(const CallsiteKey& key) {
  const uint64_t hash = key.Hash();
  const uint64_t tag = hash & kTagMask;
  uint32_t id = kNoEntry;  // our entry, once the key is known to be new and written into one
  uint32_t index = static_cast<uint32_t>(hash) & cell_mask_;
  for (uint32_t probe = 0; probe <= cell_mask_; ++probe, index = (index + 1) & cell_mask_) {
    std::atomic<uint64_t>& cell = cells_[index];
    uint64_t value = cell.load(std::memory_order_acquire);
    for (;;) {
      if (value != 0) {
        const uint32_t other = static_cast<uint32_t>(value) - 1;
        if ((value & kTagMask) == tag && entries_[other].key == key) {
          // Its inserter may not have set the flag yet; the id must be usable once returned.
          if (entries_[other].published.load(std::memory_order_relaxed) == 0) {
            entries_[other].published.store(1, std::memory_order_release);
          }
          return {static_cast<int32_t>(other), false};  // our entry, if any, stays unpublished
        }
        break;  // another key: next cell
      }
      // The key is not in the table. Write it into an entry of ours before offering it, so
      // that a reader who sees the cell sees the whole key: no reader ever waits.
      if (id == kNoEntry) {
        if (next_id_.load(std::memory_order_relaxed) >= capacity_) return {-1, false};
        id = next_id_.fetch_add(1, std::memory_order_relaxed);
        if (id >= capacity_) return {-1, false};  // lost the race for the last entries
        CopyKey(&entries_[id].key, key);
      }
      // On failure `value` is reloaded and this cell examined again: it may hold our key.
      if (cell.compare_exchange_weak(value, tag | (id + 1), std::memory_order_acq_rel, std::memory_order_acquire)) {
        entries_[id].published.store(1, std::memory_order_release);
        return {static_cast<int32_t>(id), true};
      }
    }
  }
  return {-1, false};
}

bool CallsiteTable::Get(int32_t id, CallsiteKey* out) const {
  if (id < 0 || static_cast<uint32_t>(id) >= capacity_) return false;
  const CallsiteEntry& entry = entries_[id];
  if (entry.published.load(std::memory_order_acquire) == 0) return false;
  CopyKey(out, entry.key);
  return true;
}

uint32_t CallsiteTable::Size() const {
  const uint32_t n = next_id_.load(std::memory_order_acquire);
  return n < capacity_ ? n : capacity_;
}

}  // namespace detail
}  // namespace stacks
}  // namespace ncclwatch
