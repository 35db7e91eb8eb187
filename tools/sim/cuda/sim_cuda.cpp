// ncclwatch test bed: a GPU-free simulated CUDA driver, built as libcuda.so.1.
//
// Device memory is host memory. Every stream (the legacy default stream, each thread's
// per-thread default stream and each cuStreamCreate stream) is a FIFO of work items run
// strictly in order by its own worker thread; an event completes when its stream's worker
// reaches it. Stream capture appends host functions and event records to a graph instead of
// running them, and cuGraphLaunch enqueues the captured items again. The capture-mode rules
// for "potentially unsafe" calls follow the real driver, since ncclwatch's watchdog relies
// on them.
//
// One mutex guards all driver state; host functions run with it released, so they may call
// back into the driver.
#include <sys/syscall.h>
#include <unistd.h>
#include "ncclwatch/cuda_abi.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

// cuda_abi.h maps these plain names to their versioned symbols; this file defines both.
#undef cuDevicePrimaryCtxRelease
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuMemAlloc
#undef cuMemFree
#undef cuMemcpyHtoD
#undef cuMemcpyDtoH
#undef cuMemsetD8
#undef cuStreamDestroy
#undef cuStreamBeginCapture
#undef cuEventDestroy
#undef cuEventElapsedTime
#undef cuGraphInstantiate

// Only passed through by pointer (cuStreamGetCaptureInfo_v3 always reports default edges).
typedef struct CUgraphEdgeData_st CUgraphEdgeData;

using Clock = std::chrono::steady_clock;

namespace {

constexpr int kDefaultDeviceCount = 8;
constexpr int kMaxDeviceCount = 64;
constexpr size_t kAllocAlignment = 256;
constexpr int kDriverVersion = 12080;
// How long process exit waits for a stream worker that is still inside a host function.
constexpr auto kExitGracePeriod = std::chrono::milliseconds(500);

// One item of a stream's FIFO, or one node of a captured graph.
struct Work {
  enum class Kind { kHostFn, kEventRecord };
  explicit Work(Kind k) : kind(k) {}
  Kind kind;
  CUhostFn fn = nullptr;
  void* userData = nullptr;
  CUevent_st* event = nullptr;  // event memory is never freed (see CUevent_st)
  uint64_t generation = 0;      // which record of `event` this marker completes
};

}  // namespace

struct CUctx_st {
  CUdevice device = 0;
  int primaryRefs = 0;
};

// As in the real driver, a handle is a pointer that each call dereferences (no lookup table on
// the per-operation path: that would inflate the measured cost of ncclwatch's event records).
// Destroyed events are marked dead and kept for reuse, never freed, so a stale handle is
// reported as invalid (until its memory is reused, as a real handle value can be).
struct CUevent_st {
  static constexpr uint32_t kLive = 0x4556544c;  // "EVTL"
  static constexpr uint32_t kDead = 0x44454144;  // "DEAD"
  // Host side: written by the recording thread.
  std::atomic<uint32_t> magic{kLive};
  unsigned flags = 0;
  std::atomic<uint64_t> generation{0};  // bumped by every record, kept when the memory is reused
  bool recorded = false;                // recorded since it was created
  // Last recorded by a plain record into a stream capture: that record only orders work within
  // the capture, so the event has no host-visible state (CUDA_ERROR_CAPTURED_EVENT) until it
  // is recorded again outside a capture, or by a replay of an external record node.
  bool capturedRecord = false;
  // Device side, on its own cache line as a GPU's completion word is in its own memory:
  // written by the stream's worker, read by queries without the driver lock.
  alignas(64) std::atomic<uint64_t> completedGeneration{0};  // the latest record reached
  Clock::time_point completedAt;
  std::condition_variable completedCv;

  // Its streams have reached its latest record (never recorded: complete).
  bool complete() const { return completedGeneration.load() >= generation.load(); }
};

struct CUgraphNode_st {
  Work work;
};

struct CUgraph_st {
  std::deque<CUgraphNode_st> nodes;  // a deque keeps node addresses (the node handles) stable
};

struct CUgraphExec_st {
  std::vector<Work> work;
};

namespace {

struct Capture {
  uint64_t id;
  CUstreamCaptureMode mode;
  std::thread::id owner;  // the thread that began it
  CUcontext ctx;          // of the capturing stream
  bool blocksLegacy;      // the capturing stream synchronizes with the legacy stream
  bool invalidated = false;
  std::unique_ptr<CUgraph_st> graph = std::make_unique<CUgraph_st>();
  CUgraphNode lastNode = nullptr;  // reported by cuStreamGetCaptureInfo as the dependency
};

}  // namespace

namespace {

// A stream's pending commands: a ring that grows and never shrinks, so that queuing a command
// allocates nothing in steady state, as a driver writes into a preallocated push buffer.
class CommandRing {
 public:
  bool empty() const { return size_ == 0; }
  Work& front() { return slots_[head_]; }
  void pop_front() {
    head_ = (head_ + 1) % slots_.size();
    --size_;
  }
  void push_back(Work w) {
    if (size_ == slots_.size()) Grow();
    slots_[(head_ + size_) % slots_.size()] = std::move(w);
    ++size_;
  }

 private:
  void Grow() {
    std::vector<Work> bigger;
    bigger.reserve(slots_.empty() ? 64 : slots_.size() * 2);
    for (size_t i = 0; i < size_; ++i) bigger.push_back(std::move(slots_[(head_ + i) % slots_.size()]));
    bigger.resize(bigger.capacity(), Work(Work::Kind::kHostFn));
    slots_ = std::move(bigger);
    head_ = 0;
  }
  std::vector<Work> slots_;
  size_t head_ = 0, size_ = 0;
};

}  // namespace

// Like events, a stream handle is dereferenced by each call; a destroyed stream's memory is
// kept (Driver::allStreams) so that a stale handle is reported as invalid.
struct CUstream_st {
  static constexpr uint32_t kLive = 0x5354524c;  // "STRL"
  static constexpr uint32_t kDead = 0x44454144;  // "DEAD"
  std::atomic<uint32_t> magic{kLive};
  CUcontext ctx = nullptr;
  unsigned flags = 0;
  CommandRing queue;
  uint64_t enqueued = 0;
  uint64_t completed = 0;
  std::condition_variable workCv;  // the worker waits for work
  std::condition_variable doneCv;  // synchronizers wait for progress or the worker's exit
  std::thread worker;              // started at the first enqueue
  bool workerStarted = false;
  bool workerExited = false;
  bool busy = false;  // the worker is running an item it took off the queue
  bool retiring = false;  // destroyed: the worker drains the queue, then exits
  std::unique_ptr<Capture> capture;
};

