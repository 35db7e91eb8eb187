// The exported NCCL API of the simulator: communicator life cycle, groups, argument checks,
// host-side fault injection and the background thread of non-blocking communicators.
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <thread>

#include "comm.h"
#include "fault.h"
#include "reduce.h"

#define SIM_API extern "C" __attribute__((visibility("default")))

namespace simnccl {

// ---- process-wide state --------------------------------------------------------------------

namespace {

std::atomic<int> g_comm_count{0};
std::atomic<int> g_first_rank{-1};
thread_local std::string t_last_error;

int EnvInt(const char* name, int dflt) {
  const char* v = getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  long x = strtol(v, &end, 10);
  return (*end == '\0' && x >= 0 && x <= INT32_MAX) ? static_cast<int>(x) : dflt;
}

ncclResult_t Fail(ncclResult_t r, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
ncclResult_t Fail(ncclResult_t r, const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  t_last_error = buf;
  Log("error %d: %s", static_cast<int>(r), buf);
  return r;
}

}  // namespace

int GlobalRank() {
  static const int env_rank = EnvInt("RANK", -1);
  return env_rank >= 0 ? env_rank : g_first_rank.load();
}

bool LogEnabled() {
  static const bool on = [] {
    const char* v = getenv("NCCLWATCH_SIM_LOG");
    return v && *v && strcmp(v, "0") != 0;
  }();
  return on;
}

void Log(const char* fmt, ...) {
  if (!LogEnabled()) return;
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "ncclsim[rank %d pid %d]: %s\n", GlobalRank(), static_cast<int>(getpid()), buf);
}

namespace {

// ---- unique ids and communicator keys ------------------------------------------------------

constexpr uint64_t kIdMagic = 0x444955534c43434eull;  // "NCCLSUID"
struct IdData {
  uint64_t magic;
  uint64_t key;
  char session[96];
};
static_assert(sizeof(IdData) <= NCCL_UNIQUE_ID_BYTES, "the id must fit ncclUniqueId");

uint64_t Mix(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Same on every member without communication: parent key, kind of derivation, the parent's
// derivation counter and the color (split) or the excluded set (shrink).
uint64_t DeriveKey(uint64_t parent, char tag, uint64_t counter, uint64_t what) {
  return Mix(Mix(Mix(parent ^ static_cast<uint64_t>(tag)) ^ counter) ^ what);
}

// Segment names allow [A-Za-z0-9_.]; anything else in a user-given session becomes '_'.
std::string DefaultSession() {
  if (const char* s = getenv("NCCLWATCH_SIM_SESSION"); s && *s) {
    std::string out;
    for (const char* p = s; *p && out.size() < sizeof(IdData::session) - 1; ++p)
      out += (isalnum(static_cast<unsigned char>(*p)) || *p == '_' || *p == '.') ? *p : '_';
    return out;
  }
  return "u" + std::to_string(getuid()) + "p" + std::to_string(getpid());
}

// ---- communicators ---------------------------------------------------------------------------

ncclComm* NewComm(int rank, int nranks, uint64_t key, const std::string& session, bool blocking,
                  int cudev) {
  auto* c = new ncclComm;
  c->rank = rank;
  c->nranks = nranks;
  c->key = key;
  c->session = session;
  c->blocking = blocking;
  c->cudev = cudev;
  c->index = g_comm_count.fetch_add(1);
  return c;
}

void NoteFirstRank(int rank) {
  int expected = -1;
  g_first_rank.compare_exchange_strong(expected, rank);
}

bool ConfigBlocking(const ncclConfig_t* cfg, bool dflt) {
  if (!cfg || cfg->size < offsetof(ncclConfig_t, blocking) + sizeof(int)) return dflt;
  return cfg->blocking == NCCL_CONFIG_UNDEF_INT ? dflt : cfg->blocking != 0;
}

int CurrentDevice() {
  CUdevice d = 0;
  return cuCtxGetDevice(&d) == CUDA_SUCCESS ? d : 0;
}

void SetInitState(ncclComm* c, ncclResult_t r) {
  {
    std::lock_guard<std::mutex> lk(c->life_mu);
    c->init_state.store(r);
  }
  c->life_cv.notify_all();
}

// Maps the segment and registers this rank. The last rank to attach unlinks the name: from
// then on nothing of the communicator is visible in /dev/shm.
ncclResult_t Attach(ncclComm* c) {
  std::string err, name = SegmentName(c->session, c->key);
  if (!MapSegment(name, c->nranks, c->stop, &c->seg, &err)) {
    SetInitState(c, ncclSystemError);
    return Fail(ncclSystemError, "communicator init: %s", err.c_str());
  }
  int32_t none = 0;
  if (!c->seg.rank(c->rank).pid.compare_exchange_strong(none, static_cast<int32_t>(getpid()))) {
    SetInitState(c, ncclInvalidUsage);
    return Fail(ncclInvalidUsage, "rank %d of %d joined the communicator twice", c->rank, c->nranks);
  }
  ShmHeader* h = c->seg.hdr;
  if (h->attached.fetch_add(1) + 1 == static_cast<uint32_t>(c->nranks)) {
    shm_unlink(name.c_str());
    h->ready.store(1, std::memory_order_release);
    FutexWakeAll(&h->ready);
  }
  Log("comm %d: rank %d of %d attached to %s", c->index, c->rank, c->nranks, name.c_str());
  return ncclSuccess;
}

// Blocks until every rank attached (as ncclCommInitRank does).
ncclResult_t WaitReady(ncclComm* c) {
  while (c->seg.hdr->ready.load(std::memory_order_acquire) == 0) {
    if (c->stop.load()) {
      SetInitState(c, ncclInvalidUsage);
      return Fail(ncclInvalidUsage, "communicator aborted during init");
    }
    FutexWait(&c->seg.hdr->ready, 0, 200);
  }
  SetInitState(c, ncclSuccess);
  return ncclSuccess;
}

ncclResult_t Rendezvous(ncclComm* c) {
  ncclResult_t r = Attach(c);
  return r == ncclSuccess ? WaitReady(c) : r;
}

// Waits until a communicator's init finished; returns its outcome.
ncclResult_t WaitInit(ncclComm* c) {
  std::unique_lock<std::mutex> lk(c->life_mu);
  c->life_cv.wait(lk, [c] { return c->init_state.load() != ncclInProgress || c->stop.load(); });
  int s = c->init_state.load();
  return s == ncclInProgress ? ncclInvalidUsage : static_cast<ncclResult_t>(s);
}

void JobDone(ncclComm* c) {
  {
    std::lock_guard<std::mutex> lk(c->life_mu);
    c->async_jobs.fetch_sub(1);
  }
  c->life_cv.notify_all();
}

// Runs `work` now (blocking communicator) or on a thread of its own, returning ncclInProgress
// until it is done (non-blocking). `keep` are held alive meanwhile.
ncclResult_t RunMaybeAsync(bool blocking, ncclComm* track, std::vector<ncclComm*> keep,
                           std::function<ncclResult_t()> work) {
  if (blocking) return work();
  for (ncclComm* c : keep) c->refs.fetch_add(1);
  track->async_jobs.fetch_add(1);
  std::thread([track, keep, work] {
    work();
    JobDone(track);
    for (ncclComm* c : keep) Unref(c);
  }).detach();
  return ncclInProgress;
}

void ReleaseOwner(ncclComm* c) {
  if (!c->owner_released.exchange(true)) Unref(c);
}

// Host-side all-gather of up to kCtlSlotBytes per rank over the control barrier.
ncclResult_t CtlAllGather(ncclComm* c, const void* mine, size_t bytes, void* all) {
  std::lock_guard<std::mutex> lk(c->host_mu);
  const int parity = static_cast<int>(c->ctl_round & 1);
  memcpy(c->seg.ctl_slot(parity, c->rank), mine, bytes);
  if (!BarrierWait(c->seg.hdr->ctl, c->nranks, &c->ctl_round, c->stop))
    return Fail(ncclInvalidUsage, "communicator aborted during a split");
  for (int r = 0; r < c->nranks; ++r)
    memcpy(static_cast<char*>(all) + r * bytes, c->seg.ctl_slot(parity, r), bytes);
  return ncclSuccess;
}

ncclResult_t CheckUsable(ncclComm* c, const char* fn) {
  if (!c) return Fail(ncclInvalidArgument, "%s: comm is NULL", fn);
  if (c->closed.load()) return Fail(ncclInvalidUsage, "%s: communicator was destroyed, aborted or revoked", fn);
  int s = c->init_state.load();
  if (s != ncclSuccess && s != ncclInProgress) return Fail(static_cast<ncclResult_t>(s), "%s: communicator init failed", fn);
  return ncclSuccess;
}

// ---- non-blocking launches -------------------------------------------------------------------

// One FIFO thread launches the groups of non-blocking communicators, in call order.
struct AsyncQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> jobs;
};

AsyncQueue& Queue() {
  // Leaked on purpose, and the thread detached: the process may exit at any moment.
  static AsyncQueue* q = [] {
    auto* queue = new AsyncQueue;
    std::thread([queue] {
      for (;;) {
        std::function<void()> job;
        {
          std::unique_lock<std::mutex> lk(queue->mu);
          queue->cv.wait(lk, [queue] { return !queue->jobs.empty(); });
          job = std::move(queue->jobs.front());
          queue->jobs.pop_front();
        }
        job();
      }
    }).detach();
    return queue;
  }();
  return *q;
}

// ---- groups ----------------------------------------------------------------------------------

struct PendingOp {
  Op op;
  CUstream stream;
  int kernel_before_ms;
  int kernel_after_ms;
};

thread_local int t_depth = 0;
thread_local std::vector<PendingOp> t_ops;
thread_local std::vector<ncclComm*> t_inits;  // blocking inits issued inside the group

// -1 (forever) wins over any duration.
int MergeMs(int a, int b) { return (a < 0 || b < 0) ? -1 : std::max(a, b); }

ncclResult_t LaunchGroup(std::vector<PendingOp> ops) {
  if (ops.empty()) return ncclSuccess;
  std::vector<Batch*> batches;  // one per stream, in order of first use
  std::vector<ncclComm*> comms;
  bool async = false;
  for (PendingOp& p : ops) {
    auto it = std::find_if(batches.begin(), batches.end(), [&](Batch* b) { return b->stream == p.stream; });
    Batch* b = it != batches.end() ? *it : batches.emplace_back(new Batch);
    b->stream = p.stream;
    b->ops.push_back(p.op);
    if (p.kernel_before_ms || p.kernel_after_ms) {
      b->kernel_before_ms = p.kernel_before_ms ? MergeMs(b->kernel_before_ms, p.kernel_before_ms) : b->kernel_before_ms;
      b->kernel_after_ms = p.kernel_after_ms ? MergeMs(b->kernel_after_ms, p.kernel_after_ms) : b->kernel_after_ms;
      b->kernel_comm = p.op.comm;
    }
    if (std::find(comms.begin(), comms.end(), p.op.comm) == comms.end()) comms.push_back(p.op.comm);
    async |= !p.op.comm->blocking;
  }
  if (!async) {
    ncclResult_t res = ncclSuccess;
    for (Batch* b : batches) {
      ncclResult_t r = LaunchBatch(b);
      if (res == ncclSuccess) res = r;
    }
    return res;
  }
  // Non-blocking: return now; the queue thread launches shortly after, once every
  // communicator finished its init. ncclCommGetAsyncError says ncclInProgress until then.
  CUcontext ctx = nullptr;
  cuCtxGetCurrent(&ctx);
  for (ncclComm* c : comms) {
    c->refs.fetch_add(1);
    c->async_jobs.fetch_add(1);
  }
  AsyncQueue& q = Queue();
  {
    std::lock_guard<std::mutex> lk(q.mu);
    q.jobs.push_back([batches, comms, ctx] {
      if (ctx) cuCtxSetCurrent(ctx);
      bool ok = true;
      for (ncclComm* c : comms) ok &= WaitInit(c) == ncclSuccess;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      for (Batch* b : batches) {
        if (!ok || LaunchBatch(b) != ncclSuccess) {
          if (ok) Log("non-blocking launch failed");
          for (ncclComm* c : comms) {
            int none = ncclSuccess;
            c->async_error.compare_exchange_strong(none, ok ? ncclUnhandledCudaError : ncclInvalidUsage);
          }
          if (!ok) delete b;
        }
      }
      for (ncclComm* c : comms) {
        JobDone(c);
        Unref(c);
      }
    });
  }
  q.cv.notify_one();
  return ncclInProgress;
}

// Host-side faults at the call of collective `seq`. Returns ncclSuccess to go on.
ncclResult_t HostFaults(ncclComm* c, uint64_t seq, PendingOp* p) {
  const int rank = GlobalRank(), ci = c->index;
  auto seqs = static_cast<unsigned long long>(seq);
  if (const Fault* f = FindFault(FaultKind::kCrash, rank, ci, seq)) {
    Log("fault crash: comm %d seq %llu: raising %s", ci, seqs, f->signal == SIGSEGV ? "SIGSEGV" : "SIGKILL");
    fflush(nullptr);
    if (f->signal == SIGSEGV) {
      raise(SIGSEGV);  // an installed handler runs first, as for a real fault
      signal(SIGSEGV, SIG_DFL);
      raise(SIGSEGV);
    }
    kill(getpid(), SIGKILL);
    for (;;) pause();
  }
  if (FindFault(FaultKind::kAbort, rank, ci, seq)) {
    Log("fault abort: comm %d seq %llu: calling abort()", ci, seqs);
    fflush(nullptr);
    abort();
  }
  if (FindFault(FaultKind::kError, rank, ci, seq)) {
    c->async_error.store(ncclRemoteError);
    return Fail(ncclSystemError, "injected error (NCCLWATCH_SIM_FAULT) at comm %d seq %llu", ci, seqs);
  }
  if (const Fault* f = FindFault(FaultKind::kDelay, rank, ci, seq)) {
    Log("fault delay: comm %d seq %llu: host sleeps %d ms", ci, seqs, f->ms);
    SleepUnlessStopped(c, f->ms);
  }
  // The slow "kernel" for collective N runs after collective N-1 on the stream, so that it
  // also precedes any marker a wrapper records right before calling collective N.
  if (const Fault* f = FindFault(FaultKind::kKernel, rank, ci, seq + 1)) p->kernel_after_ms = f->ms;
  if (seq == 1) {
    if (const Fault* f = FindFault(FaultKind::kKernel, rank, ci, 1)) p->kernel_before_ms = f->ms;
  }
  return ncclSuccess;
}

bool Reduces(OpKind k) { return k == OpKind::AllReduce || k == OpKind::Reduce || k == OpKind::ReduceScatter; }
bool Rooted(OpKind k) {
  return k == OpKind::Broadcast || k == OpKind::Reduce || k == OpKind::Gather || k == OpKind::Scatter;
}

// Every data-moving call comes here.
ncclResult_t Issue(const char* fn, OpKind kind, const void* send, void* recv, size_t count,
                   ncclDataType_t dtype, int redop, int root, ncclComm* c, cudaStream_t stream) {
  if (ncclResult_t r = CheckUsable(c, fn)) return r;
  // A non-blocking split child learns its size only when the split finishes.
  if (c->nranks == 0 && WaitInit(c) != ncclSuccess) return Fail(ncclInvalidUsage, "%s: communicator init failed", fn);
  const size_t esz = DtypeSize(dtype);
  if (esz == 0) return Fail(ncclInvalidArgument, "%s: invalid datatype %d", fn, static_cast<int>(dtype));
  const size_t n = static_cast<size_t>(c->nranks);
  if (count > SIZE_MAX / esz / n) return Fail(ncclInvalidArgument, "%s: count %zu too large", fn, count);
  Op op;
  op.kind = kind;
  op.comm = c;
  op.send = send;
  op.recv = recv;
  op.count = count;
  op.dtype = dtype;
  if (Reduces(kind)) {
    op.redop = redop;
    if (redop >= ncclSum && redop <= ncclAvg) {
      op.reduce_code = redop;
    } else {
      std::lock_guard<std::mutex> lk(c->host_mu);
      size_t i = static_cast<size_t>(redop - kFirstUserRedOp);
      if (redop < kFirstUserRedOp || i >= c->premul_scalars.size())
        return Fail(ncclInvalidArgument, "%s: invalid reduction operation %d", fn, redop);
      op.reduce_code = kRedOpPreMulSum;
      op.scalar = c->premul_scalars[i];
    }
  }
  const bool p2p = kind == OpKind::Send || kind == OpKind::Recv;
  if (Rooted(kind) || p2p) {
    if (root < 0 || root >= c->nranks)
      return Fail(ncclInvalidArgument, "%s: %s %d out of range [0, %d)", fn, p2p ? "peer" : "root", root, c->nranks);
    op.root = root;
  }
  if (count > 0) {
    const bool is_root = c->rank == root;
    bool need_send = kind != OpKind::Recv && ((kind != OpKind::Broadcast && kind != OpKind::Scatter) || is_root);
    bool need_recv = kind != OpKind::Send && ((kind != OpKind::Reduce && kind != OpKind::Gather) || is_root);
    if ((need_send && !send) || (need_recv && !recv)) return Fail(ncclInvalidArgument, "%s: NULL buffer", fn);
  }
  PendingOp p{op, stream, 0, 0};
  if (!p2p) {
    if (ncclResult_t r = HostFaults(c, c->call_seq.fetch_add(1) + 1, &p)) return r;
  }
  if (t_depth > 0) {
    t_ops.push_back(p);
    return ncclSuccess;
  }
  std::vector<PendingOp> one{p};
  return LaunchGroup(std::move(one));
}

ncclResult_t InitRankCommon(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank,
                            const ncclConfig_t* cfg, const char* fn) {
  if (!out) return Fail(ncclInvalidArgument, "%s: comm is NULL", fn);
  IdData d;
  memcpy(&d, id.internal, sizeof d);
  if (d.magic != kIdMagic) return Fail(ncclInvalidArgument, "%s: not an id from ncclGetUniqueId", fn);
  d.session[sizeof d.session - 1] = '\0';
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return Fail(ncclInvalidArgument, "%s: rank %d / nranks %d invalid", fn, rank, nranks);
  const bool blocking = ConfigBlocking(cfg, true);
  ncclComm* c = NewComm(rank, nranks, d.key, d.session, blocking, CurrentDevice());
  NoteFirstRank(rank);
  *out = c;
  if (!blocking) {
    c->refs.fetch_add(1);
    std::thread([c] {
      Rendezvous(c);
      Unref(c);
    }).detach();
    return ncclInProgress;
  }
  if (ncclResult_t r = Attach(c)) return r;
  if (t_depth > 0) {  // the wait happens at the outermost ncclGroupEnd
    t_inits.push_back(c);
    return ncclSuccess;
  }
  return WaitReady(c);
}

const char* const kErrorStrings[] = {
    "no error", "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
    "unhandled system error (run with NCCL_DEBUG=INFO for details)",
    "internal error - please report this issue to the NCCL developers",
    "invalid argument (run with NCCL_DEBUG=WARN for details)",
    "invalid usage (run with NCCL_DEBUG=WARN for details)",
    "remote process exited or there was a network error", "NCCL operation in progress"};

}  // namespace
}  // namespace simnccl

