#include "record/flight_ring.h"

#include <algorithm>

namespace ncclwatch {
FlightRing::FlightRing(uint64_t capacity_pow2, OpSlot* storage)
    : mask_(capacity_pow2 - 1), owned_(storage ? nullptr : new OpSlot[capacity_pow2]), slots_(storage ? storage : owned_.get()) {}

FlightRing::FlightRing(uint64_t capacity_pow2, OpSlot* storage, uint64_t head)
    : mask_(capacity_pow2 - 1), slots_(storage), head_(head) {}

std::unique_ptr<FlightRing> FlightRing::View(OpSlot* slots, uint64_t capacity_pow2) {
  // Each slot's generation is its index + 1: the newest one claimed is the count recorded.
  uint64_t head = 0;
  for (uint64_t i = 0; i < capacity_pow2; ++i) head = std::max(head, slots[i].gen_state.load(std::memory_order_acquire) >> 8);
  return std::unique_ptr<FlightRing>(new FlightRing(capacity_pow2, slots, head));
}

uint64_t FlightRing::Record(OpSnapshot& op) {
  return RecordWith(op, [] {});
}

bool FlightRing::Transition(uint64_t index, trace::OpState state) {
  OpSlot& s = SlotOf(index);
  uint64_t cur = s.gen_state.load(std::memory_order_acquire);
  while ((cur >> 8) == Gen(index) && OpSlot::Published(cur)) {
    if (s.gen_state.compare_exchange_weak(cur, Word(index, static_cast<uint64_t>(state)),
                                          std::memory_order_acq_rel))
      return true;
  }
  return false;
}

bool FlightRing::SetState(uint64_t index, trace::OpState state, uint64_t when_ns) {
  OpSlot& s = SlotOf(index);
  if ((s.gen_state.load(std::memory_order_acquire) >> 8) != Gen(index)) return false;
  // Discovery times go first so that a reader seeing the new state sees its time. If the slot
  // is overwritten between the check above and the CAS, the newer record can keep a stale
  // time: harmless (times are informational) and requires a full ring wrap in that window.
  if (state == trace::OpState::GpuReached || state == trace::OpState::Completed) {
    if (s.gpu_reached_ns.get() == 0) s.gpu_reached_ns.set(when_ns);
  }
  if (state == trace::OpState::Completed) s.completed_ns.set(when_ns);
  return Transition(index, state);
}

bool FlightRing::SetResult(uint64_t index, int32_t result) {
  OpSlot& s = SlotOf(index);
  if ((s.gen_state.load(std::memory_order_acquire) >> 8) != Gen(index)) return false;
  s.result.set(result);
  return true;
}

bool FlightRing::SetGpuMs(uint64_t index, float ms) {
  OpSlot& s = SlotOf(index);
  if ((s.gen_state.load(std::memory_order_acquire) >> 8) != Gen(index)) return false;
  s.gpu_ms.set(ms);
  return true;
}

bool FlightRing::Read(uint64_t index, OpSnapshot* out) const {
  const OpSlot& s = SlotOf(index);
  uint64_t before = s.gen_state.load(std::memory_order_acquire);
  if ((before >> 8) != Gen(index) || !OpSlot::Published(before)) return false;
  OpSnapshot o;
  o.index = index;
  o.comm_id = s.comm_id.get();
  o.seq = s.seq.get();
  o.p2p_seq = s.p2p_seq.get();
  o.count = s.count.get();
  o.bytes = s.bytes.get();
  o.stream = s.stream.get();
  o.group = s.group.get();
  o.enqueue_ns = s.enqueue_ns.get();
  o.gpu_reached_ns = s.gpu_reached_ns.get();
  o.completed_ns = s.completed_ns.get();
  o.gpu_ms = s.gpu_ms.get();
  o.result = s.result.get();
  o.root = s.root.get();
  o.peer = s.peer.get();
  o.redop = s.redop.get();
  o.callsite = s.callsite.get();
  o.tid = s.tid.get();
  o.comm_size = s.comm_size.get();
  o.comm_rank = s.comm_rank_plus1.get() - 1;
  o.kind = static_cast<trace::OpKind>(s.kind.get());
  o.dtype = s.dtype.get();
  std::atomic_thread_fence(std::memory_order_acquire);
  uint64_t after = s.gen_state.load(std::memory_order_relaxed);
  if ((after >> 8) != Gen(index) || !OpSlot::Published(after)) return false;
  o.state = static_cast<trace::OpState>(after & 0xff);
  *out = o;
  return true;
}

std::vector<OpSnapshot> FlightRing::Snapshot() const {
  uint64_t head = recorded();
  uint64_t first = head > capacity() ? head - capacity() : 0;
  std::vector<OpSnapshot> out;
  out.reserve(head - first);
  for (uint64_t i = first; i < head; ++i) {
    OpSnapshot o;
    if (Read(i, &o)) out.push_back(o);
  }
  return out;
}

}  // namespace ncclwatch