namespace {

using StreamPtr = std::shared_ptr<CUstream_st>;

struct Driver {
  std::mutex mu;
  int deviceCount = kDefaultDeviceCount;
  std::vector<std::unique_ptr<CUctx_st>> primaryContexts;
  StreamPtr legacyStream;
  std::unordered_map<CUstream, StreamPtr> streams;  // from cuStreamCreate, not destroyed
  std::vector<StreamPtr> allStreams;                 // from cuStreamCreate, never freed
  std::vector<StreamPtr> perThreadStreams;           // of threads still alive
  std::vector<StreamPtr> retiredStreams;             // destroyed, worker not joined yet
  std::vector<CUevent_st*> events;      // every event ever created (live and dead)
  std::vector<CUevent_st*> deadEvents;  // destroyed, reused by cuEventCreate
  std::unordered_map<CUgraph, std::unique_ptr<CUgraph_st>> graphs;
  std::unordered_map<CUgraphExec, std::unique_ptr<CUgraphExec_st>> graphExecs;
  std::vector<Capture*> activeCaptures;
  std::atomic<size_t> activeCaptureCount{0};  // activeCaptures.size(), read without the lock
  std::unordered_map<CUdeviceptr, size_t> allocations;
  uint64_t nextCaptureId = 1;
  bool shuttingDown = false;  // process exit: workers stop, nothing new starts

  Driver() {
    if (const char* env = std::getenv("NCCLWATCH_SIM_DEVICES")) {
      char* end = nullptr;
      long n = std::strtol(env, &end, 10);
      if (end != env && *end == '\0' && n >= 0 && n <= kMaxDeviceCount) deviceCount = int(n);
    }
    for (int dev = 0; dev < deviceCount; ++dev) {
      primaryContexts.push_back(std::make_unique<CUctx_st>());
      primaryContexts.back()->device = dev;
    }
  }
};

// Never destroyed: a worker detached at exit may still be running and touch it.
Driver& driver() {
  static Driver* d = new Driver();
  return *d;
}

using Lock = std::unique_lock<std::mutex>;

thread_local std::vector<CUcontext> tlsContextStack;
thread_local CUstreamCaptureMode tlsCaptureMode = CU_STREAM_CAPTURE_MODE_GLOBAL;

void retireStream(Driver& d, const StreamPtr& s);

// The calling thread's per-thread default stream; retired when the thread exits.
struct PerThreadStream {
  StreamPtr stream;
  ~PerThreadStream() {
    if (!stream) return;
    Driver& d = driver();
    Lock lk(d.mu);
    auto& list = d.perThreadStreams;
    list.erase(std::remove(list.begin(), list.end(), stream), list.end());
    retireStream(d, stream);
  }
};
thread_local PerThreadStream tlsPerThreadStream;

bool logEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("NCCLWATCH_SIM_CUDA_LOG");
    return v && *v && std::strcmp(v, "0") != 0;
  }();
  return on;
}

// Every exported call returns through here, so NCCLWATCH_SIM_CUDA_LOG=1 shows one line each,
// with the calling thread (bench_driver_calls tells the application's calls from others').
CUresult traced(const char* api, CUresult result) {
  if (logEnabled()) std::fprintf(stderr, "[sim-cuda] %s -> %d tid %ld\n", api, int(result), syscall(SYS_gettid));
  return result;
}

CUcontext currentContext() {
  return tlsContextStack.empty() ? nullptr : tlsContextStack.back();
}

// Lenient: a thread with no current context gets device 0's primary context.
CUcontext currentOrPrimaryContext(Driver& d) {
  if (CUcontext ctx = currentContext()) return ctx;
  return d.primaryContexts.empty() ? nullptr : d.primaryContexts[0].get();
}

bool isContext(Driver& d, CUcontext ctx) {
  return ctx && ctx->device >= 0 && ctx->device < d.deviceCount &&
         d.primaryContexts[size_t(ctx->device)].get() == ctx;
}

StreamPtr newStream(Driver& d, unsigned flags) {
  auto s = std::make_shared<CUstream_st>();
  s->ctx = currentOrPrimaryContext(d);
  s->flags = flags;
  return s;
}

// Handle 0 and CU_STREAM_LEGACY name the legacy stream; the _ptsz exports map 0 to
// CU_STREAM_PER_THREAD first, as programs built with per-thread default streams expect.
CUstream_st* findStream(Driver& d, CUstream h) {
  if (h == nullptr || h == CU_STREAM_LEGACY) {
    if (!d.legacyStream) d.legacyStream = newStream(d, CU_STREAM_DEFAULT);
    return d.legacyStream.get();
  }
  if (h == CU_STREAM_PER_THREAD) {
    StreamPtr& s = tlsPerThreadStream.stream;
    if (!s) {
      s = newStream(d, CU_STREAM_DEFAULT);
      d.perThreadStreams.push_back(s);
    }
    return s.get();
  }
  return h->magic.load(std::memory_order_relaxed) == CUstream_st::kLive ? h : nullptr;
}

CUstream perThreadIfNull(CUstream h) { return h ? h : CU_STREAM_PER_THREAD; }

CUevent_st* findEvent(CUevent h) {
  return h && h->magic == CUevent_st::kLive ? h : nullptr;
}

// Touches the device side only, as a GPU writes its completion word without reading the
// driver's host-side object (whose cache line the recording thread keeps to itself).
void completeEvent(const Work& marker) {
  CUevent_st& ev = *marker.event;
  // A record finishing after a newer one of the same event (on another stream) changes nothing.
  if (marker.generation <= ev.completedGeneration.load()) return;
  ev.completedAt = Clock::now();
  ev.completedGeneration.store(marker.generation);
  ev.completedCv.notify_all();
}

void runWorker(CUstream_st* s) {
  Driver& d = driver();
  Lock lk(d.mu);
  for (;;) {
    s->workCv.wait(lk, [&] { return !s->queue.empty() || s->retiring || d.shuttingDown; });
    if (d.shuttingDown || s->queue.empty()) break;
    Work w = std::move(s->queue.front());
    s->queue.pop_front();
    if (w.kind == Work::Kind::kHostFn) {
      s->busy = true;
      lk.unlock();
      w.fn(w.userData);
      lk.lock();
      s->busy = false;
    } else {
      completeEvent(w);
    }
    ++s->completed;
    s->doneCv.notify_all();
  }
  s->workerExited = true;
  s->doneCv.notify_all();
}

