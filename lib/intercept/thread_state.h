// Per-thread interception state: the re-entry guard (NCCL calling its own public API, or our
// own code, passes straight through), group nesting (NCCL groups are per thread) and the
// operations buffered until the outermost ncclGroupEnd launches them.
#pragma once

#include <cstdint>
#include <memory>

#include "record/comm_registry.h"
#include "record/op_record.h"
#include "record/thread_registry.h"

namespace ncclwatch {

struct GroupBuffer {
  static constexpr int kMaxOps = kMaxGroupOps;
  GroupedOp ops[kMaxOps];
  int count = 0;
  uint64_t dropped = 0;  // beyond kMaxOps: launched, recorded as unmonitored
};

struct ThreadState {
  bool inside = false;  // re-entry guard
  int group_depth = 0;
  uint64_t group_id = 0;
  int32_t tid = 0;
  ThreadSlot* slot = nullptr;
  std::unique_ptr<GroupBuffer> group;  // allocated at this thread's first ncclGroupStart
  ~ThreadState();
};

ThreadState& CurrentThread();

// RAII for the re-entry guard.
class ReentryGuard {
 public:
  explicit ReentryGuard(ThreadState& ts) : ts_(ts), previous_(ts.inside) { ts_.inside = true; }
  ~ReentryGuard() { ts_.inside = previous_; }
  ReentryGuard(const ReentryGuard&) = delete;
  ReentryGuard& operator=(const ReentryGuard&) = delete;

 private:
  ThreadState& ts_;
  bool previous_;
};

}  // namespace ncclwatch
