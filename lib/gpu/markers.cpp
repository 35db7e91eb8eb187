#include "gpu/markers.h"

#include "common/log.h"

namespace ncclwatch {

// Markers live in chunks that are never freed while the pool exists, so a free-list link can
// be read even after another thread took that marker; the head word carries a tag that every
// change bumps, so such a stale read makes the CAS fail instead of corrupting the list (ABA).
struct ContextPool {
  static constexpr uint32_t kChunk = 256;
  static constexpr uint32_t kMaxChunks = GpuMarkers::kMaxMarkersPerContext / kChunk;
  CUcontext ctx = nullptr;
  alignas(64) std::atomic<uint64_t> head{0};  // tag << 32 | (index + 1) of the first free marker
  std::atomic<Marker*> chunks[kMaxChunks] = {};
  uint32_t used = 0;  // markers handed out of the chunks, under grow_mu
  std::mutex grow_mu;

  // The head word after a change to `first` (index + 1, 0: empty): the tag goes up by one.
  static uint64_t NextHead(uint64_t head_word, uint32_t first) {
    return (head_word & ~0xffffffffull) + (1ull << 32) + first;
  }
  Marker* At(uint32_t index) const {
    return &chunks[index / kChunk].load(std::memory_order_acquire)[index % kChunk];
  }
  bool Pop(Marker** out) {
    uint64_t head_word = head.load(std::memory_order_acquire);
    for (;;) {
      const uint32_t first = static_cast<uint32_t>(head_word);
      if (first == 0) return false;
      Marker* m = At(first - 1);
      const uint64_t next = NextHead(head_word, m->next_free.load(std::memory_order_relaxed));
      if (head.compare_exchange_weak(head_word, next, std::memory_order_acq_rel, std::memory_order_acquire)) {
        *out = m;
        return true;
      }
    }
  }
  void Push(Marker* m) {
    uint64_t head_word = head.load(std::memory_order_relaxed);
    for (;;) {
      m->next_free.store(static_cast<uint32_t>(head_word), std::memory_order_relaxed);
      const uint64_t next = NextHead(head_word, m->index + 1);
      if (head.compare_exchange_weak(head_word, next, std::memory_order_acq_rel, std::memory_order_relaxed)) return;
    }
  }
  // A marker that was never used (its events are created by the caller), or null at the bound.
  Marker* Grow() {
    std::lock_guard<std::mutex> lock(grow_mu);
    if (used >= GpuMarkers::kMaxMarkersPerContext) return nullptr;
    const uint32_t index = used;
    std::atomic<Marker*>& chunk = chunks[index / kChunk];
    if (!chunk.load(std::memory_order_relaxed)) {
      Marker* fresh = new (std::nothrow) Marker[kChunk];
      if (!fresh) return nullptr;
      for (uint32_t i = 0; i < kChunk; ++i) {
        fresh[i].pool = this;
        fresh[i].index = index + i;
      }
      chunk.store(fresh, std::memory_order_release);
    }
    ++used;
    return At(index);
  }
  ~ContextPool() {
    for (auto& chunk : chunks) delete[] chunk.load(std::memory_order_relaxed);
  }
};

GpuMarkers::GpuMarkers(const CudaDriver* driver, bool timing, bool watch_captures)
    : driver_(driver), timing_(timing), watch_captures_(watch_captures) {}

// The runtime's GpuMarkers is never destroyed (the driver may already be shutting down at
// exit). One that is (tests) frees its memory, but never calls the driver to destroy events.
GpuMarkers::~GpuMarkers() {
  for (auto& e : pools_) delete e.pool.load(std::memory_order_acquire);
}

ContextPool* GpuMarkers::PoolFor(CUcontext ctx) {
  for (auto& e : pools_) {
    CUcontext c = e.ctx.load(std::memory_order_acquire);
    if (c == ctx) return e.pool.load(std::memory_order_acquire);
    if (c == nullptr) break;
  }
  std::lock_guard<std::mutex> lock(create_mu_);
  for (auto& e : pools_) {
    CUcontext c = e.ctx.load(std::memory_order_acquire);
    if (c == ctx) return e.pool.load(std::memory_order_acquire);
    if (c == nullptr) {
      auto* pool = new ContextPool;
      pool->ctx = ctx;
      e.pool.store(pool, std::memory_order_release);
      e.ctx.store(ctx, std::memory_order_release);
      return pool;
    }
  }
  return nullptr;  // more contexts than we track: those operations go unmonitored
}

namespace {
// The last few streams a thread used and their contexts: saves a driver call per operation,
// also where a thread alternates between streams (FSDP's all-gather and reduce-scatter
// streams, a pipeline's send and receive streams). Default-stream handles (0, legacy,
// per-thread) follow the current context and are not cached.
struct StreamCache {
  static constexpr int kEntries = 4;
  const GpuMarkers* owner = nullptr;
  CUstream stream[kEntries] = {};
  CUcontext ctx[kEntries] = {};
  int next = 0;  // the entry a new stream replaces (round robin)
};
thread_local StreamCache tl_stream_cache;

bool IsDefaultStream(CUstream s) {
  auto v = reinterpret_cast<uintptr_t>(s);
  return v <= 2;
}
}  // namespace

void GpuMarkers::ForgetStream(CUstream stream) const {
  StreamCache& cache = tl_stream_cache;
  if (cache.owner != this) return;
  for (int i = 0; i < StreamCache::kEntries; ++i)
    if (cache.stream[i] == stream) cache.stream[i] = nullptr, cache.ctx[i] = nullptr;
}

Marker* GpuMarkers::Acquire(CUstream stream) {
  CUcontext ctx = nullptr;
  StreamCache& cache = tl_stream_cache;
  const bool cacheable = !IsDefaultStream(stream);
  if (cache.owner != this) cache = StreamCache{this, {}, {}, 0};
  for (int i = 0; cacheable && i < StreamCache::kEntries && !ctx; ++i)
    if (cache.stream[i] == stream) ctx = cache.ctx[i];
  if (!ctx) {
    if (driver_->StreamGetCtx(stream, &ctx) != CUDA_SUCCESS || !ctx) {
      if (driver_->CtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) return nullptr;
    }
    if (cacheable) {
      cache.stream[cache.next] = stream;
      cache.ctx[cache.next] = ctx;
      cache.next = (cache.next + 1) % StreamCache::kEntries;
    }
  }
  ContextPool* pool = PoolFor(ctx);
  if (!pool) return nullptr;
  Marker* m = nullptr;
  if (!pool->Pop(&m)) {
    m = pool->Grow();        // pool empty (warm-up)
    if (!m) return nullptr;  // kMaxMarkersPerContext in flight: this one goes unmonitored
  }
  if (m->start) return m;
  // A new marker (or one whose events could not be created before): its pair is created in
  // the stream's context.
  CUcontext current = nullptr;
  driver_->CtxGetCurrent(&current);
  bool switched = current != ctx && driver_->CtxPushCurrent(ctx) == CUDA_SUCCESS;
  unsigned flags = timing_ ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING;
  bool ok = driver_->EventCreate(&m->start, flags) == CUDA_SUCCESS &&
            driver_->EventCreate(&m->end, flags) == CUDA_SUCCESS;
  if (switched) {
    CUcontext popped;
    driver_->CtxPopCurrent(&popped);
  }
  if (!ok) {  // kept in the pool without events: the next Acquire that pops it tries again
    if (m->start) driver_->EventDestroy(m->start);
    m->start = m->end = nullptr;
    pool->Push(m);
    return nullptr;
  }
  created_.fetch_add(1, std::memory_order_relaxed);
  return m;
}

MarkResult GpuMarkers::Begin(CUstream stream, Marker** out) {
  *out = nullptr;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = driver_->StreamIsCapturing(stream, &status);
  if (r != CUDA_SUCCESS) return MarkResult::kUnmonitored;  // e.g. legacy stream during a global capture
  if (status == CU_STREAM_CAPTURE_STATUS_ACTIVE) return BeginCaptured(stream, out);
  if (status != CU_STREAM_CAPTURE_STATUS_NONE) return MarkResult::kCaptured;  // invalidated: leave it
  Marker* m = Acquire(stream);
  if (!m) return MarkResult::kUnmonitored;
  if (driver_->EventRecord(m->start, stream) != CUDA_SUCCESS) {
    ForgetStream(stream);  // a reused handle in another context: look it up afresh next time
    Abandon(m);
    return MarkResult::kUnmonitored;
  }
  m->refs.store(1, std::memory_order_relaxed);
  *out = m;
  return MarkResult::kMarked;
}

bool GpuMarkers::End(Marker* m, CUstream stream) {
  if (driver_->EventRecord(m->end, stream) == CUDA_SUCCESS) return true;
  Abandon(m);
  return false;
}

// Only a call on the capturing stream itself: an external event record is stream work, legal
// in every capture mode (global, thread-local, relaxed), never a "potentially unsafe" call
// that could invalidate a capture. A marker comes from the stream's context pool; an event
// created for it (a cold pool) is created in that context, which capture allows too.
MarkResult GpuMarkers::BeginCaptured(CUstream stream, Marker** out) {
  if (!watch_captures_ || !driver_->EventRecordWithFlags || capture_refused_.load(std::memory_order_relaxed))
    return MarkResult::kCaptured;
  if (captured_.fetch_add(1, std::memory_order_relaxed) >= kMaxCapturedMarkers) {
    captured_.fetch_sub(1, std::memory_order_relaxed);
    return MarkResult::kCaptured;
  }
  Marker* m = Acquire(stream);
  if (!m) {
    captured_.fetch_sub(1, std::memory_order_relaxed);
    return MarkResult::kCaptured;
  }
  if (driver_->EventRecordWithFlags(m->start, stream, CU_EVENT_RECORD_EXTERNAL) != CUDA_SUCCESS) {
    // Nothing went into the graph: the marker goes back, and captures stay unwatched from now on.
    if (!capture_refused_.exchange(true, std::memory_order_relaxed))
      LogInfo("the CUDA driver refused an event record in a stream capture: operations captured into CUDA graphs "
              "are not watched during replays");
    captured_.fetch_sub(1, std::memory_order_relaxed);
    Abandon(m);
    return MarkResult::kCaptured;
  }
  m->refs.store(1, std::memory_order_relaxed);
  *out = m;
  return MarkResult::kCapturedWatched;
}

bool GpuMarkers::EndCaptured(Marker* m, CUstream stream) {
  if (driver_->EventRecordWithFlags(m->end, stream, CU_EVENT_RECORD_EXTERNAL) == CUDA_SUCCESS) return true;
  if (!capture_refused_.exchange(true, std::memory_order_relaxed))
    LogInfo("the CUDA driver refused an event record in a stream capture: operations captured into CUDA graphs "
            "are not watched during replays");
  return false;  // its start record is in the graph: the marker is the graph's, never reused
}

void GpuMarkers::Abandon(Marker* m) {
  m->refs.store(1, std::memory_order_relaxed);
  Release(m);
}

void GpuMarkers::PrepareThread() const {
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  driver_->ThreadExchangeStreamCaptureMode(&mode);
}

float GpuMarkers::ElapsedMs(const Marker* m) const {
  float ms = -1.f;
  if (!timing_ || driver_->EventElapsedTime(&ms, m->start, m->end) != CUDA_SUCCESS) return -1.f;
  return ms;
}

void GpuMarkers::Release(Marker* m) {
  if (m->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  m->pool->Push(m);
}

}  // namespace ncclwatch
