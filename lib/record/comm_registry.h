// Communicators: identity (an id equal on every member), per-communicator sequence counters
// that survive ring overflow, and a lock-free handle -> info lookup for the hot path.
// Registration happens at communicator creation (not the hot path) under a mutex.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ncclwatch/trace_format.h"

namespace ncclwatch {

// The vocabularies live with the trace format, which writes their names.
using trace::CommKind;
using trace::CommKindName;
using trace::CommState;
using trace::CommStateName;

struct PeerCounters {
  std::atomic<uint64_t> send_enqueued{0}, send_completed{0}, recv_enqueued{0}, recv_completed{0};
};

// What changes during a communicator's life. In the black box when the process has one (another
// process reads it there after this one is gone), else in the CommInfo itself.
struct CommLive {
  std::atomic<CommState> state{CommState::Active};
  std::atomic<uint64_t> ended_ns{0};
  std::atomic<uint64_t> last_enqueued{0};  // = collectives issued so far (seq of the last one)
  std::atomic<uint64_t> last_gpu_reached{0};
  std::atomic<uint64_t> last_completed{0};
};

// A communicator as the black box keeps it: fixed layout, no pointers, readable by another
// process. `published` is set once the other fields are written.
struct CommRecord {
  std::atomic<uint32_t> published{0};
  uint8_t kind = 0;
  int32_t size = 0, rank = -1, device = -1, color = -1, key = -1, blocking = 1;
  uint64_t id = 0, parent_id = 0, created_ns = 0;
  char name[64] = {};
  CommLive live;
};

struct CommInfo {
  // Immutable after registration.
  const void* handle = nullptr;
  uint64_t id = 0;
  int size = 0;
  int rank = -1;
  int device = -1;
  std::string name;
  CommKind kind = CommKind::Unknown;
  uint64_t parent_id = 0;
  int color = -1;  // -1: not a split
  int key = -1;
  int blocking = 1;
  uint64_t created_ns = 0;
  std::unique_ptr<PeerCounters[]> peers;  // `size` entries; null for huge communicators

  // Mutable.
  std::atomic<uint32_t> children{0};  // splits + shrinks issued on this comm (for child ids)
  CommLive& live() const { return *live_; }
  // Moves the mutable state into a black box's record (at registration, before any use).
  void MoveLiveTo(CommLive* record, int index) {
    live_ = record;
    record_index = index;
  }
  int record_index = -1;  // its black box record, -1 none
  bool Ended() const { return live().state.load() != CommState::Active; }

  PeerCounters* Peer(int peer) const {
    return peers && peer >= 0 && peer < size ? &peers[peer] : nullptr;
  }

 private:
  mutable CommLive own_live_;
  CommLive* live_ = &own_live_;
};

// Raises `a` to at least `v`.
inline void StoreMax(std::atomic<uint64_t>& a, uint64_t v) {
  uint64_t cur = a.load(std::memory_order_relaxed);
  while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

class CommRegistry {
 public:
  static constexpr size_t kCapacity = 8192;  // live handles tracked at once
  static constexpr int kMaxPeerTracking = 1 << 16;

  CommRegistry();
  // Keeps each communicator registered from now on in one of `capacity` zero-filled records
  // (the black box) while they last; the rest keep their state in memory only.
  void UseStorage(CommRecord* records, size_t capacity);

  // Registers (or re-registers, when NCCL reuses a handle) a communicator. Never on the hot path.
  CommInfo* Register(std::unique_ptr<CommInfo> info);
  // Hot path: lock-free.
  CommInfo* Lookup(const void* handle) const;
  // Every communicator still known, in creation order (dump time).
  std::vector<CommInfo*> All() const;
  // The same appended to `out` (storage the caller keeps).
  template <typename T>
  void All(std::vector<T*>* out) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : all_) out->push_back(c.get());
  }
  // Forgets ended (destroyed, finalized, aborted) communicators past the newest `keep` of them
  // that ended before `ended_before_ns` and are not in `in_use` (the watchdog still follows an
  // operation of theirs): elastic jobs create and destroy thousands, and dumps and memory must
  // not grow with them. What a verdict needs of an ended communicator is its last state, which
  // the newest ones keep. Their black box records are reused. Returns how many were forgotten.
  size_t ForgetEnded(size_t keep, uint64_t ended_before_ns, const std::vector<const CommInfo*>& in_use);
  size_t EndedCount() const;
  size_t count() const;

 private:
  struct Slot {
    std::atomic<const void*> handle{nullptr};
    std::atomic<CommInfo*> info{nullptr};
  };
  static size_t Hash(const void* p);

  std::unique_ptr<Slot[]> slots_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<CommInfo>> all_;  // owned forever: dumps show destroyed comms too
  CommRecord* records_ = nullptr;
  size_t records_capacity_ = 0, records_used_ = 0;
  std::vector<int> free_records_;  // records of forgotten communicators
};

// The CommInfo a record describes (a black box read after its process is gone).
std::unique_ptr<CommInfo> CommInfoOf(const CommRecord& record);

// Communicator ids (docs/trace-format.md "Communicator ids").
uint64_t Fnv1a64(const void* data, size_t len, uint64_t seed = 0xcbf29ce484222325ull);
uint64_t CommIdFromUniqueIds(const void* ids, size_t nbytes);
uint64_t CommIdForSplit(uint64_t parent_id, uint32_t child_index, int color);
uint64_t CommIdForShrink(uint64_t parent_id, uint32_t child_index, const int* excluded, int nexcluded);
std::string CommIdHex(uint64_t id);

}  // namespace ncclwatch
