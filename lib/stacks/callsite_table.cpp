#include "callsite_table.h"

#include <sched.h>
#include <time.h>

#include <cstring>

namespace ncclwatch {
namespace stacks {
namespace detail {
namespace {

constexpr uint64_t kTagMask = 0xffffffff00000000ull;
constexpr uint32_t kPending = 0xffffffffu;
constexpr uint32_t kDead = 0xfffffffeu;
// How long a lookup waits for another thread that is inserting the same key (it only copies
// the key, so this is only reached when that thread was preempted).
constexpr int64_t kPendingWaitNs = 20 * 1000 * 1000;

inline uint64_t Mix(uint64_t h, uint64_t word) {
  h ^= word;
  h *= 0x9e3779b97f4a7c15ull;
  return h ^ (h >> 29);
}

int64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000ll + ts.tv_nsec;
}

// Copies only the used frames (the rest of a key on the stack is uninitialized).
void CopyKey(CallsiteKey* dst, const CallsiteKey& src) {
  dst->native_depth = src.native_depth;
  dst->python_depth = src.python_depth;
  std::memcpy(dst->ips, src.ips, src.native_depth * sizeof(src.ips[0]));
  std::memcpy(dst->py_code, src.py_code, src.python_depth * sizeof(src.py_code[0]));
  std::memcpy(dst->py_position, src.py_position, src.python_depth * sizeof(src.py_position[0]));
}

// Waits until `cell` is no longer pending; returns its new value (still pending on timeout).
uint64_t WaitWhilePending(const std::atomic<uint64_t>& cell, uint64_t value) {
  for (int spin = 0; spin < 256 && (value & ~kTagMask) == kPending; ++spin) {
    __builtin_ia32_pause();
    value = cell.load(std::memory_order_acquire);
  }
  const int64_t deadline = MonotonicNs() + kPendingWaitNs;
  while ((value & ~kTagMask) == kPending && MonotonicNs() < deadline) {
    sched_yield();
    value = cell.load(std::memory_order_acquire);
  }
  return value;
}

}  // namespace

uint64_t CallsiteKey::Hash() const {
  // Two independent lanes: the multiply chain is the cost, and they run in parallel.
  uint64_t even = 0x6a09e667f3bcc909ull ^ native_depth;
  uint64_t odd = 0xbb67ae8584caa73bull ^ python_depth;
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
         std::memcmp(ips, other.ips, native_depth * sizeof(ips[0])) == 0 &&
         std::memcmp(py_code, other.py_code, python_depth * sizeof(py_code[0])) == 0 &&
         std::memcmp(py_position, other.py_position, python_depth * sizeof(py_position[0])) == 0;
}

CallsiteTable::InternResult CallsiteTable::Intern(const CallsiteKey& key) {
  const uint64_t hash = key.Hash();
  const uint64_t tag = hash & kTagMask;
  uint32_t index = static_cast<uint32_t>(hash) & cell_mask_;
  for (uint32_t probe = 0; probe <= cell_mask_; ++probe, index = (index + 1) & cell_mask_) {
    std::atomic<uint64_t>& cell = cells_[index];
    uint64_t value = cell.load(std::memory_order_acquire);
    for (;;) {
      if (value == 0) {
        if (next_id_.load(std::memory_order_relaxed) >= capacity_) return {-1, false};
        // On failure `value` is reloaded and this cell examined again.
        if (!cell.compare_exchange_weak(value, tag | kPending, std::memory_order_acquire,
                                        std::memory_order_acquire)) {
          continue;
        }
        const uint32_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
        if (id >= capacity_) {  // lost the race for the last entries
          cell.store(tag | kDead, std::memory_order_release);
          return {-1, false};
        }
        CallsiteEntry& entry = entries_[id];
        CopyKey(&entry.key, key);
        entry.published.store(1, std::memory_order_release);
        cell.store(tag | (id + 1), std::memory_order_release);
        return {static_cast<int32_t>(id), true};
      }
      if ((value & kTagMask) != tag) break;
      const uint32_t state = static_cast<uint32_t>(value);
      if (state == kDead) break;
      if (state == kPending) {
        value = WaitWhilePending(cell, value);
        if (static_cast<uint32_t>(value) == kPending) return {-1, false};
        continue;
      }
      if (entries_[state - 1].key == key) return {static_cast<int32_t>(state - 1), false};
      break;
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