using namespace simnccl;

// ---- exported API ----------------------------------------------------------------------------

SIM_API ncclResult_t ncclGetVersion(int* version) {
  if (!version) return Fail(ncclInvalidArgument, "ncclGetVersion: NULL");
  *version = EnvInt("NCCLWATCH_SIM_NCCL_VERSION", NCCL_VERSION_CODE);
  return ncclSuccess;
}

SIM_API const char* ncclGetErrorString(ncclResult_t result) {
  int i = static_cast<int>(result);
  return i >= 0 && i < static_cast<int>(sizeof kErrorStrings / sizeof *kErrorStrings) ? kErrorStrings[i]
                                                                                    : "unknown result code";
}

SIM_API const char* ncclGetLastError(ncclComm_t) { return t_last_error.c_str(); }

SIM_API ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (!uniqueId) return Fail(ncclInvalidArgument, "ncclGetUniqueId: NULL");
  IdData d{};
  d.magic = kIdMagic;
  if (getrandom(&d.key, sizeof d.key, 0) != static_cast<ssize_t>(sizeof d.key)) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    d.key = Mix(static_cast<uint64_t>(ts.tv_nsec) ^ (static_cast<uint64_t>(getpid()) << 32));
  }
  std::string s = DefaultSession();
  snprintf(d.session, sizeof d.session, "%s", s.c_str());
  memset(uniqueId, 0, sizeof *uniqueId);
  memcpy(uniqueId->internal, &d, sizeof d);
  return ncclSuccess;
}

