// One recorded NCCL operation, as stored in the flight ring and copied out for dumps.
// Recording layer: no NCCL or CUDA headers here.
#pragma once

#include <atomic>
#include <cstdint>

#include "ncclwatch/trace_format.h"

namespace ncclwatch {

// Plain copy of an operation (what the dump and the watchdog work with).
struct OpSnapshot {
  uint64_t index = 0;  // position in the ring's recording order (0-based, never reused)
  uint64_t comm_id = 0;
  uint64_t seq = 0;      // collective sequence number on the comm, from 1; 0 for p2p
  uint64_t p2p_seq = 0;  // n-th send to / recv from `peer`, from 1; 0 for collectives
  uint64_t count = 0;
  uint64_t bytes = 0;
  uint64_t stream = 0;
  uint64_t group = 0;
  uint64_t enqueue_ns = 0;
  uint64_t gpu_reached_ns = 0;
  uint64_t completed_ns = 0;
  float gpu_ms = -1.f;
  int32_t root = -1;
  int32_t peer = -1;
  int32_t redop = -1;
  int32_t callsite = -1;
  int32_t tid = 0;
  int32_t result = 0;
  int32_t comm_size = 0;
  // This process's rank in the communicator: a process that drives several ranks (several
  // devices) issues operations of one communicator id as each of them. -1 unknown.
  int32_t comm_rank = -1;
  trace::OpKind kind = trace::OpKind::AllReduce;
  int8_t dtype = 0;
  trace::OpState state = trace::OpState::Enqueued;
};

// The ring slot. A seqlock-like generation word publishes the slot: (index + 1) << 8 | state,
// with state kWriting while the producer fills it. The producer claims the word by CAS, so a
// producer that stalls for a whole ring wrap never shares its slot with the newer record (that
// one is dropped, see kDropped). Later state changes are CAS on that word,
// so a change aimed at an overwritten slot fails instead of corrupting the newer record.
struct alignas(64) OpSlot {  // two whole cache lines
  static constexpr uint64_t kWriting = 0xff;  // a producer is filling the slot
  // A newer record found the slot still being filled by a stalled older writer and was dropped;
  // the older writer still owns the slot and publishes over this.
  static constexpr uint64_t kDropped = 0xfe;
  static bool Published(uint64_t gen_state) { return (gen_state & 0xff) < kDropped; }
  template <typename T>
  struct Field {  // relaxed atomic: a reader may race with an overwrite; the generation check decides
    std::atomic<T> v{};
    void set(T x) { v.store(x, std::memory_order_relaxed); }
    T get() const { return v.load(std::memory_order_relaxed); }
  };
  std::atomic<uint64_t> gen_state{0};
  Field<uint64_t> comm_id, seq, p2p_seq, count, bytes, stream, group, enqueue_ns;
  Field<uint64_t> gpu_reached_ns, completed_ns;
  Field<float> gpu_ms;
  Field<int32_t> result, root, peer, redop, callsite, tid, comm_size;
  Field<uint8_t> kind;
  Field<int8_t> dtype;
  // comm_rank + 1: 0 (a zero-filled slot, a black box written before it) reads as unknown.
  Field<int32_t> comm_rank_plus1;
};
static_assert(sizeof(OpSlot) == 128, "a slot is two cache lines");

struct CommInfo;

// An operation described but not launched yet, with its communicator: a group's operations wait
// as these for the outermost ncclGroupEnd (at most kMaxGroupOps are followed); a single call is
// a batch of one.
constexpr int kMaxGroupOps = 1024;
struct GroupedOp {
  OpSnapshot op;  // seq numbers are assigned at launch: a simulated group consumes none
  CommInfo* comm = nullptr;
};

}  // namespace ncclwatch
