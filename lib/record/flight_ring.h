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
  // `storage`: capacity_pow2 slots to record into (the black box's mapping), zero-filled and
  // outliving the ring; null: the ring allocates its own.
  explicit FlightRing(uint64_t capacity_pow2, OpSlot* storage = nullptr);
  // A read-only view of slots another process recorded (a black box read after its death):
  // the count recorded is recovered from the slots' generations.
  static std::unique_ptr<FlightRing> View(OpSlot* slots, uint64_t capacity_pow2);

  // Claims the next slot, fills it from `op` (op.index is set here) and publishes it.
  // Returns the index. Hot path.
  uint64_t Record(OpSnapshot& op);
  // Record with `mid_write()` called halfway through filling the slot: lets tests stall a
  // writer there. Record passes an empty lambda, so this costs nothing.
  template <typename MidWrite>
  uint64_t RecordWith(OpSnapshot& op, MidWrite&& mid_write);

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
  static constexpr uint64_t Gen(uint64_t index) { return index + 1; }
  static constexpr uint64_t Word(uint64_t index, uint64_t state) { return (Gen(index) << 8) | state; }
  OpSlot& SlotOf(uint64_t index) const { return slots_[index & mask_]; }
  FlightRing(uint64_t capacity_pow2, OpSlot* storage, uint64_t head);
  bool Transition(uint64_t index, trace::OpState state);

  uint64_t mask_;
  std::unique_ptr<OpSlot[]> owned_;
  OpSlot* slots_;
  alignas(64) std::atomic<uint64_t> head_{0};
};

template <typename MidWrite>
uint64_t FlightRing::RecordWith(OpSnapshot& op, MidWrite&& mid_write) {
  uint64_t index = head_.fetch_add(1, std::memory_order_acq_rel);
  op.index = index;
  OpSlot& s = SlotOf(index);
  // Claim the slot. Two writers meet here only when one stalled for a whole ring wrap; their
  // field stores must never interleave, so exactly one of them fills the slot.
  uint64_t cur = s.gen_state.load(std::memory_order_relaxed);
  for (;;) {
    // A newer record already holds the slot: ours fell out of the window while we stalled.
    if ((cur >> 8) >= Gen(index)) return index;
    uint64_t st = cur & 0xff;
    // An older writer is still filling it: drop ours (as if overwritten) and leave the slot to
    // that writer, which publishes its own record when done.
    bool busy = st == OpSlot::kWriting || st == OpSlot::kDropped;
    uint64_t want = Word(index, busy ? OpSlot::kDropped : OpSlot::kWriting);
    if (s.gen_state.compare_exchange_weak(cur, want, std::memory_order_relaxed)) {
      if (busy) return index;
      break;
    }
  }
  std::atomic_thread_fence(std::memory_order_release);
  s.comm_id.set(op.comm_id);
  s.seq.set(op.seq);
  mid_write();
  s.p2p_seq.set(op.p2p_seq);
  s.count.set(op.count);
  s.bytes.set(op.bytes);
  s.stream.set(op.stream);
  s.group.set(op.group);
  s.enqueue_ns.set(op.enqueue_ns);
  s.gpu_reached_ns.set(0);
  s.completed_ns.set(0);
  s.gpu_ms.set(-1.f);
  s.result.set(op.result);
  s.root.set(op.root);
  s.peer.set(op.peer);
  s.redop.set(op.redop);
  s.callsite.set(op.callsite);
  s.tid.set(op.tid);
  s.comm_size.set(op.comm_size);
  s.comm_rank_plus1.set(op.comm_rank + 1);
  s.kind.set(static_cast<uint8_t>(op.kind));
  s.dtype.set(op.dtype);
  s.gen_state.store(Word(index, static_cast<uint64_t>(op.state)), std::memory_order_release);
  // The next slot was last written by the watchdog's state changes (on its core): fetch it
  // for writing now, so that the next record's claim does not wait for it.
  const char* next = reinterpret_cast<const char*>(&SlotOf(index + 1));
  __builtin_prefetch(next, 1);
  __builtin_prefetch(next + 64, 1);
  return index;
}

}  // namespace ncclwatch