SIM_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return InitRankCommon(comm, nranks, commId, rank, nullptr, "ncclCommInitRank");
}

SIM_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                            ncclConfig_t* config) {
  return InitRankCommon(comm, nranks, commId, rank, config, "ncclCommInitRankConfig");
}

// Only commIds[0] is used: one rendezvous point is plenty on one machine.
SIM_API ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                              ncclUniqueId* commIds, ncclConfig_t* config) {
  if (nId < 1 || !commIds) return Fail(ncclInvalidArgument, "ncclCommInitRankScalable: no ids");
  return InitRankCommon(newcomm, nranks, commIds[0], myrank, config, "ncclCommInitRankScalable");
}

// Single-process clique: ndev communicators in this process, one per "device".
SIM_API ncclResult_t ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (!comms || ndev < 1) return Fail(ncclInvalidArgument, "ncclCommInitAll: invalid arguments");
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  IdData d;
  memcpy(&d, id.internal, sizeof d);
  NoteFirstRank(0);
  for (int i = 0; i < ndev; ++i) {
    comms[i] = NewComm(i, ndev, d.key, d.session, true, devlist ? devlist[i] : i);
    if (ncclResult_t r = Attach(comms[i])) return r;
  }
  for (int i = 0; i < ndev; ++i) {
    if (ncclResult_t r = WaitReady(comms[i])) return r;
  }
  return ncclSuccess;
}

