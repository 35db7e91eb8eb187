// Event records in stream capture and at graph replay, as the simulated CUDA driver models them
// per the driver API documentation (cuEventRecordWithFlags): external records become event
// record nodes that each launch records again (host-queryable); plain records in a capture make
// the event "captured"; what the real driver rejects, the simulator rejects.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#include "ncclwatch/cuda_abi.h"

namespace {

using namespace std::chrono_literals;

class Gate {
 public:
  static void hold(void* gate) { static_cast<Gate*>(gate)->wait(); }
  void open() {
    std::lock_guard<std::mutex> lk(mu_);
    opened_ = true;
    cv_.notify_all();
  }

 private:
  void wait() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return opened_; });
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool opened_ = false;
};

void makeCurrent() {
  CUcontext ctx = nullptr;
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  REQUIRE(cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
}

CUstream newStream() {
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  return s;
}

CUevent newEvent() {
  CUevent e = nullptr;
  REQUIRE(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING) == CUDA_SUCCESS);
  return e;
}

CUstreamCaptureStatus captureStatus(CUstream s) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  REQUIRE(cuStreamIsCapturing(s, &status) == CUDA_SUCCESS);
  return status;
}

// As the watchdog asks: from another thread, in relaxed capture mode.
CUresult queryFromWatchdog(CUevent ev) {
  CUresult result = CUDA_ERROR_UNKNOWN;
  std::thread t([&] {
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (cuThreadExchangeStreamCaptureMode(&m) == CUDA_SUCCESS) result = cuEventQuery(ev);
  });
  t.join();
  return result;
}

size_t captureDeps(CUstream s) {
  CUstreamCaptureStatus status;
  cuuint64_t id = 0;
  CUgraph graph = nullptr;
  const CUgraphNode* deps = nullptr;
  size_t n = 0;
  REQUIRE(cuStreamGetCaptureInfo_v2(s, &status, &id, &graph, &deps, &n) == CUDA_SUCCESS);
  return n;
}

}  // namespace

TEST_CASE("an external event record is invalid outside a capture, and unknown flags are refused") {
  makeCurrent();
  CUstream s = newStream();
  CUevent ev = newEvent();
  CHECK(cuEventRecordWithFlags(ev, s, CU_EVENT_RECORD_EXTERNAL) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuEventRecordWithFlags(ev, s, 0x2) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuEventRecordWithFlags(ev, s, CU_EVENT_RECORD_DEFAULT) == CUDA_SUCCESS);
  CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK(cuEventQuery(ev) == CUDA_SUCCESS);
}

TEST_CASE("a plain event record in a capture makes no node and leaves the event captured") {
  makeCurrent();
  CUstream s = newStream();
  CUevent ev = newEvent();
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(ev, s) == CUDA_SUCCESS);
  CHECK(captureDeps(s) == 0);
  CHECK(queryFromWatchdog(ev) == CUDA_ERROR_CAPTURED_EVENT);
  CHECK(cuEventSynchronize(ev) == CUDA_ERROR_CAPTURED_EVENT);
  CUgraph graph = nullptr;
  REQUIRE(cuStreamEndCapture(s, &graph) == CUDA_SUCCESS);
  CHECK(cuEventQuery(ev) == CUDA_ERROR_CAPTURED_EVENT);  // still, after the capture
  const char* name = nullptr;
  CHECK(cuGetErrorName(CUDA_ERROR_CAPTURED_EVENT, &name) == CUDA_SUCCESS);
  CHECK(std::string(name) == "CUDA_ERROR_CAPTURED_EVENT");
  // Recorded again outside a capture: usable again.
  REQUIRE(cuEventRecord(ev, s) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK(cuEventQuery(ev) == CUDA_SUCCESS);
  CHECK(cuGraphDestroy(graph) == CUDA_SUCCESS);
}

