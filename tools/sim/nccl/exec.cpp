// The "GPU" side: host functions that run on the caller's stream and move the data through
// the communicator's shared segment.
#include <time.h>

#include <algorithm>
#include <cstring>

#include "comm.h"
#include "fault.h"
#include "reduce.h"

namespace simnccl {

namespace {

std::atomic<uint32_t>& Doorbell(ncclComm* c) { return c->seg.rank(c->rank).doorbell; }

void Ring(ncclComm* c, int peer) {
  auto& bell = c->seg.rank(peer).doorbell;
  bell.fetch_add(1, std::memory_order_acq_rel);
  FutexWakeAll(&bell);
}

uint64_t NowMs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000 + uint64_t(ts.tv_nsec) / 1000000;
}

bool IsP2p(OpKind k) { return ncclwatch::trace::IsPointToPoint(k); }

// ---- collectives -------------------------------------------------------------------------
//
// Each rank contributes a byte array (its send buffer, or nothing) of the same length L. It
// goes through the segment in chunks of slot_bytes: per chunk every rank copies its part into
// its own slot, passes the barrier, then reads what it needs from all slots. Slots alternate
// between two parities, so one barrier per chunk suffices: a rank can only overwrite a slot
// of round k after passing round k+1, which every rank enters after it finished reading k.

struct Plan {
  size_t esz = 0;
  size_t block = 0;   // count * esz: the per-rank unit of the operation
  size_t length = 0;  // contribution L
  bool contributes = false;
};

Plan MakePlan(const Op& op, int me, int n) {
  Plan p;
  p.esz = DtypeSize(op.dtype);
  p.block = op.count * p.esz;
  switch (op.kind) {
    case OpKind::ReduceScatter:
    case OpKind::AlltoAll:
      p.length = p.block * n;
      p.contributes = true;
      break;
    case OpKind::Scatter:
      p.length = p.block * n;
      p.contributes = me == op.root;
      break;
    case OpKind::Broadcast:
      p.length = p.block;
      p.contributes = me == op.root;
      break;
    default:  // AllReduce, Reduce, AllGather, Gather
      p.length = p.block;
      p.contributes = true;
      break;
  }
  return p;
}

// Consumes chunk [off, off+len) of every rank's contribution (src[r]).
void Consume(const Op& op, const Plan& p, int me, int n, size_t off, size_t len,
             std::vector<const void*>& src) {
  char* dst = static_cast<char*>(op.recv);
  auto reduce = [&](char* out, const void* const* in, size_t bytes) {
    Reduce(op.dtype, op.reduce_code, op.scalar, out, in, n, bytes / p.esz);
  };
  switch (op.kind) {
    case OpKind::AllReduce:
      return reduce(dst + off, src.data(), len);
    case OpKind::Reduce:
      if (me == op.root) reduce(dst + off, src.data(), len);
      return;
    case OpKind::Broadcast:
      memcpy(dst + off, src[op.root], len);
      return;
    case OpKind::Gather:
      if (me != op.root) return;
      [[fallthrough]];
    case OpKind::AllGather:
      for (int r = 0; r < n; ++r) memcpy(dst + r * p.block + off, src[r], len);
      return;
    default:
      break;
  }
  // ReduceScatter, AlltoAll, Scatter: only my block [me*block, (me+1)*block) of each
  // contribution concerns me.
  size_t lo = std::max(off, me * p.block), hi = std::min(off + len, (me + 1) * p.block);
  if (lo >= hi) return;
  size_t at = lo - me * p.block, skip = lo - off, bytes = hi - lo;
  if (op.kind == OpKind::ReduceScatter) {
    std::vector<const void*> shifted(n);
    for (int r = 0; r < n; ++r) shifted[r] = static_cast<const char*>(src[r]) + skip;
    reduce(dst + at, shifted.data(), bytes);
  } else if (op.kind == OpKind::AlltoAll) {
    for (int r = 0; r < n; ++r)
      memcpy(dst + r * p.block + at, static_cast<const char*>(src[r]) + skip, bytes);
  } else {  // Scatter
    memcpy(dst + at, static_cast<const char*>(src[op.root]) + skip, bytes);
  }
}

void RunCollective(const Op& op) {
  ncclComm* c = op.comm;
  if (c->stop.load()) return;
  const uint64_t seq = ++c->exec_seq;
  if (FindFault(FaultKind::kStall, GlobalRank(), c->index, seq)) {
    Log("fault stall: comm %d seq %llu never completes", c->index, (unsigned long long)seq);
    return WaitUntilStopped(c);
  }
  const int n = c->nranks, me = c->rank;
  const Plan p = MakePlan(op, me, n);
  const OpSig sig{seq, op.count, static_cast<int32_t>(op.kind), op.dtype, op.redop, op.root};
  const size_t slot = c->seg.hdr->slot_bytes;
  const size_t rounds = std::max<size_t>(1, (p.length + slot - 1) / slot);
  const char* mine = static_cast<const char*>(op.send);
  std::vector<const void*> src(n);
  for (size_t k = 0; k < rounds; ++k) {
    const size_t off = k * slot, len = std::min(slot, p.length - off);
    const int parity = static_cast<int>(c->coll_round & 1);
    c->seg.slot(parity, me)->sig = sig;
    if (p.contributes && len) memcpy(c->seg.slot_data(parity, me), mine + off, len);
    if (!BarrierWait(c->seg.hdr->coll, n, &c->coll_round, c->stop)) return;
    if (k == 0) {
      for (int r = 0; r < n; ++r) {
        const OpSig& other = c->seg.slot(parity, r)->sig;
        if (other == sig) continue;
        // Real NCCL does not detect this either: it hangs (or corrupts data). Hang.
        Log("mismatch on comm %d seq %llu: rank %d has seq %llu kind %d count %llu dtype %d "
            "redop %d root %d, this rank kind %d count %llu dtype %d redop %d root %d; hanging",
            c->index, (unsigned long long)seq, r, (unsigned long long)other.seq, other.kind,
            (unsigned long long)other.count, other.dtype, other.redop, other.root, sig.kind,
            (unsigned long long)sig.count, sig.dtype, sig.redop, sig.root);
        return WaitUntilStopped(c);
      }
    }
    for (int r = 0; r < n; ++r) src[r] = c->seg.slot_data(parity, r);
    Consume(op, p, me, n, off, len, src);
  }
}

// ---- point to point ----------------------------------------------------------------------
//
// Pipe src->dst carries, per message, an 8-byte length then the payload. A Send is done
// when the receiver has consumed its last byte, so an unmatched Send never completes
// (rendezvous), whatever its size. All Send/Recv of a batch progress together.

constexpr size_t kHdr = sizeof(uint64_t);

void PipeWrite(char* ring, size_t cap, uint64_t pos, const void* src, size_t n) {
  size_t o = pos % cap, a = std::min(n, cap - o);
  memcpy(ring + o, src, a);
  memcpy(ring, static_cast<const char*>(src) + a, n - a);
}

void PipeRead(const char* ring, size_t cap, uint64_t pos, void* dst, size_t n) {
  size_t o = pos % cap, a = std::min(n, cap - o);
  memcpy(dst, ring + o, a);
  memcpy(static_cast<char*>(dst) + a, ring, n - a);
}

struct P2p {
  const Op* op;
  size_t bytes;
  int phase = 0;     // 0: length, 1: payload, 2: (send) waiting for the receiver, 3: done
  size_t done = 0;   // payload bytes moved
  uint64_t end = 0;  // (send) pipe position after the last payload byte
  bool hung = false; // length mismatch: never completes
};

// One step; true if anything moved. `first` is false when an earlier op of the batch on the
// same pipe has not finished its part of the byte stream yet.
bool StepSend(P2p& s, bool first) {
  ncclComm* c = s.op->comm;
  const int peer = s.op->root;
  PipeCtl& pc = c->seg.pipe(c->rank, peer);
  const size_t cap = c->seg.hdr->pipe_bytes;
  char* ring = c->seg.pipe_data(c->rank, peer);
  if (s.phase == 2) {
    if (pc.tail.load(std::memory_order_acquire) < s.end) return false;
    s.phase = 3;
    return true;
  }
  if (!first) return false;
  uint64_t head = pc.head.load(std::memory_order_relaxed);
  const size_t space = cap - (head - pc.tail.load(std::memory_order_acquire));
  bool moved = false;
  size_t room = space;
  if (s.phase == 0 && room >= kHdr) {
    uint64_t len = s.bytes;
    PipeWrite(ring, cap, head, &len, kHdr);
    head += kHdr;
    room -= kHdr;
    s.phase = 1;
    moved = true;
  }
  if (s.phase == 1) {
    size_t n = std::min(room, s.bytes - s.done);
    if (n) {
      PipeWrite(ring, cap, head, static_cast<const char*>(s.op->send) + s.done, n);
      head += n;
      s.done += n;
      moved = true;
    }
    if (s.done == s.bytes) {
      s.end = head;
      s.phase = 2;
    }
  }
  if (moved) {
    pc.head.store(head, std::memory_order_release);
    Ring(c, peer);
  }
  return moved;
}

bool StepRecv(P2p& r, bool first) {
  if (!first || r.hung) return false;
  ncclComm* c = r.op->comm;
  const int peer = r.op->root;
  PipeCtl& pc = c->seg.pipe(peer, c->rank);
  const size_t cap = c->seg.hdr->pipe_bytes;
  const char* ring = c->seg.pipe_data(peer, c->rank);
  uint64_t tail = pc.tail.load(std::memory_order_relaxed);
  size_t avail = pc.head.load(std::memory_order_acquire) - tail;
  bool moved = false;
  if (r.phase == 0 && avail >= kHdr) {
    uint64_t len = 0;
    PipeRead(ring, cap, tail, &len, kHdr);
    if (len != r.bytes) {
      Log("recv from %d on comm %d expects %zu bytes, the matching send has %llu; hanging", peer,
          c->index, r.bytes, (unsigned long long)len);
      r.hung = true;
      return false;
    }
    tail += kHdr;
    avail -= kHdr;
    r.phase = 1;
    moved = true;
  }
  if (r.phase == 1) {
    size_t n = std::min(avail, r.bytes - r.done);
    if (n) {
      PipeRead(ring, cap, tail, static_cast<char*>(r.op->recv) + r.done, n);
      tail += n;
      r.done += n;
      moved = true;
    }
    if (r.done == r.bytes) r.phase = 3;
  }
  if (moved) {
    pc.tail.store(tail, std::memory_order_release);
    Ring(c, peer);
  }
  return moved;
}

void RunP2p(const std::vector<const Op*>& ops) {
  std::vector<P2p> st;
  for (const Op* op : ops) st.push_back(P2p{op, op->count * DtypeSize(op->dtype)});
  std::vector<std::pair<const ncclComm*, int>> busy_send, busy_recv;  // pipes in use this pass
  auto claim = [](std::vector<std::pair<const ncclComm*, int>>& busy, const ncclComm* c, int peer) {
    auto key = std::make_pair(c, peer);
    if (std::find(busy.begin(), busy.end(), key) != busy.end()) return false;
    busy.push_back(key);
    return true;
  };
  for (;;) {
    // Read my doorbell before looking at the pipes: a change after this wakes the wait below.
    ncclComm* waitc = nullptr;
    bool several = false;
    for (const P2p& s : st) {
      if (s.phase == 3) continue;
      if (waitc && waitc != s.op->comm) several = true;
      if (!waitc) waitc = s.op->comm;
    }
    if (!waitc) return;  // all done
    for (const P2p& s : st)
      if (s.op->comm->stop.load()) return;
    const uint32_t bell = Doorbell(waitc).load(std::memory_order_acquire);
    bool moved = false;
    busy_send.clear();
    busy_recv.clear();
    for (P2p& s : st) {
      if (s.phase == 3) continue;
      if (s.op->kind == OpKind::Send) {
        // A later send on the same pipe may start once this one has written everything.
        bool first = s.phase == 2 || claim(busy_send, s.op->comm, s.op->root);
        moved |= StepSend(s, first);
      } else {
        moved |= StepRecv(s, claim(busy_recv, s.op->comm, s.op->root));
      }
    }
    // Progress on several communicators cannot wait on one doorbell: wait briefly instead.
    if (!moved) FutexWait(&Doorbell(waitc), bell, several ? 2 : 200);
  }
}

void RunKernel(ncclComm* c, int ms) {
  Log("fault kernel: the stream runs a %d ms kernel", ms);
  SleepUnlessStopped(c, ms);
}

void RunBatch(void* arg) {
  auto* b = static_cast<Batch*>(arg);
  if (b->kernel_before_ms) RunKernel(b->kernel_comm, b->kernel_before_ms);
  std::vector<ncclComm*> comms;
  for (const Op& op : b->ops) comms.push_back(op.comm);
  std::sort(comms.begin(), comms.end());
  comms.erase(std::unique(comms.begin(), comms.end()), comms.end());
  for (ncclComm* c : comms) c->exec_mu.lock();  // address order: no lock-order inversion
  // Collectives in call order, then all Send/Recv together. Every rank issues the same
  // collectives, so running them first cannot block a peer's p2p.
  std::vector<const Op*> p2p;
  for (const Op& op : b->ops) {
    if (IsP2p(op.kind)) p2p.push_back(&op);
    else RunCollective(op);
  }
  if (!p2p.empty()) RunP2p(p2p);
  for (auto it = comms.rbegin(); it != comms.rend(); ++it) (*it)->exec_mu.unlock();
  if (b->kernel_after_ms) RunKernel(b->kernel_comm, b->kernel_after_ms);
  if (b->persistent) return;
  for (const Op& op : b->ops) {
    {
      std::lock_guard<std::mutex> lk(op.comm->life_mu);
      --op.comm->inflight;
    }
    op.comm->life_cv.notify_all();
    Unref(op.comm);
  }
  if (b->kernel_comm) Unref(b->kernel_comm);
  delete b;
}

}  // namespace