SIM_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                   ncclConfig_t* config) {
  if (ncclResult_t r = CheckUsable(comm, "ncclCommSplit")) return r;
  if (!newcomm) return Fail(ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) return Fail(ncclInvalidArgument, "ncclCommSplit: color %d", color);
  const bool blocking = ConfigBlocking(config, comm->blocking);
  uint64_t counter;
  {
    std::lock_guard<std::mutex> lk(comm->host_mu);
    counter = comm->derive_counter++;
  }
  // The child's rank and size are known after the exchange; its handle exists right away.
  ncclComm* child = color == NCCL_SPLIT_NOCOLOR ? nullptr : NewComm(-1, 0, 0, comm->session, blocking, comm->cudev);
  *newcomm = child;
  std::vector<ncclComm*> keep{comm};
  if (child) keep.push_back(child);
  const int myrank = comm->rank;
  return RunMaybeAsync(blocking, comm, keep, [comm, child, color, key, counter, myrank]() -> ncclResult_t {
    if (WaitInit(comm) != ncclSuccess) {
      if (child) SetInitState(child, ncclInvalidUsage);
      return Fail(ncclInvalidUsage, "ncclCommSplit: parent communicator not initialized");
    }
    struct Entry {
      int32_t color, key;
    } mine{color, key};
    std::vector<Entry> all(comm->nranks);
    if (ncclResult_t r = CtlAllGather(comm, &mine, sizeof mine, all.data())) {
      if (child) SetInitState(child, r);
      return r;
    }
    if (!child) return ncclSuccess;
    std::vector<std::pair<int, int>> members;  // (key, parent rank): NCCL's ordering
    for (int r = 0; r < comm->nranks; ++r)
      if (all[r].color == color) members.emplace_back(all[r].key, r);
    std::sort(members.begin(), members.end());
    child->nranks = static_cast<int>(members.size());
    child->rank = static_cast<int>(std::find(members.begin(), members.end(), std::make_pair(key, myrank)) - members.begin());
    child->key = DeriveKey(comm->key, 'S', counter, static_cast<uint64_t>(color));
    return Rendezvous(child);
  });
}