bool ensureWorker(Driver& d, CUstream_st* s) {
  if (s->workerStarted || d.shuttingDown) return true;
  try {
    s->worker = std::thread(runWorker, s);
  } catch (const std::system_error&) {
    return false;
  }
  s->workerStarted = true;
  return true;
}

// The active captures and their count (read without the lock) change together.
void addActiveCapture(Driver& d, Capture* c) {
  d.activeCaptures.push_back(c);
  d.activeCaptureCount.store(d.activeCaptures.size());
}
void removeActiveCapture(Driver& d, Capture* c) {
  auto& active = d.activeCaptures;
  active.erase(std::remove(active.begin(), active.end(), c), active.end());
  d.activeCaptureCount.store(active.size());
}

void retireStream(Driver& d, const StreamPtr& s) {
  if (s->capture) {
    removeActiveCapture(d, s->capture.get());
    s->capture.reset();
  }
  s->retiring = true;
  s->workCv.notify_all();
  d.retiredStreams.push_back(s);
}

// Takes the threads of retired streams whose worker has finished, to be joined unlocked.
std::vector<std::thread> takeFinishedWorkers(Driver& d) {
  std::vector<std::thread> finished;
  auto done = [](const StreamPtr& s) { return !s->workerStarted || s->workerExited; };
  for (auto& s : d.retiredStreams)
    if (done(s)) finished.push_back(std::move(s->worker));
  auto& list = d.retiredStreams;
  list.erase(std::remove_if(list.begin(), list.end(), done), list.end());
  return finished;
}

void joinAll(std::vector<std::thread>& threads) {
  for (auto& t : threads)
    if (t.joinable()) t.join();
}

// The legacy stream implicitly synchronizes with the blocking streams of its context, so it
// cannot be used while one of them is capturing: the call fails and, if `spoils`, it
// invalidates those captures (work or a synchronization on it would join them).
CUresult checkLegacyStreamUse(Driver& d, CUstream_st* s, bool spoils) {
  if (s != d.legacyStream.get()) return CUDA_SUCCESS;
  const CUcontext ctx = currentOrPrimaryContext(d);
  bool conflict = false;
  for (Capture* c : d.activeCaptures) {
    if (!c->blocksLegacy || c->ctx != ctx) continue;
    conflict = true;
    if (spoils) c->invalidated = true;
  }
  return conflict ? CUDA_ERROR_STREAM_CAPTURE_IMPLICIT : CUDA_SUCCESS;
}

