#include "intercept/launch.h"

#include <mutex>
#include <vector>

#include "common/clock.h"
#include "common/thread_id.h"
#include "stacks/stacks.h"

namespace ncclwatch {
namespace {

constexpr int kMaxGroupStreams = 64;
constexpr int kCallsiteSkip = 2;  // CaptureCallsite's caller's frames inside ncclwatch

// Operations of non-blocking communicators whose launch NCCL has not confirmed yet.
struct PendingLaunch {
  CommInfo* comm;
  Marker* marker;
  cudaStream_t stream;
  std::vector<InflightItem> items;
};
std::mutex g_nonblocking_mu;
std::vector<PendingLaunch> g_nonblocking;

void Describe(Runtime& rt, ThreadState& ts, const OpCall& c, GroupedOp* g) {
  CommInfo* comm = rt.comms().Lookup(c.comm);
  if (!comm && c.comm) comm = rt.AdoptUnknown(c.comm);
  OpSnapshot& o = g->op;
  g->comm = comm;
  o.comm_id = comm ? comm->id : 0;
  o.comm_size = comm ? comm->size : 0;
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
  o.callsite = rt.config().callsites ? stacks::CaptureCallsite(kCallsiteSkip, static_cast<int>(rt.config().callsite_depth)) : -1;
}

// Sequence numbers are given at launch, in launch order, the same way on every rank.
void AssignSequence(GroupedOp* g) {
  OpSnapshot& o = g->op;
  CommInfo* c = g->comm;
  if (!c) return;
  if (!trace::IsPointToPoint(o.kind)) {
    o.seq = c->live().last_enqueued.fetch_add(1, std::memory_order_relaxed) + 1;
  } else if (PeerCounters* p = c->Peer(o.peer)) {
    auto& counter = o.kind == trace::OpKind::Send ? p->send_enqueued : p->recv_enqueued;
    o.p2p_seq = counter.fetch_add(1, std::memory_order_relaxed) + 1;
  }
}

trace::OpState StateFor(MarkResult mr) {
  return mr == MarkResult::kCaptured ? trace::OpState::Captured : trace::OpState::Unmonitored;
}

void Fail(Runtime& rt, GroupedOp* ops, int n, ncclResult_t r, const char* function) {
  for (int i = 0; i < n; ++i) {
    rt.ring().SetResult(ops[i].op.index, r);
    rt.ring().SetState(ops[i].op.index, trace::OpState::Error);
  }
  rt.OnNcclError(function, r, n > 0 ? ops[0].comm : nullptr, false, n > 0 ? &ops[0].op : nullptr);
}

// A non-blocking communicator returned ncclInProgress: its marked operations wait, with their
// start markers, until ncclCommGetAsyncError says they were launched (SettleNonblocking).
void DeferNonblocking(const GroupedOp* ops, Marker* const* marker_of, int n) {
  std::vector<PendingLaunch> pending;
  for (int i = 0; i < n; ++i) {
    Marker* marker = marker_of[i];
    if (!marker) continue;
    auto it = pending.begin();
    while (it != pending.end() && it->marker != marker) ++it;
    if (it == pending.end()) {
      auto stream = reinterpret_cast<cudaStream_t>(ops[i].op.stream);
      it = pending.insert(pending.end(), PendingLaunch{ops[i].comm, marker, stream, {}});
    }
    it->items.push_back(InflightItem::Of(ops[i].op, ops[i].comm, marker));
  }
  std::lock_guard<std::mutex> lock(g_nonblocking_mu);
  for (auto& p : pending) g_nonblocking.push_back(std::move(p));
}

// Records `n` operations, launches them with `real` between start and end markers (one pair
// per stream), then hands them to the watchdog.
// `now`: a single operation's enqueue time (one clock read per call).
ncclResult_t LaunchBatch(Runtime& rt, ThreadState& ts, GroupedOp* ops, int n, const char* function, uint64_t now,
                         RealCall real) {
  InNcclScope scope(ts.slot, function, now);
  for (int i = 0; i < n; ++i) {
    AssignSequence(&ops[i]);
    ops[i].op.state = trace::OpState::Enqueued;
    rt.ring().Record(ops[i].op);
  }
  if (n > 0) scope.SetOperation(ops[0].op.index);

  struct StreamMark {
    cudaStream_t stream;
    Marker* marker;
    MarkResult result;
    int ops;
  };
  StreamMark marks[kMaxGroupStreams];
  int nmarks = 0;
  int stream_of[GroupBuffer::kMaxOps];
  GpuMarkers* markers = rt.markers();
  for (int i = 0; i < n; ++i) {
    auto s = reinterpret_cast<cudaStream_t>(ops[i].op.stream);
    int m = 0;
    while (m < nmarks && marks[m].stream != s) ++m;
    if (m == nmarks && nmarks < kMaxGroupStreams) {
      marks[m] = {s, nullptr, MarkResult::kUnmonitored, 0};
      if (markers) marks[m].result = markers->Begin(reinterpret_cast<CUstream>(s), &marks[m].marker);
      ++nmarks;
    }
    stream_of[i] = m < nmarks ? m : -1;
    if (m < nmarks) ++marks[m].ops;
  }

  ncclResult_t r = real();

  if (r != ncclSuccess && r != ncclInProgress) {
    for (int m = 0; m < nmarks; ++m)
      if (marks[m].marker) markers->Abandon(marks[m].marker);
    Fail(rt, ops, n, r, function);
    return r;
  }
  for (int m = 0; m < nmarks; ++m) {
    StreamMark& sm = marks[m];
    if (!sm.marker) continue;
    if (r == ncclInProgress) continue;  // the end marker goes in once NCCL confirms the launch
    if (!markers->End(sm.marker, reinterpret_cast<CUstream>(sm.stream))) {
      sm.marker = nullptr;
      sm.result = MarkResult::kUnmonitored;
      continue;
    }
    sm.marker->refs.store(sm.ops, std::memory_order_relaxed);
  }
  // Operations without a marker are captured or unmonitored from here on.
  Marker* marker_of[GroupBuffer::kMaxOps];
  for (int i = 0; i < n; ++i) {
    int m = stream_of[i];
    marker_of[i] = m >= 0 ? marks[m].marker : nullptr;
    if (marker_of[i]) continue;
    trace::OpState state = StateFor(m >= 0 ? marks[m].result : MarkResult::kUnmonitored);
    rt.ring().SetState(ops[i].op.index, state);
    // A collective captured into a CUDA graph is launched by every replay: it is never "not
    // reached", so its sequence number counts as reached and completed (a replay that hangs
    // is not seen: no markers go into a graph).
    if (state == trace::OpState::Captured && ops[i].comm && !trace::IsPointToPoint(ops[i].op.kind)) {
      StoreMax(ops[i].comm->live().last_gpu_reached, ops[i].op.seq);
      StoreMax(ops[i].comm->live().last_completed, ops[i].op.seq);
    }
  }
  if (r == ncclInProgress) {
    DeferNonblocking(ops, marker_of, n);
    return r;
  }
  for (int i = 0; i < n; ++i) {
    if (!marker_of[i]) continue;
    if (!rt.watchdog().Submit(InflightItem::Of(ops[i].op, ops[i].comm, marker_of[i]))) {
      markers->Release(marker_of[i]);
      rt.ring().SetState(ops[i].op.index, trace::OpState::Unmonitored);
    }
  }
  return r;
}

}  // namespace

ThreadState::~ThreadState() {
  if (Runtime* rt = Runtime::IfActive()) rt->threads().Release(slot);
}

ThreadState& CurrentThread() {
  static thread_local ThreadState state;
  return state;
}

void AttachThread(Runtime& rt, ThreadState& ts) {
  if (ts.tid) return;
  ts.tid = CurrentTid();
  ts.slot = rt.threads().Claim(ts.tid);
}

ncclResult_t InterceptOperation(Runtime& rt, ThreadState& ts, const OpCall& call, RealCall real) {
  AttachThread(rt, ts);
  GroupedOp g;
  Describe(rt, ts, call, &g);
  if (ts.group_depth == 0) return LaunchBatch(rt, ts, &g, 1, call.function, g.op.enqueue_ns, real);

  // Inside a group: nothing is launched before the outermost ncclGroupEnd.
  InNcclScope scope(ts.slot, call.function, g.op.enqueue_ns);
  ncclResult_t r = real();
  if (r != ncclSuccess && r != ncclInProgress) {
    rt.OnNcclError(call.function, r, g.comm, false);
    return r;
  }
  if (!ts.group) ts.group = std::make_unique<GroupBuffer>();
  GroupBuffer& gb = *ts.group;
  if (gb.count < GroupBuffer::kMaxOps) {
    gb.ops[gb.count++] = g;
  } else {
    // Beyond the buffer: numbered and recorded now so sequence numbers stay aligned.
    AssignSequence(&g);
    g.op.state = trace::OpState::Unmonitored;
    rt.ring().Record(g.op);
    ++gb.dropped;
  }
  return r;
}

ncclResult_t LaunchGroup(Runtime& rt, ThreadState& ts, RealCall real) {
  AttachThread(rt, ts);
  GroupBuffer* gb = ts.group.get();
  int n = gb ? gb->count : 0;
  if (gb) {
    gb->count = 0;
    gb->dropped = 0;
  }
  return LaunchBatch(rt, ts, gb ? gb->ops : nullptr, n, "ncclGroupEnd", MonoNs(), real);
}

void SettleNonblocking(Runtime& rt, CommInfo* comm, ncclResult_t async_state) {
  if (async_state == ncclInProgress) return;
  std::vector<PendingLaunch> ready;
  {
    std::lock_guard<std::mutex> lock(g_nonblocking_mu);
    for (auto it = g_nonblocking.begin(); it != g_nonblocking.end();) {
      if (it->comm == comm) {
        ready.push_back(std::move(*it));
        it = g_nonblocking.erase(it);
      } else {
        ++it;
      }
    }
  }
  GpuMarkers* markers = rt.markers();
  for (auto& p : ready) {
    bool ok = async_state == ncclSuccess && markers->End(p.marker, reinterpret_cast<CUstream>(p.stream));
    if (ok) p.marker->refs.store(static_cast<int>(p.items.size()), std::memory_order_relaxed);
    for (auto& item : p.items) {
      if (!ok) {
        rt.ring().SetState(item.index, async_state == ncclSuccess ? trace::OpState::Unmonitored
                                                                     : trace::OpState::Error);
        continue;
      }
      if (!rt.watchdog().Submit(item)) {
        markers->Release(p.marker);
        rt.ring().SetState(item.index, trace::OpState::Unmonitored);
      }
    }
    if (!ok && async_state != ncclSuccess) markers->Abandon(p.marker);
  }
}

}  // namespace ncclwatch
