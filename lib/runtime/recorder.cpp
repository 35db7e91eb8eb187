#include "runtime/recorder.h"

#include "common/clock.h"
#include "common/log.h"
#include "common/real_nccl.h"

namespace ncclwatch {
namespace {

constexpr int kMaxGroupStreams = 64;

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

}  // namespace

CommInfo* Recorder::Communicator(const void* handle) {
  if (!handle) return nullptr;
  if (CommInfo* c = p_.comms->Lookup(handle)) return c;
  auto info = std::make_unique<CommInfo>();
  info->handle = handle;
  info->id = Fnv1a64(&handle, sizeof handle) ^ static_cast<uint64_t>(p_.identity->pid);
  info->created_ns = MonoNs();
  auto comm = static_cast<ncclComm_t>(const_cast<void*>(handle));
  if (Real().ncclCommCount) Real().ncclCommCount(comm, &info->size);
  if (Real().ncclCommUserRank) Real().ncclCommUserRank(comm, &info->rank);
  LogInfo("operation on a communicator created without ncclwatch; its id is local to this process");
  return p_.comms->Register(std::move(info));
}

ncclResult_t Recorder::Launch(ThreadSlot* slot, GroupedOp* ops, int n, const char* function, uint64_t now,
                              RealCall real) {
  FlightRing& ring = *p_.ring;
  InNcclScope scope(slot, function, now);
  for (int i = 0; i < n; ++i) {
    AssignSequence(&ops[i]);
    ops[i].op.state = trace::OpState::Enqueued;
    ring.Record(ops[i].op);
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
  int stream_of[kMaxGroupOps];
  GpuMarkers* markers = p_.markers;
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
    for (int i = 0; i < n; ++i) {
      ring.SetResult(ops[i].op.index, r);
      ring.SetState(ops[i].op.index, trace::OpState::Error);
    }
    p_.policy->OnNcclError(function, r, n > 0 ? ops[0].comm : nullptr, false, n > 0 ? &ops[0].op : nullptr);
    return r;
  }
  for (int m = 0; m < nmarks; ++m) {
    StreamMark& sm = marks[m];
    if (!sm.marker) continue;
    if (sm.result == MarkResult::kCapturedWatched) {
      // The end record goes into the capture now, or never: the marker is the graph's either way.
      if (r == ncclInProgress || !markers->EndCaptured(sm.marker, reinterpret_cast<CUstream>(sm.stream))) {
        sm.marker = nullptr;
        sm.result = MarkResult::kCaptured;
      }
      continue;
    }
    if (r == ncclInProgress) continue;  // the end marker goes in once NCCL confirms the launch
    if (!markers->End(sm.marker, reinterpret_cast<CUstream>(sm.stream))) {
      sm.marker = nullptr;
      sm.result = MarkResult::kUnmonitored;
      continue;
    }
    sm.marker->refs.store(sm.ops, std::memory_order_relaxed);
  }
  // Operations without a marker are captured or unmonitored from here on.
  Marker* marker_of[kMaxGroupOps];
  for (int i = 0; i < n; ++i) {
    int m = stream_of[i];
    const bool watched = m >= 0 && marks[m].result == MarkResult::kCapturedWatched;
    marker_of[i] = m >= 0 && !watched ? marks[m].marker : nullptr;
    if (marker_of[i]) continue;
    trace::OpState state = watched ? trace::OpState::Captured
                                   : StateFor(m >= 0 ? marks[m].result : MarkResult::kUnmonitored);
    ring.SetState(ops[i].op.index, state);
    // A collective captured into a CUDA graph is launched by every replay: its capture-time
    // sequence number counts as reached and completed at capture (every rank captures the same
    // operations). Its replays are followed by the watchdog when it is watched.
    if (state == trace::OpState::Captured && ops[i].comm && !trace::IsPointToPoint(ops[i].op.kind)) {
      StoreMax(ops[i].comm->live().last_gpu_reached, ops[i].op.seq);
      StoreMax(ops[i].comm->live().last_completed, ops[i].op.seq);
    }
    if (watched) {
      // Shared by the group's operations on that stream: each is followed (the watchdog never
      // gives a captured marker back). A full queue leaves it unwatched, as before.
      if (!p_.watchdog->Submit(InflightItem::Of(ops[i].op, ops[i].comm, marks[m].marker, /*captured=*/true)))
        LogDebug("a captured operation is not watched: the watchdog's queue is full");
    }
  }
  if (r == ncclInProgress) {
    p_.pending->Defer(ops, marker_of, n);
    return r;
  }
  for (int i = 0; i < n; ++i) {
    if (!marker_of[i]) continue;
    if (!p_.watchdog->Submit(InflightItem::Of(ops[i].op, ops[i].comm, marker_of[i]))) {
      markers->Release(marker_of[i]);
      ring.SetState(ops[i].op.index, trace::OpState::Unmonitored);
    }
  }
  return r;
}

void Recorder::RecordUnfollowed(GroupedOp* g) {
  AssignSequence(g);  // numbered now, so that sequence numbers stay aligned across ranks
  g->op.state = trace::OpState::Unmonitored;
  p_.ring->Record(g->op);
}

void Recorder::Failed(const char* function, ncclResult_t r, const CommInfo* comm, bool async) {
  p_.policy->OnNcclError(function, r, comm, async);
}

CommInfo* Recorder::AddCommunicator(std::unique_ptr<CommInfo> info) {
  int size = info->size, rank = info->rank;
  const uint64_t id = info->id;
  CommInfo* c = p_.comms->Register(std::move(info));
  ProcessRank& r = *p_.rank;
  const int env_world_size = p_.identity->env_world_size;
  if (env_world_size < 0 && size > r.world_size.load()) r.world_size.store(size);
  if (env_world_size < 0 || size == env_world_size) {
    // No rank in the environment: the first such communicator names the process. One that
    // drives several ranks of it (several devices, created in one group in any order) is named
    // by the lowest of them.
    std::lock_guard<std::mutex> lock(naming_mu_);
    const int cur = r.global.load();
    if (cur < 0 || (p_.identity->env_rank < 0 && id == named_by_ && rank >= 0 && rank < cur)) {
      r.global.store(rank);
      named_by_ = id;
      SetLogRank(rank);
    }
  }
  if (p_.box) p_.box->SetRank(r.global.load(), r.world_size.load());
  return c;
}

void Recorder::Aborted(CommInfo* comm) {
  if (comm) {
    comm->live().state.store(CommState::Aborted);
    comm->live().ended_ns.store(MonoNs());
  }
  p_.policy->OnAbort(comm);
}

uint64_t Recorder::BeginInit(const char* function, uint64_t id, int size, int rank) {
  return p_.watchdog->setups().Begin(function, id, size, rank, MonoNs());
}

void Recorder::EndInit(uint64_t token) { p_.watchdog->setups().End(token); }

}  // namespace ncclwatch
