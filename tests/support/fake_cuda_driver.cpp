#include "fake_cuda_driver.h"

#include <cstdint>
#include <map>
#include <mutex>

namespace ncclwatch {
namespace testing {
namespace {

struct Gpu {
  std::map<CUevent, bool> reached;  // recorded events: reached yet?
  intptr_t next = 1;
  int created = 0;
  int fail_creates = 0;
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  CUstreamCaptureMode last_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
};
std::mutex g_mu;
Gpu g_gpu;

const CUcontext kContext = reinterpret_cast<CUcontext>(0x10);

CUresult Init(unsigned) { return CUDA_SUCCESS; }
CUresult Version(int* v) { return *v = 12080, CUDA_SUCCESS; }
CUresult CurrentCtx(CUcontext* c) { return *c = kContext, CUDA_SUCCESS; }
CUresult StreamCtx(CUstream, CUcontext* c) { return *c = kContext, CUDA_SUCCESS; }
CUresult PushCtx(CUcontext) { return CUDA_SUCCESS; }
CUresult PopCtx(CUcontext*) { return CUDA_SUCCESS; }
CUresult IsCapturing(CUstream, CUstreamCaptureStatus* s) {
  std::lock_guard<std::mutex> lock(g_mu);
  return *s = g_gpu.capture, CUDA_SUCCESS;
}
CUresult ExchangeMode(CUstreamCaptureMode* m) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::swap(g_gpu.last_mode, *m);
  return CUDA_SUCCESS;
}
CUresult Create(CUevent* e, unsigned) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_gpu.fail_creates > 0) return g_gpu.fail_creates--, CUDA_ERROR_OUT_OF_MEMORY;
  *e = reinterpret_cast<CUevent>(g_gpu.next++);
  g_gpu.created++;
  return CUDA_SUCCESS;
}
CUresult Record(CUevent e, CUstream) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_gpu.reached[e] = false, CUDA_SUCCESS;
}
CUresult Query(CUevent e) {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_gpu.reached[e] ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
CUresult Elapsed(float* ms, CUevent, CUevent) { return *ms = 1.5f, CUDA_SUCCESS; }
CUresult Destroy(CUevent) { return CUDA_SUCCESS; }
CUresult ErrorString(CUresult, const char** s) { return *s = "fake", CUDA_SUCCESS; }

}  // namespace

CudaDriver FakeCuda::Driver() {
  CudaDriver d;
  d.Init = &Init;
  d.DriverGetVersion = &Version;
  d.CtxGetCurrent = &CurrentCtx;
  d.CtxPushCurrent = &PushCtx;
  d.CtxPopCurrent = &PopCtx;
  d.StreamGetCtx = &StreamCtx;
  d.StreamIsCapturing = &IsCapturing;
  d.ThreadExchangeStreamCaptureMode = &ExchangeMode;
  d.EventCreate = &Create;
  d.EventRecord = &Record;
  d.EventQuery = &Query;
  d.EventElapsedTime = &Elapsed;
  d.EventDestroy = &Destroy;
  d.GetErrorString = &ErrorString;
  return d;
}

void FakeCuda::Reset() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_gpu = Gpu{};
}

void FakeCuda::Reach(CUevent e) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_gpu.reached[e] = true;
}

void FakeCuda::FailNextCreates(int n) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_gpu.fail_creates = n;
}

void FakeCuda::SetCapture(CUstreamCaptureStatus status) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_gpu.capture = status;
}

int FakeCuda::Created() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_gpu.created;
}

CUstreamCaptureMode FakeCuda::LastCaptureMode() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_gpu.last_mode;
}

}  // namespace testing
}  // namespace ncclwatch
