// Shared-memory layout and synchronization of one simulated communicator.
//
// Every member process maps the same POSIX shared-memory segment. Nothing in it is a lock:
// ranks synchronize with atomic counters and futexes on shared words, so a rank killed at any
// point leaves no lock held (its peers simply wait for it, as with real NCCL).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace simnccl {

// Futex helpers on a 32-bit word in shared memory (not FUTEX_PRIVATE: other processes wait too).
void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms);
void FutexWakeAll(std::atomic<uint32_t>* word);

// A reusable all-ranks barrier. Round k completes when arrivals reaches (k+1)*nranks; each
// rank counts its own rounds, and all ranks pass through the same rounds in the same order.
struct alignas(64) ShmBarrier {
  std::atomic<uint64_t> arrivals;
  std::atomic<uint32_t> released;  // futex word: number of completed rounds (mod 2^32)
};

struct alignas(64) RankInfo {
  std::atomic<uint32_t> doorbell;  // futex word: bumped when a pipe this rank waits on moves
  std::atomic<int32_t> pid;        // 0 until the rank attached (a second claim is an error)
};

// Signature of a collective; ranks compare these at each sequence number.
struct OpSig {
  uint64_t seq;
  uint64_t count;
  int32_t kind;
  int32_t dtype;
  int32_t redop;
  int32_t root;
  bool operator==(const OpSig& o) const {
    return seq == o.seq && count == o.count && kind == o.kind && dtype == o.dtype &&
           redop == o.redop && root == o.root;
  }
};

struct alignas(64) SlotHeader {
  OpSig sig;
};

// One single-producer single-consumer byte pipe per ordered pair of ranks (Send/Recv).
struct alignas(64) PipeCtl {
  std::atomic<uint64_t> head;  // bytes written by the sender
  alignas(64) std::atomic<uint64_t> tail;  // bytes consumed by the receiver
};

constexpr uint64_t kShmMagic = 0x314d49534c43434eull;  // "NCCLSIM1"
constexpr size_t kCtlSlotBytes = 64;

struct ShmHeader {
  std::atomic<uint64_t> magic;  // stored last by the creator: the layout below is valid
  uint32_t nranks;
  uint32_t slot_bytes;  // collective staging per rank and parity
  uint32_t pipe_bytes;  // per ordered rank pair
  uint64_t total_bytes;
  uint64_t off_ranks, off_slots, off_ctl, off_pipes, off_pipe_data;
  alignas(64) std::atomic<uint32_t> attached;
  alignas(64) std::atomic<uint32_t> ready;  // futex word: 1 once every rank attached
  ShmBarrier coll;  // collectives (stream side)
  ShmBarrier ctl;   // host-side control exchanges (ncclCommSplit)
};

// A mapped segment with typed accessors.
struct Segment {
  ShmHeader* hdr = nullptr;
  size_t bytes = 0;

  RankInfo& rank(int r) const {
    return reinterpret_cast<RankInfo*>(base() + hdr->off_ranks)[r];
  }
  size_t SlotStride() const { return sizeof(SlotHeader) + hdr->slot_bytes; }
  SlotHeader* slot(int parity, int r) const {
    return reinterpret_cast<SlotHeader*>(base() + hdr->off_slots +
                                         (size_t(parity) * hdr->nranks + r) * SlotStride());
  }
  char* slot_data(int parity, int r) const { return reinterpret_cast<char*>(slot(parity, r) + 1); }
  char* ctl_slot(int parity, int r) const {
    return base() + hdr->off_ctl + (size_t(parity) * hdr->nranks + r) * kCtlSlotBytes;
  }
  PipeCtl& pipe(int src, int dst) const {
    return reinterpret_cast<PipeCtl*>(base() + hdr->off_pipes)[size_t(src) * hdr->nranks + dst];
  }
  char* pipe_data(int src, int dst) const {
    return base() + hdr->off_pipe_data + (size_t(src) * hdr->nranks + dst) * hdr->pipe_bytes;
  }
  char* base() const { return reinterpret_cast<char*>(hdr); }
};

// Segment name for a communicator key: /ncclsim-<session>-<key as 16 hex digits>.
std::string SegmentName(const std::string& session, uint64_t key);

// Creates the segment (first caller) or opens it (others), maps it and waits until the
// creator has laid it out. `stop` is polled while waiting. Returns false with `err` set.
bool MapSegment(const std::string& name, int nranks, const std::atomic<bool>& stop, Segment* seg,
                std::string* err);
void UnmapSegment(Segment* seg);

// Passes one round of `b`. Returns false if `stop` became true first.
bool BarrierWait(ShmBarrier& b, uint32_t nranks, uint64_t* round, const std::atomic<bool>& stop);

}  // namespace simnccl