// Appends to the stream's capture graph when it is capturing, else to its FIFO.
CUresult enqueue(Driver& d, CUstream_st* s, Work w) {
  if (CUresult r = checkLegacyStreamUse(d, s, true)) return r;
  if (Capture* c = s->capture.get()) {
    if (c->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    c->graph->nodes.push_back(CUgraphNode_st{std::move(w)});
    c->lastNode = &c->graph->nodes.back();
    return CUDA_SUCCESS;
  }
  if (w.kind == Work::Kind::kEventRecord) {
    w.generation = ++w.event->generation;
    w.event->recorded = true;
    w.event->capturedRecord = false;
    // As on a GPU, recording an event costs no more than writing a command: on an idle stream
    // it is reached at once; behind queued work the running worker gets to it without a wake-up.
    ++s->enqueued;
    if (s->queue.empty() && !s->busy) {
      completeEvent(w);
      ++s->completed;
      s->doneCv.notify_all();
    } else {
      s->queue.push_back(std::move(w));
    }
    return CUDA_SUCCESS;
  }
  if (!ensureWorker(d, s)) return CUDA_ERROR_OUT_OF_MEMORY;
  const bool wake = s->queue.empty() && !s->busy;  // otherwise the worker is running and will look again
  s->queue.push_back(std::move(w));
  ++s->enqueued;
  if (wake) s->workCv.notify_one();
  return CUDA_SUCCESS;
}

// The real driver's rule for "potentially unsafe" calls during stream capture: a thread in
// GLOBAL mode may not make them while any GLOBAL-mode capture is active anywhere, nor while
// it has its own non-RELAXED capture; a THREAD_LOCAL thread only the latter; a RELAXED
// thread always may. A prohibited call fails and invalidates the captures it conflicts with.
CUresult checkUnsafeCall(Driver& d) {
  const CUstreamCaptureMode mode = tlsCaptureMode;
  if (mode == CU_STREAM_CAPTURE_MODE_RELAXED) return CUDA_SUCCESS;
  const auto self = std::this_thread::get_id();
  bool prohibited = false;
  for (Capture* c : d.activeCaptures) {
    bool ownCapture = c->owner == self && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    bool globalConflict =
        mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (ownCapture || globalConflict) {
      c->invalidated = true;
      prohibited = true;
    }
  }
  return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

// Synchronizing with a capturing stream is never legal: it fails and spoils the capture.
CUresult checkNotCapturing(CUstream_st* s) {
  if (!s->capture) return CUDA_SUCCESS;
  s->capture->invalidated = true;
  return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
}

// For cuStreamSynchronize / cuStreamQuery. Every check runs, since each may spoil captures;
// the first failure is reported.
CUresult checkStreamSyncAllowed(Driver& d, CUstream_st* s) {
  const CUresult checks[] = {checkNotCapturing(s), checkLegacyStreamUse(d, s, true),
                             checkUnsafeCall(d)};
  for (CUresult r : checks)
    if (r != CUDA_SUCCESS) return r;
  return CUDA_SUCCESS;
}

// ---- Implementations (the exports below are thin wrappers) ----

// Writes `format` filled with `value` into `out`, for a valid device.
CUresult deviceGetString(char* out, int len, CUdevice dev, const char* format, int value) {
  Driver& d = driver();
  if (!out || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= d.deviceCount) return CUDA_ERROR_INVALID_DEVICE;
  std::snprintf(out, size_t(len), format, value);
  return CUDA_SUCCESS;
}

CUresult memAlloc(CUdeviceptr* dptr, size_t bytes) {
  Driver& d = driver();
  if (!dptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  Lock lk(d.mu);
  if (CUresult r = checkUnsafeCall(d)) return r;
  size_t rounded = (bytes + kAllocAlignment - 1) / kAllocAlignment * kAllocAlignment;
  void* p = std::aligned_alloc(kAllocAlignment, rounded);
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  *dptr = CUdeviceptr(uintptr_t(p));
  d.allocations[*dptr] = bytes;
  return CUDA_SUCCESS;
}

CUresult memFree(CUdeviceptr dptr) {
  Driver& d = driver();
  Lock lk(d.mu);
  if (CUresult r = checkUnsafeCall(d)) return r;
  if (dptr == 0) return CUDA_SUCCESS;
  if (d.allocations.erase(dptr) == 0) return CUDA_ERROR_INVALID_VALUE;
  std::free(reinterpret_cast<void*>(uintptr_t(dptr)));
  return CUDA_SUCCESS;
}

CUresult memCopy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return CUDA_SUCCESS;
  if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
  std::memmove(dst, src, bytes);
  return CUDA_SUCCESS;
}

CUresult streamCreate(CUstream* out, unsigned flags) {
  Driver& d = driver();
  if (!out || (flags & ~unsigned(CU_STREAM_NON_BLOCKING))) return CUDA_ERROR_INVALID_VALUE;
  std::vector<std::thread> finished;
  {
    Lock lk(d.mu);
    finished = takeFinishedWorkers(d);
    StreamPtr s = newStream(d, flags);
    d.streams[s.get()] = s;
    d.allStreams.push_back(s);
    *out = s.get();
  }
  joinAll(finished);
  return CUDA_SUCCESS;
}

// Like the real driver, returns at once: pending work still runs, then the worker exits.
CUresult streamDestroy(CUstream h) {
  Driver& d = driver();
  std::vector<std::thread> finished;
  {
    Lock lk(d.mu);
    auto it = d.streams.find(h);
    if (it == d.streams.end()) return CUDA_ERROR_INVALID_HANDLE;
    StreamPtr s = std::move(it->second);
    d.streams.erase(it);
    s->magic.store(CUstream_st::kDead, std::memory_order_relaxed);
    retireStream(d, s);
    finished = takeFinishedWorkers(d);
  }
  joinAll(finished);
  return CUDA_SUCCESS;
}

CUresult streamSynchronize(CUstream h) {
  Driver& d = driver();
  Lock lk(d.mu);
  CUstream_st* s = findStream(d, h);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = checkStreamSyncAllowed(d, s)) return r;
  const uint64_t target = s->enqueued;
  s->doneCv.wait(lk, [&] { return s->completed >= target || d.shuttingDown; });
  return s->completed >= target ? CUDA_SUCCESS : CUDA_ERROR_DEINITIALIZED;
}

CUresult streamQuery(CUstream h) {
  Driver& d = driver();
  Lock lk(d.mu);
  CUstream_st* s = findStream(d, h);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = checkStreamSyncAllowed(d, s)) return r;
  return s->completed == s->enqueued ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult streamGetCtx(CUstream h, CUcontext* pctx) {
  Driver& d = driver();
  if (!pctx) return CUDA_ERROR_INVALID_VALUE;
  Lock lk(d.mu);
  if (h == nullptr || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
    *pctx = currentOrPrimaryContext(d);  // the default streams belong to the current context
    return *pctx ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
  }
  CUstream_st* s = findStream(d, h);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  *pctx = s->ctx;
  return CUDA_SUCCESS;
}

CUresult streamGetCaptureInfo(CUstream h, CUstreamCaptureStatus* status, cuuint64_t* id,
                              CUgraph* graph, const CUgraphNode** deps,
                              const CUgraphEdgeData** edgeData, size_t* numDeps) {
  Driver& d = driver();
  if (!status) return CUDA_ERROR_INVALID_VALUE;
  Lock lk(d.mu);
  CUstream_st* s = findStream(d, h);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (CUresult r = checkLegacyStreamUse(d, s, false)) return r;
  Capture* c = s->capture.get();
  const bool active = c && !c->invalidated;
  *status = !c ? CU_STREAM_CAPTURE_STATUS_NONE
               : active ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_INVALIDATED;
  if (id && c) *id = c->id;
  if (graph) *graph = active ? c->graph.get() : nullptr;
  if (deps) *deps = active && c->lastNode ? &c->lastNode : nullptr;
  if (edgeData) *edgeData = nullptr;  // all edges are default edges
  if (numDeps) *numDeps = active && c->lastNode ? 1 : 0;
  return CUDA_SUCCESS;
}

CUresult streamIsCapturing(CUstream h, CUstreamCaptureStatus* status) {
  return streamGetCaptureInfo(h, status, nullptr, nullptr, nullptr, nullptr, nullptr);
}

bool isCaptureMode(CUstreamCaptureMode mode) {
  return mode == CU_STREAM_CAPTURE_MODE_GLOBAL || mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL ||
         mode == CU_STREAM_CAPTURE_MODE_RELAXED;
}

CUresult streamBeginCapture(CUstream h, CUstreamCaptureMode mode) {
  Driver& d = driver();
  if (!isCaptureMode(mode)) return CUDA_ERROR_INVALID_VALUE;
  if (h == nullptr || h == CU_STREAM_LEGACY) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  Lock lk(d.mu);
  CUstream_st* s = findStream(d, h);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  if (s->capture) return CUDA_ERROR_ILLEGAL_STATE;
  s->capture = std::make_unique<Capture>();
  s->capture->id = d.nextCaptureId++;
  s->capture->mode = mode;
  s->capture->owner = std::this_thread::get_id();
  s->capture->ctx = s->ctx;
  s->capture->blocksLegacy = !(s->flags & CU_STREAM_NON_BLOCKING);
  addActiveCapture(d, s->capture.get());
  return CUDA_SUCCESS;
}

CUresult streamEndCapture(CUstream h, CUgraph* phGraph) {
  Driver& d = driver();
  if (!phGraph) return CUDA_ERROR_INVALID_VALUE;
  Lock lk(d.mu);
  CUstream_st* s = findStream(d, h);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  Capture* c = s->capture.get();
  if (!c) return CUDA_ERROR_ILLEGAL_STATE;
  if (c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && c->owner != std::this_thread::get_id())
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  removeActiveCapture(d, c);
  std::unique_ptr<Capture> ended = std::move(s->capture);
  *phGraph = nullptr;
  if (ended->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  CUgraph graph = ended->graph.get();
  d.graphs[graph] = std::move(ended->graph);
  *phGraph = graph;
  return CUDA_SUCCESS;
}

CUresult graphInstantiate(CUgraphExec* phExec, CUgraph hGraph) {
  Driver& d = driver();
  if (!phExec) return CUDA_ERROR_INVALID_VALUE;
  Lock lk(d.mu);
  auto it = d.graphs.find(hGraph);
  if (it == d.graphs.end()) return CUDA_ERROR_INVALID_HANDLE;
  auto exec = std::make_unique<CUgraphExec_st>();
  for (const CUgraphNode_st& node : it->second->nodes) exec->work.push_back(node.work);
  *phExec = exec.get();
  d.graphExecs[exec.get()] = std::move(exec);
  return CUDA_SUCCESS;
}

CUresult graphLaunch(CUgraphExec hExec, CUstream h) {
  Driver& d = driver();
  Lock lk(d.mu);
  auto it = d.graphExecs.find(hExec);
  if (it == d.graphExecs.end()) return CUDA_ERROR_INVALID_HANDLE;
  CUstream_st* s = findStream(d, h);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  for (const Work& w : it->second->work)
    if (CUresult r = enqueue(d, s, w)) return r;
  return CUDA_SUCCESS;
}

CUresult eventCreate(CUevent* out, unsigned flags) {
  Driver& d = driver();
  const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
  if (!out || (flags & ~known)) return CUDA_ERROR_INVALID_VALUE;
  if ((flags & CU_EVENT_INTERPROCESS) && !(flags & CU_EVENT_DISABLE_TIMING))
    return CUDA_ERROR_INVALID_VALUE;
  Lock lk(d.mu);
  CUevent_st* ev;
  if (!d.deadEvents.empty()) {
    ev = d.deadEvents.back();
    d.deadEvents.pop_back();
  } else {
    ev = new CUevent_st;
    d.events.push_back(ev);
  }
  ev->magic = CUevent_st::kLive;
  ev->flags = flags;
  ev->recorded = false;
  ev->capturedRecord = false;
  ev->completedGeneration.store(ev->generation.load());
  *out = ev;
  return CUDA_SUCCESS;
}

// cuEventRecordWithFlags, per the driver API documentation. Outside a capture a plain record
// marks the stream's position; CU_EVENT_RECORD_EXTERNAL is invalid there. In a capture an
// external record becomes an event record node, which records the event at each launch of the
// graph (as a stream record made then: the event is pending until the replay gets to it),
// leaving its state untouched at capture; a plain record in a capture makes no node (it only
// orders streams within the capture) and leaves the event "captured": queries fail with
// CUDA_ERROR_CAPTURED_EVENT until it is recorded again. Recording is stream work, legal in
// every capture mode.
CUresult eventRecord(CUevent hEvent, CUstream h, unsigned flags = CU_EVENT_RECORD_DEFAULT) {
  Driver& d = driver();
  if (flags & ~unsigned(CU_EVENT_RECORD_EXTERNAL)) return CUDA_ERROR_INVALID_VALUE;
  Lock lk(d.mu);
  CUevent_st* ev = findEvent(hEvent);
  CUstream_st* s = findStream(d, h);
  if (!ev || !s) return CUDA_ERROR_INVALID_HANDLE;
  const bool external = flags & CU_EVENT_RECORD_EXTERNAL;
  if (Capture* c = s->capture.get()) {
    if (c->invalidated) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (!external) {
      ev->capturedRecord = true;
      return CUDA_SUCCESS;
    }
  } else if (external) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  Work marker(Work::Kind::kEventRecord);
  marker.event = ev;
  return enqueue(d, s, std::move(marker));
}

CUresult eventQuery(CUevent hEvent) {
  Driver& d = driver();
  // A query that cannot conflict with a capture needs no lock (the real driver reads memory
  // the GPU writes): a thread in relaxed mode, or no capture anywhere.
  Lock lk(d.mu, std::defer_lock);
  if (tlsCaptureMode != CU_STREAM_CAPTURE_MODE_RELAXED && d.activeCaptureCount.load() != 0) {
    lk.lock();
    if (CUresult r = checkUnsafeCall(d)) return r;
  }
  CUevent_st* ev = findEvent(hEvent);
  if (!ev) return CUDA_ERROR_INVALID_HANDLE;
  if (ev->capturedRecord) return CUDA_ERROR_CAPTURED_EVENT;
  return ev->complete() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

CUresult eventSynchronize(CUevent hEvent) {
  Driver& d = driver();
  Lock lk(d.mu);
  if (CUresult r = checkUnsafeCall(d)) return r;
  CUevent_st* ev = findEvent(hEvent);
  if (!ev) return CUDA_ERROR_INVALID_HANDLE;
  if (ev->capturedRecord) return CUDA_ERROR_CAPTURED_EVENT;
  // Waits for the record current at the call; a later re-record also ends the wait.
  const uint64_t target = ev->generation;
  ev->completedCv.wait(
      lk, [&] { return ev->complete() || ev->generation.load() != target || d.shuttingDown; });
  return ev->complete() || ev->generation.load() != target ? CUDA_SUCCESS : CUDA_ERROR_DEINITIALIZED;
}

CUresult eventElapsedTime(float* ms, CUevent hStart, CUevent hEnd) {
  Driver& d = driver();
  if (!ms) return CUDA_ERROR_INVALID_VALUE;
  Lock lk(d.mu);
  CUevent_st* start = findEvent(hStart);
  CUevent_st* end = findEvent(hEnd);
  if (!start || !end) return CUDA_ERROR_INVALID_HANDLE;
  if (start->capturedRecord || end->capturedRecord) return CUDA_ERROR_CAPTURED_EVENT;
  if ((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING) return CUDA_ERROR_INVALID_HANDLE;
  if (!start->recorded || !end->recorded) return CUDA_ERROR_INVALID_HANDLE;
  if (!start->complete() || !end->complete()) return CUDA_ERROR_NOT_READY;
  *ms = std::chrono::duration<float, std::milli>(end->completedAt - start->completedAt).count();
  return CUDA_SUCCESS;
}

CUresult eventDestroy(CUevent hEvent) {
  Driver& d = driver();
  Lock lk(d.mu);
  // Pending markers may still point at it: its memory stays (see CUevent_st).
  CUevent_st* ev = findEvent(hEvent);
  if (!ev) return CUDA_ERROR_INVALID_HANDLE;
  ev->magic = CUevent_st::kDead;
  d.deadEvents.push_back(ev);
  return CUDA_SUCCESS;
}

CUresult launchHostFunc(CUstream h, CUhostFn fn, void* userData) {
  Driver& d = driver();
  if (!fn) return CUDA_ERROR_INVALID_VALUE;
  Lock lk(d.mu);
  CUstream_st* s = findStream(d, h);
  if (!s) return CUDA_ERROR_INVALID_HANDLE;
  Work w(Work::Kind::kHostFn);
  w.fn = fn;
  w.userData = userData;
  return enqueue(d, s, std::move(w));
}

struct ErrorText {
  CUresult code;
  const char* name;
  const char* description;
};

const ErrorText kErrorTexts[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_ILLEGAL_STATE, "CUDA_ERROR_ILLEGAL_STATE",
     "the operation cannot be performed in the present state"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
     "operation failed due to a previous error during capture"},
    {CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
     "capture was not ended in the same stream as it began"},
    {CUDA_ERROR_CAPTURED_EVENT, "CUDA_ERROR_CAPTURED_EVENT",
     "operation not permitted on an event last recorded in a capturing stream"},
    {CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
     "attempt to terminate a thread-local capture sequence from another thread"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

const ErrorText* findErrorText(CUresult code) {
  for (const ErrorText& e : kErrorTexts)
    if (e.code == code) return &e;
  return nullptr;
}

// At process exit: stop every worker after its current item (pending work is dropped, as a
// real GPU's would be), join those that stop within the grace period and detach the rest,
// so that a host function blocked forever (a simulated hang) cannot hang exit.
struct ShutdownAtExit {
  ~ShutdownAtExit() {
    Driver& d = driver();
    std::vector<StreamPtr> started;  // owned here: a concurrent reaper may drop them
    {
      Lock lk(d.mu);
      d.shuttingDown = true;
      auto collect = [&](const StreamPtr& s) {
        if (!s || !s->workerStarted) return;
        started.push_back(s);
        s->workCv.notify_all();
        s->doneCv.notify_all();  // releases cuStreamSynchronize callers
      };
      collect(d.legacyStream);
      for (auto& entry : d.streams) collect(entry.second);
      for (auto& s : d.perThreadStreams) collect(s);
      for (auto& s : d.retiredStreams) collect(s);
      for (CUevent_st* ev : d.events) ev->completedCv.notify_all();
    }
    const auto deadline = Clock::now() + kExitGracePeriod;
    const auto self = std::this_thread::get_id();
    for (const StreamPtr& s : started) {
      std::thread worker;
      bool exited;
      {
        Lock lk(d.mu);
        // No wait when exit() was called by a host function of this very stream.
        if (s->worker.get_id() != self)
          s->doneCv.wait_until(lk, deadline, [&] { return s->workerExited; });
        exited = s->workerExited;
        worker = std::move(s->worker);
      }
      if (!worker.joinable()) continue;
      if (exited && worker.get_id() != self)
        worker.join();
      else
        worker.detach();
    }
  }
};
ShutdownAtExit shutdownAtExit;

}  // namespace

// ---- Exports ----
// Plain names and the versioned / per-thread-default-stream names the real cuda.h maps them
// to. An alias is the same function under another name; a _ptsz export differs from the
// plain one only in that stream handle 0 means the calling thread's per-thread stream.

#define SIM_API extern "C" __attribute__((visibility("default")))
#define SIM_ALIAS(name, target) SIM_API decltype(target) name __attribute__((alias(#target)));

SIM_API CUresult cuInit(unsigned int flags) {
  if (flags != 0) return traced(__func__, CUDA_ERROR_INVALID_VALUE);
  return traced(__func__, driver().deviceCount > 0 ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE);
}

SIM_API CUresult cuDriverGetVersion(int* version) {
  if (!version) return traced(__func__, CUDA_ERROR_INVALID_VALUE);
  *version = kDriverVersion;
  return traced(__func__, CUDA_SUCCESS);
}

SIM_API CUresult cuDeviceGetCount(int* count) {
  if (!count) return traced(__func__, CUDA_ERROR_INVALID_VALUE);
  *count = driver().deviceCount;
  return traced(__func__, CUDA_SUCCESS);
}

SIM_API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (!device) return traced(__func__, CUDA_ERROR_INVALID_VALUE);
  if (ordinal < 0 || ordinal >= driver().deviceCount)
    return traced(__func__, CUDA_ERROR_INVALID_DEVICE);
  *device = ordinal;
  return traced(__func__, CUDA_SUCCESS);
}

SIM_API CUresult cuDeviceGetName(char* name, int len, CUdevice dev) {
  return traced(__func__, deviceGetString(name, len, dev, "ncclwatch simulated GPU %d", dev));
}

SIM_API CUresult cuDeviceGetPCIBusId(char* busId, int len, CUdevice dev) {
  // Bus numbers start at 1, so every simulated device has a distinct, plausible id.
  return traced(__func__, deviceGetString(busId, len, dev, "0000:%02x:00.0", dev + 1));
}

SIM_API CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  Driver& d = driver();
  if (!pctx) return traced(__func__, CUDA_ERROR_INVALID_VALUE);
  if (dev < 0 || dev >= d.deviceCount) return traced(__func__, CUDA_ERROR_INVALID_DEVICE);
  Lock lk(d.mu);
  *pctx = d.primaryContexts[size_t(dev)].get();
  ++(*pctx)->primaryRefs;
  return traced(__func__, CUDA_SUCCESS);
}

SIM_API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  Driver& d = driver();
  if (dev < 0 || dev >= d.deviceCount) return traced(__func__, CUDA_ERROR_INVALID_DEVICE);
  Lock lk(d.mu);
  // The context itself lives on: streams and events keep pointing at it.
  CUctx_st& ctx = *d.primaryContexts[size_t(dev)];
  if (ctx.primaryRefs == 0) return traced(__func__, CUDA_ERROR_INVALID_CONTEXT);
  --ctx.primaryRefs;
  return traced(__func__, CUDA_SUCCESS);
}
SIM_ALIAS(cuDevicePrimaryCtxRelease, cuDevicePrimaryCtxRelease_v2)

SIM_API CUresult cuCtxGetCurrent(CUcontext* pctx) {
  if (!pctx) return traced(__func__, CUDA_ERROR_INVALID_VALUE);
  *pctx = currentContext();
  return traced(__func__, CUDA_SUCCESS);
}

SIM_API CUresult cuCtxSetCurrent(CUcontext ctx) {
  // As in the real driver: replaces the top of the stack; NULL pops it.
  if (!ctx) {
    if (!tlsContextStack.empty()) tlsContextStack.pop_back();
    return traced(__func__, CUDA_SUCCESS);
  }
  if (!isContext(driver(), ctx)) return traced(__func__, CUDA_ERROR_INVALID_CONTEXT);
  if (tlsContextStack.empty())
    tlsContextStack.push_back(ctx);
  else
    tlsContextStack.back() = ctx;
  return traced(__func__, CUDA_SUCCESS);
}

SIM_API CUresult cuCtxGetDevice(CUdevice* device) {
  if (!device) return traced(__func__, CUDA_ERROR_INVALID_VALUE);
  CUcontext ctx = currentOrPrimaryContext(driver());
  if (!ctx) return traced(__func__, CUDA_ERROR_INVALID_CONTEXT);
  *device = ctx->device;
  return traced(__func__, CUDA_SUCCESS);
}

SIM_API CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  if (!isContext(driver(), ctx)) return traced(__func__, CUDA_ERROR_INVALID_CONTEXT);
  tlsContextStack.push_back(ctx);
  return traced(__func__, CUDA_SUCCESS);
}
SIM_ALIAS(cuCtxPushCurrent, cuCtxPushCurrent_v2)

