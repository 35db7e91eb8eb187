#include "intercept/launch.h"

#include <mutex>
#include <vector>

#include "common/clock.h"
#include "common/thread_id.h"
#include "stacks/stacks.h"

namespace ncclwatch {
namespace {

constexpr int kCallsiteSkip = 2;  // CaptureCallsite's caller's frames inside ncclwatch

void Describe(Recorder& rec, ThreadState& ts, const OpCall& c, GroupedOp* g) {
  CommInfo* comm = rec.Communicator(c.comm);
  OpSnapshot& o = g->op;
  g->comm = comm;
  o.comm_id = comm ? comm->id : 0;
  o.comm_size = comm ? comm->size : 0;
  o.comm_rank = comm ? comm->rank : -1;
  o.kind = c.kind;
  o.count = c.count;
  o.dtype = static_cast<int8_t>(c.dtype);
  o.bytes = trace::OperationBytes(c.kind, c.count, c.dtype, o.comm_size);
  o.redop = c.redop;
  if (trace::IsPointToPoint(c.kind))
    o.peer = c.root_or_peer;
  else
    o.root = c.root_or_peer;
  o.stream = reinterpret_cast<uint64_t>(c.stream);
  o.group = ts.group_depth > 0 ? ts.group_id : 0;
  o.tid = ts.tid;
  o.enqueue_ns = MonoNs();
  const int depth = rec.callsite_depth();
  o.callsite = depth > 0 ? stacks::CaptureCallsite(kCallsiteSkip, depth) : -1;
}

}  // namespace

ThreadState::~ThreadState() {
  if (Runtime* rt = Runtime::IfActive()) rt->recorder().DetachThread(slot);
}

ThreadState& CurrentThread() {
  static thread_local ThreadState state;
  return state;
}

void AttachThread(Recorder& rec, ThreadState& ts) {
  if (ts.tid) return;
  ts.tid = CurrentTid();
  ts.slot = rec.AttachThread(ts.tid);
}

ncclResult_t InterceptOperation(Recorder& rec, ThreadState& ts, const OpCall& call, RealCall real) {
  AttachThread(rec, ts);
  GroupedOp g;
  Describe(rec, ts, call, &g);
  if (ts.group_depth == 0) return rec.Launch(ts.slot, &g, 1, call.function, g.op.enqueue_ns, real);

  // Inside a group: nothing is launched before the outermost ncclGroupEnd.
  InNcclScope scope(ts.slot, call.function, g.op.enqueue_ns);
  ncclResult_t r = real();
  if (r != ncclSuccess && r != ncclInProgress) {
    rec.Failed(call.function, r, g.comm);
    return r;
  }
  if (!ts.group) ts.group = std::make_unique<GroupBuffer>();
  GroupBuffer& gb = *ts.group;
  if (gb.count < GroupBuffer::kMaxOps) {
    gb.ops[gb.count++] = g;
  } else {
    rec.RecordUnfollowed(&g);  // beyond the buffer
    ++gb.dropped;
  }
  return r;
}

ncclResult_t LaunchGroup(Recorder& rec, ThreadState& ts, RealCall real) {
  AttachThread(rec, ts);
  GroupBuffer* gb = ts.group.get();
  int n = gb ? gb->count : 0;
  if (gb) {
    gb->count = 0;
    gb->dropped = 0;
  }
  return rec.Launch(ts.slot, gb ? gb->ops : nullptr, n, "ncclGroupEnd", MonoNs(), real);
}

}  // namespace ncclwatch