TEST_CASE("external event records in a capture are recorded again by each replay, in every capture mode") {
  const CUstreamCaptureMode modes[] = {CU_STREAM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                                       CU_STREAM_CAPTURE_MODE_RELAXED};
  for (CUstreamCaptureMode mode : modes) {
    CAPTURE(mode);
    makeCurrent();
    CUstream s = newStream();
    CUevent start = newEvent(), end = newEvent();
    Gate inside;  // the captured "collective": holds the stream until opened
    REQUIRE(cuStreamBeginCapture(s, mode) == CUDA_SUCCESS);
    REQUIRE(cuEventRecordWithFlags(start, s, CU_EVENT_RECORD_EXTERNAL) == CUDA_SUCCESS);
    REQUIRE(cuLaunchHostFunc(s, Gate::hold, &inside) == CUDA_SUCCESS);
    REQUIRE(cuEventRecordWithFlags(end, s, CU_EVENT_RECORD_EXTERNAL) == CUDA_SUCCESS);
    CHECK(captureDeps(s) == 1);
    CHECK(captureStatus(s) == CU_STREAM_CAPTURE_STATUS_ACTIVE);  // not invalidated
    // A relaxed thread's queries never disturb the capture; the records have not run.
    CHECK(queryFromWatchdog(start) == CUDA_SUCCESS);
    CHECK(queryFromWatchdog(end) == CUDA_SUCCESS);
    CUgraph graph = nullptr;
    REQUIRE(cuStreamEndCapture(s, &graph) == CUDA_SUCCESS);
    CUgraphExec exec = nullptr;
    REQUIRE(cuGraphInstantiateWithFlags(&exec, graph, 0) == CUDA_SUCCESS);

    // A replay behind blocked work: both records pending (the launch made them).
    Gate before;
    REQUIRE(cuLaunchHostFunc(s, Gate::hold, &before) == CUDA_SUCCESS);
    REQUIRE(cuGraphLaunch(exec, s) == CUDA_SUCCESS);
    CHECK(queryFromWatchdog(start) == CUDA_ERROR_NOT_READY);
    CHECK(queryFromWatchdog(end) == CUDA_ERROR_NOT_READY);
    before.open();
    // Inside the captured work: the start reached, the end not.
    for (int i = 0; i < 200 && queryFromWatchdog(start) != CUDA_SUCCESS; ++i) std::this_thread::sleep_for(5ms);
    CHECK(queryFromWatchdog(start) == CUDA_SUCCESS);
    CHECK(queryFromWatchdog(end) == CUDA_ERROR_NOT_READY);
    inside.open();
    REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
    CHECK(cuEventQuery(end) == CUDA_SUCCESS);
    // Each further replay records them again.
    for (int replay = 0; replay < 3; ++replay) {
      Gate hold;
      REQUIRE(cuLaunchHostFunc(s, Gate::hold, &hold) == CUDA_SUCCESS);
      REQUIRE(cuGraphLaunch(exec, s) == CUDA_SUCCESS);
      CHECK(cuEventQuery(end) == CUDA_ERROR_NOT_READY);
      hold.open();
      REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
      CHECK(cuEventQuery(start) == CUDA_SUCCESS);
      CHECK(cuEventQuery(end) == CUDA_SUCCESS);
    }
    CHECK(cuGraphExecDestroy(exec) == CUDA_SUCCESS);
    CHECK(cuGraphDestroy(graph) == CUDA_SUCCESS);
    CHECK(cuStreamDestroy(s) == CUDA_SUCCESS);
  }
}

TEST_CASE("an external record on an invalidated capture fails and adds nothing") {
  makeCurrent();
  CUstream s = newStream();
  CUevent ev = newEvent();
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CHECK(cuStreamSynchronize(s) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);  // spoils the capture
  CHECK(cuEventRecordWithFlags(ev, s, CU_EVENT_RECORD_EXTERNAL) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CUgraph graph = nullptr;
  CHECK(cuStreamEndCapture(s, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
}