SIM_API CUresult cuCtxPopCurrent_v2(CUcontext* pctx) {
  if (tlsContextStack.empty()) return traced(__func__, CUDA_ERROR_INVALID_CONTEXT);
  if (pctx) *pctx = tlsContextStack.back();
  tlsContextStack.pop_back();
  return traced(__func__, CUDA_SUCCESS);
}
SIM_ALIAS(cuCtxPopCurrent, cuCtxPopCurrent_v2)

SIM_API CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  return traced(__func__, memAlloc(dptr, bytes));
}
SIM_ALIAS(cuMemAlloc, cuMemAlloc_v2)

SIM_API CUresult cuMemFree_v2(CUdeviceptr dptr) { return traced(__func__, memFree(dptr)); }
SIM_ALIAS(cuMemFree, cuMemFree_v2)

SIM_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
  return traced(__func__, memCopy(reinterpret_cast<void*>(uintptr_t(dst)), src, bytes));
}
SIM_ALIAS(cuMemcpyHtoD, cuMemcpyHtoD_v2)
SIM_ALIAS(cuMemcpyHtoD_v2_ptds, cuMemcpyHtoD_v2)

SIM_API CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
  return traced(__func__, memCopy(dst, reinterpret_cast<const void*>(uintptr_t(src)), bytes));
}
SIM_ALIAS(cuMemcpyDtoH, cuMemcpyDtoH_v2)
SIM_ALIAS(cuMemcpyDtoH_v2_ptds, cuMemcpyDtoH_v2)

