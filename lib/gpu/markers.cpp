#include "gpu/markers.h"

#include "common/log.h"

namespace ncclwatch {

struct ContextPool {
  // More than the watchdog's hand-off queue holds: markers coming back never overflow the pool.
  static constexpr size_t kPooled = 16384;
  CUcontext ctx = nullptr;
  MpmcQueue<Marker*> free{kPooled};
};

GpuMarkers::GpuMarkers(const CudaDriver* driver, bool timing) : driver_(driver), timing_(timing) {}

// The runtime's GpuMarkers is never destroyed (the driver may already be shutting down at
// exit). One that is (tests) frees its memory, but never calls the driver to destroy events.
GpuMarkers::~GpuMarkers() {
  for (auto& e : pools_) {
    ContextPool* pool = e.pool.load(std::memory_order_acquire);
    if (!pool) continue;
    Marker* m = nullptr;
    while (pool->free.TryPop(&m)) delete m;
    delete pool;
  }
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
// The last stream a thread used and its context pool: saves a driver call per operation.
// Default-stream handles (0, legacy, per-thread) follow the current context and are not cached.
struct StreamCache {
  const GpuMarkers* owner = nullptr;
  CUstream stream = nullptr;
  CUcontext ctx = nullptr;
};
thread_local StreamCache tl_stream_cache;

bool IsDefaultStream(CUstream s) {
  auto v = reinterpret_cast<uintptr_t>(s);
  return v <= 2;
}
}  // namespace

void GpuMarkers::ForgetStream(CUstream stream) const {
  if (tl_stream_cache.owner == this && tl_stream_cache.stream == stream) tl_stream_cache = StreamCache{};
}

Marker* GpuMarkers::Acquire(CUstream stream) {
  CUcontext ctx = nullptr;
  StreamCache& cache = tl_stream_cache;
  if (cache.owner == this && cache.stream == stream && !IsDefaultStream(stream)) {
    ctx = cache.ctx;
  } else {
    if (driver_->StreamGetCtx(stream, &ctx) != CUDA_SUCCESS || !ctx) {
      if (driver_->CtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) return nullptr;
    }
    cache = StreamCache{this, stream, ctx};
  }
  ContextPool* pool = PoolFor(ctx);
  if (!pool) return nullptr;
  Marker* m = nullptr;
  if (pool->free.TryPop(&m)) return m;
  // Pool empty (warm-up): create a pair in the stream's context.
  CUcontext current = nullptr;
  driver_->CtxGetCurrent(&current);
  bool switched = current != ctx && driver_->CtxPushCurrent(ctx) == CUDA_SUCCESS;
  unsigned flags = timing_ ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING;
  m = new Marker;
  m->pool = pool;
  bool ok = driver_->EventCreate(&m->start, flags) == CUDA_SUCCESS &&
            driver_->EventCreate(&m->end, flags) == CUDA_SUCCESS;
  if (switched) {
    CUcontext popped;
    driver_->CtxPopCurrent(&popped);
  }
  if (!ok) {
    if (m->start) driver_->EventDestroy(m->start);
    if (m->end) driver_->EventDestroy(m->end);
    delete m;
    return nullptr;
  }
  created_.fetch_add(1, std::memory_order_relaxed);
  return m;
}

MarkResult GpuMarkers::Begin(CUstream stream, Marker** out) {
  *out = nullptr;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r = driver_->StreamIsCapturing(stream, &status);
  if (r != CUDA_SUCCESS) return MarkResult::Unmonitored;  // e.g. legacy stream during a global capture
  if (status != CU_STREAM_CAPTURE_STATUS_NONE) return MarkResult::Captured;
  Marker* m = Acquire(stream);
  if (!m) return MarkResult::Unmonitored;
  if (driver_->EventRecord(m->start, stream) != CUDA_SUCCESS) {
    ForgetStream(stream);  // a reused handle in another context: look it up afresh next time
    Abandon(m);
    return MarkResult::Unmonitored;
  }
  m->refs.store(1, std::memory_order_relaxed);
  *out = m;
  return MarkResult::Marked;
}

bool GpuMarkers::End(Marker* m, CUstream stream) {
  if (driver_->EventRecord(m->end, stream) == CUDA_SUCCESS) return true;
  Abandon(m);
  return false;
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
  if (m->pool->free.TryPush(m)) return;
  driver_->EventDestroy(m->start);
  driver_->EventDestroy(m->end);
  delete m;
}

}  // namespace ncclwatch