SIM_API ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                    ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  if (!comm || !newcomm || excludeRanksCount < 0 || (excludeRanksCount > 0 && !excludeRanksList))
    return Fail(ncclInvalidArgument, "ncclCommShrink: invalid arguments");
  if (comm->init_state.load() != ncclSuccess) return Fail(ncclInvalidUsage, "ncclCommShrink: parent not initialized");
  std::vector<int> excl(excludeRanksList, excludeRanksList + excludeRanksCount);
  std::sort(excl.begin(), excl.end());
  excl.erase(std::unique(excl.begin(), excl.end()), excl.end());
  for (int r : excl) {
    if (r < 0 || r >= comm->nranks) return Fail(ncclInvalidArgument, "ncclCommShrink: rank %d out of range", r);
    if (r == comm->rank) return Fail(ncclInvalidArgument, "ncclCommShrink: called by excluded rank %d", r);
  }
  if (static_cast<int>(excl.size()) >= comm->nranks) return Fail(ncclInvalidArgument, "ncclCommShrink: no rank left");
  if (shrinkFlags & NCCL_SHRINK_ABORT) {  // stop what is still running on the parent first
    comm->closed.store(true);
    comm->stop.store(true);
    WakeAll(comm);
  }
  uint64_t counter;
  {
    std::lock_guard<std::mutex> lk(comm->host_mu);
    counter = comm->derive_counter++;
  }
  uint64_t what = 0;
  for (int r : excl) what = Mix(what ^ static_cast<uint64_t>(r));
  const int below = static_cast<int>(std::lower_bound(excl.begin(), excl.end(), comm->rank) - excl.begin());
  ncclComm* child = NewComm(comm->rank - below, comm->nranks - static_cast<int>(excl.size()),
                            DeriveKey(comm->key, 'K', counter, what), comm->session,
                            ConfigBlocking(config, comm->blocking), comm->cudev);
  *newcomm = child;
  if (child->blocking) return Rendezvous(child);
  return RunMaybeAsync(false, child, {child}, [child] { return Rendezvous(child); });
}