SIM_API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t count) {
  if (count == 0) return traced(__func__, CUDA_SUCCESS);
  if (dst == 0) return traced(__func__, CUDA_ERROR_INVALID_VALUE);
  std::memset(reinterpret_cast<void*>(uintptr_t(dst)), value, count);
  return traced(__func__, CUDA_SUCCESS);
}
SIM_ALIAS(cuMemsetD8, cuMemsetD8_v2)
SIM_ALIAS(cuMemsetD8_v2_ptds, cuMemsetD8_v2)

SIM_API CUresult cuStreamCreate(CUstream* phStream, unsigned int flags) {
  return traced(__func__, streamCreate(phStream, flags));
}

SIM_API CUresult cuStreamDestroy_v2(CUstream h) { return traced(__func__, streamDestroy(h)); }
SIM_ALIAS(cuStreamDestroy, cuStreamDestroy_v2)

SIM_API CUresult cuStreamSynchronize(CUstream h) {
  return traced(__func__, streamSynchronize(h));
}
SIM_API CUresult cuStreamSynchronize_ptsz(CUstream h) {
  return traced(__func__, streamSynchronize(perThreadIfNull(h)));
}

SIM_API CUresult cuStreamQuery(CUstream h) { return traced(__func__, streamQuery(h)); }
SIM_API CUresult cuStreamQuery_ptsz(CUstream h) {
  return traced(__func__, streamQuery(perThreadIfNull(h)));
}

