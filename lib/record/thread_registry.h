// Which threads are inside an NCCL call right now, and since when: tells "rank 0 is not in
// NCCL at all" from "rank 0 is blocked inside ncclCommInitRank". Each thread that calls NCCL
// claims a slot once; entering and leaving a call are two relaxed stores.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ncclwatch {

struct ThreadSlot {
  std::atomic<int32_t> tid{0};
  std::atomic<const char*> function{nullptr};  // static string; null when not inside NCCL
  std::atomic<uint64_t> since_ns{0};
  std::atomic<uint64_t> op_index1{0};  // ring index + 1 of the operation being issued, 0 if none
  std::atomic<bool> creating{false};   // the call creates a communicator (its own setup-hang check)
};

class ThreadRegistry {
 public:
  static constexpr size_t kCapacity = 1024;

  // The calling thread's slot (claimed on first use; null when all are taken).
  ThreadSlot* Claim(int32_t tid);
  void Release(ThreadSlot* slot);

  struct InCall {
    int32_t tid;
    const char* function;
    uint64_t since_ns;
    uint64_t op_index1;
    bool creating;
  };
  std::vector<InCall> InsideNccl() const;

 private:
  ThreadSlot slots_[kCapacity];
};

// RAII marker for "this thread is inside NCCL function F".
class InNcclScope {
 public:
  InNcclScope(ThreadSlot* slot, const char* function, uint64_t now_ns) : slot_(slot) {
    if (slot_) {
      slot_->since_ns.store(now_ns, std::memory_order_relaxed);
      slot_->op_index1.store(0, std::memory_order_relaxed);
      slot_->creating.store(false, std::memory_order_relaxed);
      slot_->function.store(function, std::memory_order_release);
    }
  }
  void SetOperation(uint64_t ring_index) {
    if (slot_) slot_->op_index1.store(ring_index + 1, std::memory_order_relaxed);
  }
  // Marks the call as creating a communicator: the watchdog leaves its host-side stall to the
  // setup-hang check, which names the communicator (one dump for one hang, not two).
  static void SetCreating(ThreadSlot* slot, bool creating) {
    if (slot) slot->creating.store(creating, std::memory_order_relaxed);
  }
  ~InNcclScope() {
    if (slot_) slot_->function.store(nullptr, std::memory_order_release);
  }
  InNcclScope(const InNcclScope&) = delete;
  InNcclScope& operator=(const InNcclScope&) = delete;

 private:
  ThreadSlot* slot_;
};

}  // namespace ncclwatch
