// Which threads are inside an NCCL call right now, and since when: tells "rank 0 is not in
// NCCL at all" from "rank 0 is blocked inside ncclCommInitRank". Each thread that calls NCCL
// claims a slot once; entering and leaving a call are two relaxed stores.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ncclwatch {

struct ThreadSlot {
  std::atomic<int32_t> tid{0};
  std::atomic<const char*> function{nullptr};  // static string; null when not inside NCCL
  std::atomic<uint64_t> since_ns{0};
  std::atomic<uint64_t> op_index1{0};  // ring index + 1 of the operation being issued, 0 if none
  std::atomic<bool> creating{false};   // the call creates a communicator (its own setup-hang check)
  // `function` as text, for a reader in another process (the black box): `named` is the
  // function pointer the text belongs to. Copied off the hot path (ThreadRegistry::NameCalls).
  std::atomic<uintptr_t> named{0};
  char function_name[40] = {};
};

class ThreadRegistry {
 public:
  static constexpr size_t kCapacity = 1024;

  ThreadRegistry();
  // Moves the slots into `storage` (kCapacity zero-filled slots that outlive the registry: the
  // black box). Only before the first Claim.
  void UseStorage(ThreadSlot* storage) { slots_ = storage; }

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
  // The same into `out` (cleared first): storage the caller keeps, no allocation once it holds kCapacity.
  void InsideNccl(std::vector<InCall>* out) const;
  // Every thread that has called NCCL (and holds a slot).
  std::vector<int> Threads() const;
  // Writes the name of each slot's current call beside it (watchdog thread, every poll).
  void NameCalls();
  // A slot's call as another process reads it: its name, or "" when not inside NCCL; "an NCCL
  // call" when the name was not written yet.
  static std::string CallName(const ThreadSlot& slot);
  static bool CallNamed(const ThreadSlot& slot) {
    const auto fn = reinterpret_cast<uintptr_t>(slot.function.load(std::memory_order_acquire));
    return fn && slot.named.load(std::memory_order_acquire) == fn;
  }

 private:
  std::unique_ptr<ThreadSlot[]> owned_;
  ThreadSlot* slots_;
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