SIM_API CUresult cuStreamGetCtx(CUstream h, CUcontext* pctx) {
  return traced(__func__, streamGetCtx(h, pctx));
}
SIM_API CUresult cuStreamGetCtx_ptsz(CUstream h, CUcontext* pctx) {
  return traced(__func__, streamGetCtx(perThreadIfNull(h), pctx));
}

SIM_API CUresult cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus* status) {
  return traced(__func__, streamIsCapturing(h, status));
}
SIM_API CUresult cuStreamIsCapturing_ptsz(CUstream h, CUstreamCaptureStatus* status) {
  return traced(__func__, streamIsCapturing(perThreadIfNull(h), status));
}

// The plain (CUDA 10.0) cuStreamGetCaptureInfo has only the status and id parameters.
SIM_API CUresult cuStreamGetCaptureInfo(CUstream h, CUstreamCaptureStatus* status,
                                        cuuint64_t* id) {
  return traced(__func__,
                streamGetCaptureInfo(h, status, id, nullptr, nullptr, nullptr, nullptr));
}
SIM_API CUresult cuStreamGetCaptureInfo_ptsz(CUstream h, CUstreamCaptureStatus* status,
                                             cuuint64_t* id) {
  return traced(__func__, streamGetCaptureInfo(perThreadIfNull(h), status, id, nullptr,
                                               nullptr, nullptr, nullptr));
}

SIM_API CUresult cuStreamGetCaptureInfo_v2(CUstream h, CUstreamCaptureStatus* status,
                                           cuuint64_t* id, CUgraph* graph,
                                           const CUgraphNode** deps, size_t* numDeps) {
  return traced(__func__, streamGetCaptureInfo(h, status, id, graph, deps, nullptr, numDeps));
}
SIM_API CUresult cuStreamGetCaptureInfo_v2_ptsz(CUstream h, CUstreamCaptureStatus* status,
                                                cuuint64_t* id, CUgraph* graph,
                                                const CUgraphNode** deps, size_t* numDeps) {
  return traced(__func__, streamGetCaptureInfo(perThreadIfNull(h), status, id, graph, deps,
                                               nullptr, numDeps));
}

