// GPU markers: a start and an end CUDA event around each operation on its stream, from
// per-context pools (no event is created per call once the pool is warm; a stream's context is
// looked up once per thread, not per call). A pool is a LIFO free list: the marker taken is
// the one given back last, still in cache (and so are its events in the driver), where a FIFO
// would cycle through every marker ever created. Events carry
// CU_EVENT_DISABLE_TIMING unless exact durations were asked for: timing events on the
// communication stream serialize NCCL/GEMM overlap under CUDA_DEVICE_MAX_CONNECTIONS=1
// (pytorch#143890, TransformerEngine#1353).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include "gpu/driver.h"

namespace ncclwatch {

struct ContextPool;

struct Marker {
  CUevent start = nullptr;
  CUevent end = nullptr;
  ContextPool* pool = nullptr;
  std::atomic<int> refs{0};  // in-flight operations sharing it (a group shares one per stream)
  uint32_t index = 0;                // in its pool
  std::atomic<uint32_t> next_free{0};  // free-list link: index + 1 of the next free marker, 0: none
};

enum class MarkResult { kMarked, kCaptured, kUnmonitored };

class GpuMarkers {
 public:
  GpuMarkers(const CudaDriver* driver, bool timing);
  ~GpuMarkers();

  // Hot path, application thread. On a stream being captured into a CUDA graph nothing is
  // inserted (kCaptured). Otherwise records the start event and returns the marker (kMarked).
  MarkResult Begin(CUstream stream, Marker** out);
  // Records the end event after the operation was launched. False if that failed (the marker
  // was released).
  bool End(Marker* m, CUstream stream);
  // Gives a marker back without it having been followed (the NCCL call failed).
  void Abandon(Marker* m);

  // Watchdog side. The watchdog thread must call PrepareThread() once first: it switches that
  // thread to relaxed capture mode, so its queries never invalidate a capture running in
  // another thread (as PyTorch's watchdog does since pytorch#148594).
  void PrepareThread() const;
  // CUDA_SUCCESS: reached; CUDA_ERROR_NOT_READY: not yet; anything else: an error.
  CUresult QueryStart(const Marker* m) const { return driver_->EventQuery(m->start); }
  CUresult QueryEnd(const Marker* m) const { return driver_->EventQuery(m->end); }
  float ElapsedMs(const Marker* m) const;
  // Drops one reference; the last one returns the marker to its pool.
  void Release(Marker* m);

  bool timing() const { return timing_; }
  size_t MarkersCreated() const { return created_.load(std::memory_order_relaxed); }
  // Markers per CUDA context at most: more in flight at once go unmonitored.
  static constexpr uint32_t kMaxMarkersPerContext = 16384;

 private:
  static constexpr int kMaxContexts = 64;
  ContextPool* PoolFor(CUcontext ctx);
  Marker* Acquire(CUstream stream);
  void ForgetStream(CUstream stream) const;

  const CudaDriver* driver_;
  bool timing_;
  struct Entry {
    std::atomic<CUcontext> ctx{nullptr};
    std::atomic<ContextPool*> pool{nullptr};
  };
  Entry pools_[kMaxContexts];
  std::mutex create_mu_;  // taken only to add a context pool
  std::atomic<size_t> created_{0};
};

}  // namespace ncclwatch