ncclResult_t LaunchBatch(Batch* b) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (cuStreamIsCapturing(b->stream, &status) != CUDA_SUCCESS) status = CU_STREAM_CAPTURE_STATUS_NONE;
  // Captured host functions run at every graph launch, with the same argument.
  b->persistent = status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
  for (const Op& op : b->ops) {
    op.comm->refs.fetch_add(1);
    if (!b->persistent) {
      std::lock_guard<std::mutex> lk(op.comm->life_mu);
      ++op.comm->inflight;
    }
  }
  if (b->kernel_comm) b->kernel_comm->refs.fetch_add(1);
  if (cuLaunchHostFunc(b->stream, RunBatch, b) == CUDA_SUCCESS) return ncclSuccess;
  Log("cuLaunchHostFunc failed");
  for (const Op& op : b->ops) {
    if (!b->persistent) {
      std::lock_guard<std::mutex> lk(op.comm->life_mu);
      --op.comm->inflight;
    }
    Unref(op.comm);
  }
  if (b->kernel_comm) Unref(b->kernel_comm);
  delete b;
  return ncclUnhandledCudaError;
}

void WakeAll(ncclComm* c) {
  if (!c->seg.hdr) return;
  FutexWakeAll(&c->seg.hdr->coll.released);
  FutexWakeAll(&c->seg.hdr->ctl.released);
  FutexWakeAll(&c->seg.hdr->ready);
  if (c->rank >= 0) FutexWakeAll(&Doorbell(c));
  c->life_cv.notify_all();
}

void WaitUntilStopped(ncclComm* c) { SleepUnlessStopped(c, -1); }

void SleepUnlessStopped(ncclComm* c, int ms) {
  const uint64_t deadline = NowMs() + static_cast<uint64_t>(ms < 0 ? 0 : ms);
  for (;;) {
    if (c->stop.load()) return;
    uint64_t now = NowMs();
    if (ms >= 0 && now >= deadline) return;
    int wait = ms < 0 ? 200 : static_cast<int>(std::min<uint64_t>(200, deadline - now));
    if (c->seg.hdr && c->rank >= 0) {
      FutexWait(&Doorbell(c), Doorbell(c).load(), wait);  // WakeAll() rings this on abort
    } else {
      struct timespec ts = {0, wait * 1000000L};
      nanosleep(&ts, nullptr);
    }
  }
}

void Unref(ncclComm* c) {
  if (c->refs.fetch_sub(1) == 1) UnmapSegment(&c->seg);
}

}  // namespace simnccl