SIM_API CUresult cuStreamGetCaptureInfo_v3(CUstream h, CUstreamCaptureStatus* status,
                                           cuuint64_t* id, CUgraph* graph,
                                           const CUgraphNode** deps,
                                           const CUgraphEdgeData** edgeData, size_t* numDeps) {
  return traced(__func__, streamGetCaptureInfo(h, status, id, graph, deps, edgeData, numDeps));
}
SIM_API CUresult cuStreamGetCaptureInfo_v3_ptsz(CUstream h, CUstreamCaptureStatus* status,
                                                cuuint64_t* id, CUgraph* graph,
                                                const CUgraphNode** deps,
                                                const CUgraphEdgeData** edgeData,
                                                size_t* numDeps) {
  return traced(__func__, streamGetCaptureInfo(perThreadIfNull(h), status, id, graph, deps,
                                               edgeData, numDeps));
}

// The plain (CUDA 10.0) cuStreamBeginCapture has no mode parameter: it captures in GLOBAL mode.
SIM_API CUresult cuStreamBeginCapture(CUstream h) {
  return traced(__func__, streamBeginCapture(h, CU_STREAM_CAPTURE_MODE_GLOBAL));
}
SIM_API CUresult cuStreamBeginCapture_ptsz(CUstream h) {
  return traced(__func__, streamBeginCapture(perThreadIfNull(h), CU_STREAM_CAPTURE_MODE_GLOBAL));
}
SIM_API CUresult cuStreamBeginCapture_v2(CUstream h, CUstreamCaptureMode mode) {
  return traced(__func__, streamBeginCapture(h, mode));
}
SIM_API CUresult cuStreamBeginCapture_v2_ptsz(CUstream h, CUstreamCaptureMode mode) {
  return traced(__func__, streamBeginCapture(perThreadIfNull(h), mode));
}

SIM_API CUresult cuStreamEndCapture(CUstream h, CUgraph* phGraph) {
  return traced(__func__, streamEndCapture(h, phGraph));
}
SIM_API CUresult cuStreamEndCapture_ptsz(CUstream h, CUgraph* phGraph) {
  return traced(__func__, streamEndCapture(perThreadIfNull(h), phGraph));
}

SIM_API CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (!mode || !isCaptureMode(*mode)) return traced(__func__, CUDA_ERROR_INVALID_VALUE);
  std::swap(*mode, tlsCaptureMode);
  return traced(__func__, CUDA_SUCCESS);
}

SIM_API CUresult cuGraphInstantiateWithFlags(CUgraphExec* phExec, CUgraph hGraph,
                                             unsigned long long flags) {
  return traced(__func__, graphInstantiate(phExec, hGraph));
}

// The plain cuGraphInstantiate and _v2 keep the pre-CUDA-12 error-node/log signature.
SIM_API CUresult cuGraphInstantiate_v2(CUgraphExec* phExec, CUgraph hGraph,
                                       CUgraphNode* phErrorNode, char* logBuffer,
                                       size_t bufferSize) {
  if (phErrorNode) *phErrorNode = nullptr;
  if (logBuffer && bufferSize > 0) logBuffer[0] = '\0';
  return traced(__func__, graphInstantiate(phExec, hGraph));
}
SIM_ALIAS(cuGraphInstantiate, cuGraphInstantiate_v2)

SIM_API CUresult cuGraphLaunch(CUgraphExec hExec, CUstream h) {
  return traced(__func__, graphLaunch(hExec, h));
}
SIM_API CUresult cuGraphLaunch_ptsz(CUgraphExec hExec, CUstream h) {
  return traced(__func__, graphLaunch(hExec, perThreadIfNull(h)));
}

SIM_API CUresult cuGraphExecDestroy(CUgraphExec hExec) {
  Driver& d = driver();
  Lock lk(d.mu);
  return traced(__func__, d.graphExecs.erase(hExec) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE);
}

SIM_API CUresult cuGraphDestroy(CUgraph hGraph) {
  Driver& d = driver();
  Lock lk(d.mu);
  return traced(__func__, d.graphs.erase(hGraph) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE);
}

SIM_API CUresult cuEventCreate(CUevent* phEvent, unsigned int flags) {
  return traced(__func__, eventCreate(phEvent, flags));
}

SIM_API CUresult cuEventRecord(CUevent hEvent, CUstream h) {
  return traced(__func__, eventRecord(hEvent, h));
}
SIM_API CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream h) {
  return traced(__func__, eventRecord(hEvent, perThreadIfNull(h)));
}

SIM_API CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream h, unsigned int flags) {
  return traced(__func__, eventRecord(hEvent, h, flags));
}
SIM_API CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream h, unsigned int flags) {
  return traced(__func__, eventRecord(hEvent, perThreadIfNull(h), flags));
}

SIM_API CUresult cuEventQuery(CUevent hEvent) { return traced(__func__, eventQuery(hEvent)); }

SIM_API CUresult cuEventSynchronize(CUevent hEvent) {
  return traced(__func__, eventSynchronize(hEvent));
}

SIM_API CUresult cuEventElapsedTime_v2(float* ms, CUevent hStart, CUevent hEnd) {
  return traced(__func__, eventElapsedTime(ms, hStart, hEnd));
}
SIM_ALIAS(cuEventElapsedTime, cuEventElapsedTime_v2)

SIM_API CUresult cuEventDestroy_v2(CUevent hEvent) { return traced(__func__, eventDestroy(hEvent)); }
SIM_ALIAS(cuEventDestroy, cuEventDestroy_v2)

SIM_API CUresult cuLaunchHostFunc(CUstream h, CUhostFn fn, void* userData) {
  return traced(__func__, launchHostFunc(h, fn, userData));
}
SIM_API CUresult cuLaunchHostFunc_ptsz(CUstream h, CUhostFn fn, void* userData) {
  return traced(__func__, launchHostFunc(perThreadIfNull(h), fn, userData));
}

SIM_API CUresult cuGetErrorString(CUresult error, const char** pStr) {
  if (!pStr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = findErrorText(error);
  *pStr = e ? e->description : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_API CUresult cuGetErrorName(CUresult error, const char** pStr) {
  if (!pStr) return CUDA_ERROR_INVALID_VALUE;
  const ErrorText* e = findErrorText(error);
  *pStr = e ? e->name : nullptr;
  return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