SIM_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (ncclResult_t r = CheckUsable(comm, "ncclCommFinalize")) return r;
  // Flushes: waits until every operation issued on it has finished (or it is aborted).
  return RunMaybeAsync(comm->blocking, comm, {comm}, [comm, blocking = comm->blocking] {
    std::unique_lock<std::mutex> lk(comm->life_mu);
    const int own = blocking ? 0 : 1;  // this job counts itself in async_jobs
    while ((comm->inflight > 0 || comm->async_jobs.load() > own) && !comm->stop.load())
      comm->life_cv.wait_for(lk, std::chrono::milliseconds(200));
    return ncclSuccess;
  });
}

SIM_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return Fail(ncclInvalidArgument, "ncclCommDestroy: comm is NULL");
  comm->closed.store(true);
  ReleaseOwner(comm);  // operations still running keep the segment mapped
  return ncclSuccess;
}

SIM_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  Log("comm %d: abort", comm->index);
  comm->closed.store(true);
  comm->stop.store(true);
  WakeAll(comm);  // blocked host functions of this process return
  ReleaseOwner(comm);
  return ncclSuccess;
}

SIM_API ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags) {
  if (!comm) return Fail(ncclInvalidArgument, "ncclCommRevoke: comm is NULL");
  if (revokeFlags != NCCL_REVOKE_DEFAULT) return Fail(ncclInvalidArgument, "ncclCommRevoke: flags %d", revokeFlags);
  comm->closed.store(true);
  comm->stop.store(true);
  WakeAll(comm);
  return ncclSuccess;
}

