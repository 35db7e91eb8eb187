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

// kCapturedWatched: the stream is being captured into a CUDA graph and the marker's events were
// recorded into the capture as external event records (CU_EVENT_RECORD_EXTERNAL): every launch
// of the graph records them again, so the watchdog can follow each replay. The marker then
// belongs to the graph for good (never given back). kCaptured: captured, nothing inserted.
enum class MarkResult { kMarked, kCaptured, kCapturedWatched, kUnmonitored };

class GpuMarkers {
 public:
  // `watch_captures`: put external event records around captured operations when the driver
  // has cuEventRecordWithFlags (else, or when off, a captured operation gets nothing).
  GpuMarkers(const CudaDriver* driver, bool timing, bool watch_captures = true);
  ~GpuMarkers();

  // Hot path, application thread. On a stream being captured into a CUDA graph: an external
  // start record into the capture (kCapturedWatched, with the marker), or nothing (kCaptured)
  // when the driver cannot or refuses. Otherwise records the start event and returns the marker
  // (kMarked).
  MarkResult Begin(CUstream stream, Marker** out);
  // Records the end event after the operation was launched. False if that failed (the marker
  // was released).
  bool End(Marker* m, CUstream stream);
  // The same for a kCapturedWatched marker: the external end record. False if the driver
  // refused it (the marker stays the graph's, never followed: its start may still be recorded).
  bool EndCaptured(Marker* m, CUstream stream);
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
  size_t CapturedMarkers() const { return captured_.load(std::memory_order_relaxed); }
  // Markers given to captured operations at most (each belongs to its graph for good): more
  // captured operations go unwatched, as before.
  static constexpr size_t kMaxCapturedMarkers = 4096;
  // Markers per CUDA context at most: more in flight at once go unmonitored.
  static constexpr uint32_t kMaxMarkersPerContext = 16384;

 private:
  static constexpr int kMaxContexts = 64;
  ContextPool* PoolFor(CUcontext ctx);
  Marker* Acquire(CUstream stream);
  void ForgetStream(CUstream stream) const;
  MarkResult BeginCaptured(CUstream stream, Marker** out);

  const CudaDriver* driver_;
  bool timing_;
  bool watch_captures_;
  struct Entry {
    std::atomic<CUcontext> ctx{nullptr};
    std::atomic<ContextPool*> pool{nullptr};
  };
  Entry pools_[kMaxContexts];
  std::mutex create_mu_;  // taken only to add a context pool
  std::atomic<size_t> created_{0};
  std::atomic<size_t> captured_{0};
  std::atomic<bool> capture_refused_{false};  // the driver refused an external record once
};

}  // namespace ncclwatch
