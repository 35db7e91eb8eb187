// Bounded lock-free multi-producer multi-consumer queue (sequence-numbered cells). Used where
// application threads hand things to the watchdog or take from a pool: no locks, no
// allocation after construction, no ABA.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>

namespace ncclwatch {

template <typename T>
class MpmcQueue {
 public:
  explicit MpmcQueue(size_t capacity_pow2) : mask_(capacity_pow2 - 1), cells_(new Cell[capacity_pow2]) {
    for (size_t i = 0; i < capacity_pow2; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }

  bool TryPush(const T& value) {
    size_t pos = tail_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& c = cells_[pos & mask_];
      size_t seq = c.seq.load(std::memory_order_acquire);
      intptr_t diff = static_cast<intptr_t>(seq) - static_cast<intptr_t>(pos);
      if (diff == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          c.value = value;
          c.seq.store(pos + 1, std::memory_order_release);
          // The next cell was last written by the consumer's core: start moving it here now,
          // so that the next push does not wait for it.
          __builtin_prefetch(&cells_[(pos + 1) & mask_], 1);
          return true;
        }
      } else if (diff < 0) {
        return false;  // full
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
  }

  bool TryPop(T* out) {
    size_t pos = head_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& c = cells_[pos & mask_];
      size_t seq = c.seq.load(std::memory_order_acquire);
      intptr_t diff = static_cast<intptr_t>(seq) - static_cast<intptr_t>(pos + 1);
      if (diff == 0) {
        if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          *out = c.value;
          c.seq.store(pos + mask_ + 1, std::memory_order_release);
          return true;
        }
      } else if (diff < 0) {
        return false;  // empty
      } else {
        pos = head_.load(std::memory_order_relaxed);
      }
    }
  }

  size_t capacity() const { return mask_ + 1; }
  // Approximate number of queued items (exact when nobody is pushing or popping).
  size_t ApproxSize() const {
    size_t t = tail_.load(std::memory_order_relaxed), h = head_.load(std::memory_order_relaxed);
    return t > h ? t - h : 0;
  }
  size_t MemoryBytes() const { return sizeof(Cell) * capacity(); }

 private:
  struct Cell {
    std::atomic<size_t> seq;
    T value;
  };
  const size_t mask_;
  std::unique_ptr<Cell[]> cells_;
  alignas(64) std::atomic<size_t> tail_{0};
  alignas(64) std::atomic<size_t> head_{0};
};

}  // namespace ncclwatch
