// The flight record: a fixed-size ring of the most recent operations, written on the calling
// thread without locks or allocation. Many producers (application threads), one updater of
// states (the watchdog), readers at dump time.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "record/op_record.h"

namespace ncclwatch {

class FlightRing {
 public:
  explicit FlightRing(uint64_t capacity_pow2);

  // Claims the next slot, fills it from `op` (op.index is set here) and publishes it.
  // Returns the index. Hot path.
  uint64_t Record(OpSnapshot& op);

  // Moves the slot of `index` to `state` (and sets discovery times), unless the slot has been
  // overwritten since. Returns false then.
  bool SetState(uint64_t index, trace::OpState state, uint64_t when_ns = 0);
  bool SetResult(uint64_t index, int32_t result);
  bool SetGpuMs(uint64_t index, float ms);

  // Consistent copies of the entries still in the ring, oldest first (slots being written or
  // overwritten during the copy are skipped).
  std::vector<OpSnapshot> Snapshot() const;
  bool Read(uint64_t index, OpSnapshot* out) const;

  uint64_t capacity() const { return mask_ + 1; }
  uint64_t recorded() const { return head_.load(std::memory_order_acquire); }
  uint64_t overwritten() const {
    uint64_t h = recorded();
    return h > capacity() ? h - capacity() : 0;
  }
  size_t MemoryBytes() const { return sizeof(OpSlot) * capacity(); }

 private:
  OpSlot& SlotOf(uint64_t index) const { return slots_[index & mask_]; }
  bool Transition(uint64_t index, trace::OpState state);

  uint64_t mask_;
  std::unique_ptr<OpSlot[]> slots_;
  alignas(64) std::atomic<uint64_t> head_{0};
};

}  // namespace ncclwatch