SIM_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!comm || !asyncError) return Fail(ncclInvalidArgument, "ncclCommGetAsyncError: NULL");
  int e = comm->async_error.load(), s = comm->init_state.load();
  if (e != ncclSuccess) *asyncError = static_cast<ncclResult_t>(e);
  else if (s == ncclInProgress || comm->async_jobs.load() > 0) *asyncError = ncclInProgress;
  else *asyncError = static_cast<ncclResult_t>(s);
  return ncclSuccess;
}

SIM_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!comm || !count) return Fail(ncclInvalidArgument, "ncclCommCount: NULL");
  if (comm->nranks == 0) return ncclInProgress;  // non-blocking split not done yet
  *count = comm->nranks;
  return ncclSuccess;
}

SIM_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!comm || !rank) return Fail(ncclInvalidArgument, "ncclCommUserRank: NULL");
  if (comm->rank < 0) return ncclInProgress;
  *rank = comm->rank;
  return ncclSuccess;
}

SIM_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (!comm || !device) return Fail(ncclInvalidArgument, "ncclCommCuDevice: NULL");
  *device = comm->cudev;
  return ncclSuccess;
}

SIM_API ncclResult_t ncclGroupStart(void) {
  ++t_depth;
  return ncclSuccess;
}

namespace {
ncclResult_t EndGroup(bool launch, ncclSimInfo_t* sim) {
  if (t_depth == 0) return Fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--t_depth > 0) return ncclSuccess;
  std::vector<PendingOp> ops = std::move(t_ops);
  std::vector<ncclComm*> inits = std::move(t_inits);
  t_ops.clear();
  t_inits.clear();
  ncclResult_t res = ncclSuccess;
  for (ncclComm* c : inits) {
    ncclResult_t r = WaitReady(c);
    if (res == ncclSuccess) res = r;
  }
  if (res != ncclSuccess) return res;
  if (launch) return LaunchGroup(std::move(ops));
  if (sim && sim->size >= sizeof(ncclSimInfo_t)) {
    // A rough model: 5 us latency per operation plus 20 GB/s.
    double us = 0;
    for (const PendingOp& p : ops) us += 5.0 + p.op.count * DtypeSize(p.op.dtype) / 20e3;
    sim->estimatedTime = static_cast<float>(us);
  }
  return ncclSuccess;
}
}  // namespace

SIM_API ncclResult_t ncclGroupEnd(void) { return EndGroup(true, nullptr); }

// Ends the group without launching anything; fills estimatedTime (microseconds).
SIM_API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) { return EndGroup(false, simInfo); }

// ---- data movement -------------------------------------------------------------------------

