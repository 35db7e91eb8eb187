// The interception core shared by every wrapper: describe an operation, give it its sequence
// numbers, record it in the ring, put GPU markers around its launch and hand it to the watchdog.
// A single operation is a batch of one; the outermost ncclGroupEnd launches the group's batch.
#pragma once

#include <cstdint>

#include "common/quietly.h"
#include "runtime/runtime.h"
#include "intercept/thread_state.h"
#include "ncclwatch/nccl_abi.h"

namespace ncclwatch {

// The shapes one operation takes, from the call to the report:
//   OpCall         a wrapper's arguments, as NCCL got them (here)
//   GroupedOp      the call described as an OpSnapshot, with its communicator; a group's
//                  operations wait in the thread's GroupBuffer for the outermost ncclGroupEnd
//                  (thread_state.h), a single one is a batch of one
//   OpSnapshot     the plain record: written into the flight ring's OpSlot at launch, and the
//                  copy every later stage reads back (record/op_record.h)
//   InflightItem   the one-cache-line hand-off to the watchdog: where the record is in the ring,
//                  plus what a stall report needs if the ring overwrites it (watchdog/watchdog.h)
//   Watchdog::Tracked  the watchdog's own follow-up per stream: the snapshot read back, its
//                  marker, state and deadline
//   InflightView   a not-completed operation as a dump shows it: snapshot, age, deadline
//   trace::Op      the trace format's record (format/records.h): what a dump writes and the
//                  command reads; the command's wait graph points at it (BlockedOp::op).
struct OpCall {
  const char* function;
  trace::OpKind kind;
  uint64_t count;
  int dtype;
  int redop;         // -1: none
  int root_or_peer;  // -1: none
  const void* comm;
  cudaStream_t stream;
};

// Claims the thread's registry slot on first use.
void AttachThread(Recorder& rec, ThreadState& ts);

// Hot path for every data-moving call (ncclAllReduce, ncclSend, ...).
ncclResult_t InterceptOperation(Recorder& rec, ThreadState& ts, const OpCall& call, RealCall real);
// The outermost ncclGroupEnd: launches the buffered operations.
ncclResult_t LaunchGroup(Recorder& rec, ThreadState& ts, RealCall real);

// Runs `ours(RealCall)`, which makes the application's call through the RealCall it is given.
// Whatever of ours fails (out of memory), the application's call is made exactly once.
template <typename Real, typename Ours>
ncclResult_t CallExactlyOnce(const char* what, Real&& real, Ours&& ours) {
  bool called = false;
  ncclResult_t result = ncclSuccess;
  auto once = [&] {
    called = true;
    return result = real();
  };
  ncclResult_t r = ncclSuccess;
  if (Quietly(what, [&] { r = ours(RealCall(once)); })) return r;
  return called ? result : real();
}

// Every wrapper starts the same way: pass straight through when disabled or re-entered.
template <typename F>
ncclResult_t GuardedOperation(const OpCall& call, F&& real) {
  ThreadState& ts = CurrentThread();
  if (ts.inside) return real();
  Runtime* rt = Runtime::Acquire();
  if (!rt) return real();
  ReentryGuard guard(ts);
  return CallExactlyOnce(call.function, real,
                         [&](RealCall once) { return InterceptOperation(rt->recorder(), ts, call, once); });
}

}  // namespace ncclwatch
