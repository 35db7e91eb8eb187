// ncclwatch's own code and threads: told apart from the application's in the stacks it dumps.
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <mutex>

#include "common/thread_id.h"
#include "stacks.h"

namespace ncclwatch {
namespace stacks {
namespace {

std::atomic<uintptr_t> g_own_base{0};  // load address of the object file that is ncclwatch's own

// ncclwatch has one or two threads of its own (the watchdog, the GIL helper while it runs).
constexpr int kOwnThreadSlots = 16;
std::atomic<int> g_own_tids[kOwnThreadSlots];

// A forked child has only the thread that forked: none of the parent's own threads.
void ForgetOwnThreadsInChild() {
  for (auto& tid : g_own_tids) tid.store(0, std::memory_order_relaxed);
}

uintptr_t ModuleBase(uintptr_t address) {
  Dl_info info;
  if (address == 0 || dladdr(reinterpret_cast<void*>(address), &info) == 0) return 0;
  return reinterpret_cast<uintptr_t>(info.dli_fbase);
}

}  // namespace

void SetOwnModule(const void* address) { g_own_base.store(ModuleBase(reinterpret_cast<uintptr_t>(address))); }

bool IsOwnFrame(uintptr_t ip) {
  const uintptr_t own = g_own_base.load();
  return own != 0 && ip != 0 && ModuleBase(ip - 1) == own;  // ip - 1: a return address
}

std::vector<uintptr_t> WithoutOwnFrames(const std::vector<uintptr_t>& ips) {
  size_t first = 0;
  while (first < ips.size() && IsOwnFrame(ips[first])) ++first;
  if (first == ips.size()) return ips;  // ours through and through: nothing else to show
  return std::vector<uintptr_t>(ips.begin() + static_cast<long>(first), ips.end());
}

void MarkOwnThread() {
  static std::once_flag at_fork_once;
  std::call_once(at_fork_once, [] { pthread_atfork(nullptr, nullptr, ForgetOwnThreadsInChild); });
  const int tid = CurrentTid();
  if (IsOwnThread(tid)) return;
  for (auto& slot : g_own_tids) {
    int expected = 0;
    if (slot.compare_exchange_strong(expected, tid)) return;
  }
}

void UnmarkOwnThread() {
  const int tid = CurrentTid();
  for (auto& slot : g_own_tids) {
    int expected = tid;
    slot.compare_exchange_strong(expected, 0);
  }
}

bool IsOwnThread(int tid) {
  if (tid <= 0) return false;
  for (const auto& slot : g_own_tids) {
    if (slot.load(std::memory_order_relaxed) == tid) return true;
  }
  return false;
}

}  // namespace stacks
}  // namespace ncclwatch