SIM_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                   ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return Issue("ncclAllReduce", OpKind::AllReduce, sendbuff, recvbuff, count, datatype, op, -1, comm, stream);
}
SIM_API ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                   int root, ncclComm_t comm, cudaStream_t stream) {
  return Issue("ncclBroadcast", OpKind::Broadcast, sendbuff, recvbuff, count, datatype, -1, root, comm, stream);
}
SIM_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                               cudaStream_t stream) {
  return Issue("ncclBcast", OpKind::Broadcast, buff, buff, count, datatype, -1, root, comm, stream);
}
SIM_API ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return Issue("ncclReduce", OpKind::Reduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}
SIM_API ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                   ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return Issue("ncclAllGather", OpKind::AllGather, sendbuff, recvbuff, sendcount, datatype, -1, -1, comm, stream);
}
SIM_API ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                       cudaStream_t stream) {
  return Issue("ncclReduceScatter", OpKind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, -1, comm,
               stream);
}
SIM_API ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                  ncclComm_t comm, cudaStream_t stream) {
  return Issue("ncclAlltoAll", OpKind::AlltoAll, sendbuff, recvbuff, count, datatype, -1, -1, comm, stream);
}
SIM_API ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                int root, ncclComm_t comm, cudaStream_t stream) {
  return Issue("ncclGather", OpKind::Gather, sendbuff, recvbuff, count, datatype, -1, root, comm, stream);
}
SIM_API ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                 int root, ncclComm_t comm, cudaStream_t stream) {
  return Issue("ncclScatter", OpKind::Scatter, sendbuff, recvbuff, count, datatype, -1, root, comm, stream);
}
SIM_API ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                              ncclComm_t comm, cudaStream_t stream) {
  return Issue("ncclSend", OpKind::Send, sendbuff, nullptr, count, datatype, -1, peer, comm, stream);
}
SIM_API ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                              cudaStream_t stream) {
  return Issue("ncclRecv", OpKind::Recv, nullptr, recvbuff, count, datatype, -1, peer, comm, stream);
}

// ---- registration, windows, memory, user reductions: simple stand-ins ---------------------

SIM_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  if (!comm || !handle) return Fail(ncclInvalidArgument, "ncclCommRegister: NULL");
  *handle = buff ? buff : reinterpret_cast<void*>(comm);
  return ncclSuccess;
}
SIM_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  return comm ? ncclSuccess : Fail(ncclInvalidArgument, "ncclCommDeregister: NULL");
}
SIM_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                            int winFlags) {
  if (!comm || !win) return Fail(ncclInvalidArgument, "ncclCommWindowRegister: NULL");
  *win = reinterpret_cast<ncclWindow_t>(buff ? buff : static_cast<void*>(comm));
  return ncclSuccess;
}
SIM_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  return comm ? ncclSuccess : Fail(ncclInvalidArgument, "ncclCommWindowDeregister: NULL");
}
// "Device" memory is host memory in the simulator.
SIM_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (!ptr) return Fail(ncclInvalidArgument, "ncclMemAlloc: NULL");
  if (posix_memalign(ptr, 4096, size ? size : 1) != 0) return Fail(ncclSystemError, "ncclMemAlloc: out of memory");
  return ncclSuccess;
}
SIM_API ncclResult_t ncclMemFree(void* ptr) {
  free(ptr);
  return ncclSuccess;
}
SIM_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                              ncclScalarResidence_t residence, ncclComm_t comm) {
  if (!op || !scalar || !comm || DtypeSize(datatype) == 0)
    return Fail(ncclInvalidArgument, "ncclRedOpCreatePreMulSum: invalid arguments");
  // Both residences are readable here ("device" memory is host memory); read once, now.
  std::lock_guard<std::mutex> lk(comm->host_mu);
  comm->premul_scalars.push_back(LoadAsDouble(datatype, scalar));
  *op = static_cast<ncclRedOp_t>(kFirstUserRedOp + static_cast<int>(comm->premul_scalars.size()) - 1);
  return ncclSuccess;
}
SIM_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  if (!comm || static_cast<int>(op) < kFirstUserRedOp) return Fail(ncclInvalidArgument, "ncclRedOpDestroy: invalid op");
  return ncclSuccess;
}

// Compile-time proof that every function of the ABI lists is defined here (a missing one
// fails to link the library).
#define SIMNCCL_REF_OPERATION(name, ...) reinterpret_cast<const void*>(&name),
#define SIMNCCL_REF_FUNCTION(ret, name, ...) reinterpret_cast<const void*>(&name),
[[maybe_unused]] static const void* const kEveryExport[] = {
    NCCLWATCH_FOR_EACH_OPERATION(SIMNCCL_REF_OPERATION) NCCLWATCH_FOR_EACH_MANAGED(SIMNCCL_REF_FUNCTION)
        NCCLWATCH_FOR_EACH_PASSTHROUGH(SIMNCCL_REF_FUNCTION)};
