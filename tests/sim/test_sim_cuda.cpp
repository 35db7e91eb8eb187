// Tests of the simulated CUDA driver (libcuda.so.1 under tools/sim/cuda).
#include <catch2/catch.hpp>
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ncclwatch/cuda_abi.h"

// Per-thread-default-stream variants, which cuda_abi.h does not declare.
extern "C" {
CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void* userData);
CUresult cuStreamQuery_ptsz(CUstream hStream);
CUresult cuStreamSynchronize_ptsz(CUstream hStream);
}

namespace {

using namespace std::chrono_literals;

// Launched on a stream, holds it until opened.
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

// Records which host functions ran, in which order.
class RunLog {
 public:
  struct Entry {
    RunLog* log;
    int tag;
  };
  static void append(void* entry) {
    auto* e = static_cast<Entry*>(entry);
    std::lock_guard<std::mutex> lk(e->log->mu_);
    e->log->tags_.push_back(e->tag);
    e->log->cv_.notify_all();
  }
  std::vector<int> tags() {
    std::lock_guard<std::mutex> lk(mu_);
    return tags_;
  }
  bool waitForCount(size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return tags_.size() >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> tags_;
};

void sleep200ms(void*) { std::this_thread::sleep_for(200ms); }
void countUp(void* counter) { static_cast<std::atomic<int>*>(counter)->fetch_add(1); }

int expectedDeviceCount() {
  const char* env = std::getenv("NCCLWATCH_SIM_DEVICES");
  return env ? std::atoi(env) : 8;
}

CUcontext makePrimaryCurrent(CUdevice dev) {
  CUcontext ctx = nullptr;
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  REQUIRE(cuDevicePrimaryCtxRetain(&ctx, dev) == CUDA_SUCCESS);
  REQUIRE(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
  return ctx;
}

CUstream newStream() {
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) == CUDA_SUCCESS);
  return s;
}

CUevent newEvent(unsigned flags = CU_EVENT_DEFAULT) {
  CUevent e = nullptr;
  REQUIRE(cuEventCreate(&e, flags) == CUDA_SUCCESS);
  return e;
}

CUstreamCaptureStatus captureStatus(CUstream s) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  REQUIRE(cuStreamIsCapturing(s, &status) == CUDA_SUCCESS);
  return status;
}

// Runs `call` on a new thread whose capture-interaction mode is `mode`.
CUresult callFromThread(CUstreamCaptureMode mode, const std::function<CUresult()>& call) {
  CUresult result = CUDA_ERROR_UNKNOWN;
  std::thread t([&] {
    CUstreamCaptureMode m = mode;
    if (cuThreadExchangeStreamCaptureMode(&m) == CUDA_SUCCESS) result = call();
  });
  t.join();
  return result;
}

}  // namespace

TEST_CASE("devices, primary contexts and the context stack") {
  int count = 0;
  REQUIRE(cuInit(0) == CUDA_SUCCESS);
  REQUIRE(cuInit(0) == CUDA_SUCCESS);  // any number of times
  REQUIRE(cuDeviceGetCount(&count) == CUDA_SUCCESS);
  CHECK(count == expectedDeviceCount());
  REQUIRE(count >= 2);
  int version = 0;
  CHECK(cuDriverGetVersion(&version) == CUDA_SUCCESS);
  CHECK(version == 12080);

  CUdevice dev = -1;
  CHECK(cuDeviceGet(&dev, count - 1) == CUDA_SUCCESS);
  CHECK(dev == count - 1);
  CHECK(cuDeviceGet(&dev, count) == CUDA_ERROR_INVALID_DEVICE);
  char bus0[32], bus1[32], name[64];
  CHECK(cuDeviceGetPCIBusId(bus0, sizeof bus0, 0) == CUDA_SUCCESS);
  CHECK(cuDeviceGetPCIBusId(bus1, sizeof bus1, 1) == CUDA_SUCCESS);
  CHECK(std::string(bus0) != std::string(bus1));
  CHECK(cuDeviceGetName(name, sizeof name, 0) == CUDA_SUCCESS);
  CHECK(std::strlen(name) > 0);

  // Run on a fresh thread: its context stack starts empty.
  std::thread([] {
    CUcontext ctx0 = nullptr, ctx1 = nullptr, got = nullptr;
    CUdevice dev = -1;
    REQUIRE(cuDevicePrimaryCtxRetain(&ctx0, 0) == CUDA_SUCCESS);
    REQUIRE(cuDevicePrimaryCtxRetain(&ctx1, 1) == CUDA_SUCCESS);
    CHECK(ctx0 != ctx1);
    CHECK(cuCtxGetCurrent(&got) == CUDA_SUCCESS);
    CHECK(got == nullptr);

    REQUIRE(cuCtxSetCurrent(ctx0) == CUDA_SUCCESS);
    CHECK(cuCtxGetDevice(&dev) == CUDA_SUCCESS);
    CHECK(dev == 0);
    REQUIRE(cuCtxPushCurrent(ctx1) == CUDA_SUCCESS);
    CHECK(cuCtxGetDevice(&dev) == CUDA_SUCCESS);
    CHECK(dev == 1);

    CUstream s = newStream();  // belongs to the current context, ctx1
    CHECK(cuStreamGetCtx(s, &got) == CUDA_SUCCESS);
    CHECK(got == ctx1);

    CHECK(cuCtxPopCurrent(&got) == CUDA_SUCCESS);
    CHECK(got == ctx1);
    CHECK(cuCtxGetCurrent(&got) == CUDA_SUCCESS);
    CHECK(got == ctx0);
    CHECK(cuCtxPopCurrent(&got) == CUDA_SUCCESS);
    CHECK(got == ctx0);
    CHECK(cuCtxPopCurrent(&got) == CUDA_ERROR_INVALID_CONTEXT);
    CHECK(cuCtxGetCurrent(&got) == CUDA_SUCCESS);
    CHECK(got == nullptr);
    CHECK(cuCtxPushCurrent(reinterpret_cast<CUcontext>(&dev)) == CUDA_ERROR_INVALID_CONTEXT);

    CHECK(cuStreamDestroy(s) == CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxRelease(0) == CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxRelease(1) == CUDA_SUCCESS);
  }).join();
}

TEST_CASE("a stream runs its work in FIFO order") {
  makePrimaryCurrent(0);
  CUstream s = newStream();
  CUevent ev = newEvent();
  RunLog log;
  RunLog::Entry first{&log, 1}, second{&log, 2}, third{&log, 3};

  REQUIRE(cuLaunchHostFunc(s, sleep200ms, nullptr) == CUDA_SUCCESS);
  REQUIRE(cuLaunchHostFunc(s, RunLog::append, &first) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(ev, s) == CUDA_SUCCESS);
  REQUIRE(cuLaunchHostFunc(s, RunLog::append, &second) == CUDA_SUCCESS);
  REQUIRE(cuLaunchHostFunc(s, RunLog::append, &third) == CUDA_SUCCESS);

  // The sleeping host function delays everything behind it, the event included.
  CHECK(cuEventQuery(ev) == CUDA_ERROR_NOT_READY);
  CHECK(cuStreamQuery(s) == CUDA_ERROR_NOT_READY);
  CHECK(log.tags().empty());

  REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK(cuEventQuery(ev) == CUDA_SUCCESS);
  CHECK(cuStreamQuery(s) == CUDA_SUCCESS);
  CHECK(log.tags() == std::vector<int>{1, 2, 3});

  CHECK(cuEventDestroy(ev) == CUDA_SUCCESS);
  CHECK(cuStreamDestroy(s) == CUDA_SUCCESS);
}

TEST_CASE("events complete independently on different streams") {
  makePrimaryCurrent(0);
  CUstream blocked = newStream(), free = newStream();
  CUevent onBlocked = newEvent(), onFree = newEvent(), neverRecorded = newEvent();
  Gate gate;

  CHECK(cuEventQuery(neverRecorded) == CUDA_SUCCESS);

  REQUIRE(cuLaunchHostFunc(blocked, Gate::hold, &gate) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(onBlocked, blocked) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(onFree, free) == CUDA_SUCCESS);
  CHECK(cuEventSynchronize(onFree) == CUDA_SUCCESS);
  CHECK(cuEventQuery(onFree) == CUDA_SUCCESS);
  CHECK(cuEventQuery(onBlocked) == CUDA_ERROR_NOT_READY);

  // Re-recording a completed event behind the blocked work makes it pending again.
  REQUIRE(cuEventRecord(onFree, blocked) == CUDA_SUCCESS);
  CHECK(cuEventQuery(onFree) == CUDA_ERROR_NOT_READY);

  gate.open();
  CHECK(cuEventSynchronize(onBlocked) == CUDA_SUCCESS);
  CHECK(cuEventSynchronize(onFree) == CUDA_SUCCESS);
  CHECK(cuEventQuery(onBlocked) == CUDA_SUCCESS);

  for (CUevent e : {onBlocked, onFree, neverRecorded}) CHECK(cuEventDestroy(e) == CUDA_SUCCESS);
  CHECK(cuEventQuery(onFree) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuStreamDestroy(blocked) == CUDA_SUCCESS);
  CHECK(cuStreamDestroy(free) == CUDA_SUCCESS);
}

TEST_CASE("cuEventElapsedTime") {
  makePrimaryCurrent(0);
  CUstream s = newStream();
  CUevent start = newEvent(), end = newEvent(), untimed = newEvent(CU_EVENT_DISABLE_TIMING);
  Gate gate;
  float ms = -1;

  CHECK(cuEventElapsedTime(&ms, start, end) == CUDA_ERROR_INVALID_HANDLE);  // never recorded

  REQUIRE(cuEventRecord(start, s) == CUDA_SUCCESS);
  REQUIRE(cuLaunchHostFunc(s, Gate::hold, &gate) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(end, s) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(untimed, s) == CUDA_SUCCESS);
  CHECK(cuEventElapsedTime(&ms, start, end) == CUDA_ERROR_NOT_READY);

  std::this_thread::sleep_for(50ms);
  gate.open();
  REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
  REQUIRE(cuEventElapsedTime(&ms, start, end) == CUDA_SUCCESS);
  CHECK(ms >= 40.0f);
  CHECK(ms < 10000.0f);

  CHECK(cuEventElapsedTime(&ms, start, untimed) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuEventElapsedTime(&ms, untimed, end) == CUDA_ERROR_INVALID_HANDLE);

  for (CUevent e : {start, end, untimed}) CHECK(cuEventDestroy(e) == CUDA_SUCCESS);
  CHECK(cuStreamDestroy(s) == CUDA_SUCCESS);
}

TEST_CASE("stream capture records work into a replayable graph") {
  makePrimaryCurrent(0);
  CUstream s = newStream();
  CUevent ev = newEvent();
  std::atomic<int> runs{0};

  CHECK(captureStatus(s) == CU_STREAM_CAPTURE_STATUS_NONE);
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
  CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_ERROR_ILLEGAL_STATE);
  CHECK(captureStatus(s) == CU_STREAM_CAPTURE_STATUS_ACTIVE);

  CUstreamCaptureStatus status;
  cuuint64_t id = 0;
  CUgraph captureGraph = nullptr;
  const CUgraphNode* deps = nullptr;
  size_t numDeps = 99;
  REQUIRE(cuStreamGetCaptureInfo_v2(s, &status, &id, &captureGraph, &deps, &numDeps) ==
          CUDA_SUCCESS);
  CHECK(status == CU_STREAM_CAPTURE_STATUS_ACTIVE);
  CHECK(id != 0);
  CHECK(captureGraph != nullptr);
  CHECK(numDeps == 0);

  REQUIRE(cuLaunchHostFunc(s, countUp, &runs) == CUDA_SUCCESS);
  // An external record is legal while capturing: it becomes an event record node.
  REQUIRE(cuEventRecordWithFlags(ev, s, CU_EVENT_RECORD_EXTERNAL) == CUDA_SUCCESS);
  REQUIRE(cuStreamGetCaptureInfo_v2(s, &status, &id, &captureGraph, &deps, &numDeps) ==
          CUDA_SUCCESS);
  CHECK(numDeps == 1);
  CHECK(deps != nullptr);
  // The record was captured, not performed (asked from a RELAXED thread: from this one, a
  // query would invalidate the GLOBAL capture).
  CHECK(callFromThread(CU_STREAM_CAPTURE_MODE_RELAXED, [&] { return cuEventQuery(ev); }) ==
        CUDA_SUCCESS);

  CUgraph graph = nullptr;
  REQUIRE(cuStreamEndCapture(s, &graph) == CUDA_SUCCESS);
  REQUIRE(graph != nullptr);
  CHECK(captureStatus(s) == CU_STREAM_CAPTURE_STATUS_NONE);
  CHECK(cuStreamSynchronize(s) == CUDA_SUCCESS);
  CHECK(runs == 0);  // captured, never executed

  CUgraphExec exec = nullptr;
  REQUIRE(cuGraphInstantiateWithFlags(&exec, graph, 0) == CUDA_SUCCESS);
  for (int launch = 1; launch <= 3; ++launch) {
    REQUIRE(cuGraphLaunch(exec, s) == CUDA_SUCCESS);
    REQUIRE(cuStreamSynchronize(s) == CUDA_SUCCESS);
    CHECK(runs == launch);
    CHECK(cuEventQuery(ev) == CUDA_SUCCESS);
  }

  // A launch behind blocked work leaves the graph's event pending until it runs.
  Gate gate;
  REQUIRE(cuLaunchHostFunc(s, Gate::hold, &gate) == CUDA_SUCCESS);
  REQUIRE(cuGraphLaunch(exec, s) == CUDA_SUCCESS);
  CHECK(cuEventQuery(ev) == CUDA_ERROR_NOT_READY);
  gate.open();
  REQUIRE(cuEventSynchronize(ev) == CUDA_SUCCESS);
  CHECK(runs == 4);

  // Each capture gets its own id.
  cuuint64_t secondId = 0;
  REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
  REQUIRE(cuStreamGetCaptureInfo_v2(s, &status, &secondId, nullptr, nullptr, nullptr) ==
          CUDA_SUCCESS);
  CHECK(secondId != id);
  CUgraph empty = nullptr;
  REQUIRE(cuStreamEndCapture(s, &empty) == CUDA_SUCCESS);
  CHECK(cuStreamEndCapture(s, &empty) == CUDA_ERROR_ILLEGAL_STATE);

  CHECK(cuGraphExecDestroy(exec) == CUDA_SUCCESS);
  CHECK(cuGraphDestroy(graph) == CUDA_SUCCESS);
  CHECK(cuGraphDestroy(empty) == CUDA_SUCCESS);
  CHECK(cuEventDestroy(ev) == CUDA_SUCCESS);
  CHECK(cuStreamDestroy(s) == CUDA_SUCCESS);
}

TEST_CASE("unsafe calls during capture follow the capture-interaction modes") {
  makePrimaryCurrent(0);
  CUstream s = newStream(), other = newStream();
  CUevent ev = newEvent();
  CUgraph graph = nullptr;
  auto queryEvent = [&] { return cuEventQuery(ev); };
  auto endCapture = [&] {
    CUresult r = cuStreamEndCapture(s, &graph);
    if (graph) cuGraphDestroy(graph);
    return r;
  };

  SECTION("another thread in GLOBAL mode invalidates a GLOBAL capture") {
    REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    CHECK(callFromThread(CU_STREAM_CAPTURE_MODE_GLOBAL, queryEvent) ==
          CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK(captureStatus(s) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CHECK(cuLaunchHostFunc(s, countUp, nullptr) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(endCapture() == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(graph == nullptr);
    CHECK(captureStatus(s) == CU_STREAM_CAPTURE_STATUS_NONE);
    CHECK(cuEventQuery(ev) == CUDA_SUCCESS);  // no capture left: allowed again
  }

  SECTION("each unsafe call from a GLOBAL thread invalidates a GLOBAL capture") {
    CUdeviceptr mem = 0;
    REQUIRE(cuMemAlloc(&mem, 64) == CUDA_SUCCESS);
    std::vector<std::pair<const char*, std::function<CUresult()>>> unsafeCalls = {
        {"cuEventQuery", queryEvent},
        {"cuEventSynchronize", [&] { return cuEventSynchronize(ev); }},
        {"cuStreamQuery", [&] { return cuStreamQuery(other); }},
        {"cuStreamSynchronize", [&] { return cuStreamSynchronize(other); }},
        {"cuMemAlloc", [&] { CUdeviceptr p; return cuMemAlloc(&p, 16); }},
        {"cuMemFree", [&] { return cuMemFree(mem); }},
    };
    for (auto& call : unsafeCalls) {
      INFO(call.first);
      REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
      CHECK(callFromThread(CU_STREAM_CAPTURE_MODE_GLOBAL, call.second) ==
            CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
      CHECK(endCapture() == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    }
    CHECK(cuMemFree(mem) == CUDA_SUCCESS);  // the refused free did not free it
  }

  SECTION("threads in RELAXED or THREAD_LOCAL mode leave other threads' captures alone") {
    REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    CHECK(callFromThread(CU_STREAM_CAPTURE_MODE_RELAXED, queryEvent) == CUDA_SUCCESS);
    CHECK(callFromThread(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL, queryEvent) == CUDA_SUCCESS);
    CHECK(callFromThread(CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                         [&] { return cuStreamSynchronize(other); }) == CUDA_SUCCESS);
    CHECK(captureStatus(s) == CU_STREAM_CAPTURE_STATUS_ACTIVE);
    CHECK(endCapture() == CUDA_SUCCESS);
  }

  SECTION("a THREAD_LOCAL capture is not affected by other GLOBAL threads") {
    REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
    CHECK(callFromThread(CU_STREAM_CAPTURE_MODE_GLOBAL, queryEvent) == CUDA_SUCCESS);
    CHECK(endCapture() == CUDA_SUCCESS);
  }

  SECTION("the capturing thread may not make unsafe calls unless RELAXED") {
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    REQUIRE(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
    CHECK(mode == CU_STREAM_CAPTURE_MODE_GLOBAL);  // the default
    REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) == CUDA_SUCCESS);
    CHECK(cuEventQuery(ev) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK(endCapture() == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    REQUIRE(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
    CHECK(mode == CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    CHECK(cuEventQuery(ev) == CUDA_SUCCESS);
    CHECK(endCapture() == CUDA_SUCCESS);

    mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    REQUIRE(cuThreadExchangeStreamCaptureMode(&mode) == CUDA_SUCCESS);
  }

  SECTION("a RELAXED capture is never invalidated by unsafe calls") {
    REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
    CHECK(cuEventQuery(ev) == CUDA_SUCCESS);
    CHECK(callFromThread(CU_STREAM_CAPTURE_MODE_GLOBAL, queryEvent) == CUDA_SUCCESS);
    CHECK(endCapture() == CUDA_SUCCESS);
  }

  SECTION("synchronizing with the capturing stream fails and invalidates, in any mode") {
    REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
    CHECK(cuStreamQuery(s) == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK(captureStatus(s) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CHECK(endCapture() == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
    CHECK(callFromThread(CU_STREAM_CAPTURE_MODE_RELAXED, [&] { return cuStreamSynchronize(s); }) ==
          CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK(endCapture() == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  }

  SECTION("a non-RELAXED capture must be ended by the thread that began it") {
    REQUIRE(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL) == CUDA_SUCCESS);
    CHECK(callFromThread(CU_STREAM_CAPTURE_MODE_RELAXED, endCapture) ==
          CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    CHECK(endCapture() == CUDA_SUCCESS);
  }

  CHECK(cuEventDestroy(ev) == CUDA_SUCCESS);
  CHECK(cuStreamDestroy(s) == CUDA_SUCCESS);
  CHECK(cuStreamDestroy(other) == CUDA_SUCCESS);
}

TEST_CASE("the legacy and per-thread default streams") {
  makePrimaryCurrent(0);
  CUevent ev = newEvent();

  SECTION("handle 0 and CU_STREAM_LEGACY are the same FIFO") {
    Gate gate;
    REQUIRE(cuLaunchHostFunc(nullptr, Gate::hold, &gate) == CUDA_SUCCESS);
    REQUIRE(cuEventRecord(ev, CU_STREAM_LEGACY) == CUDA_SUCCESS);
    CHECK(cuEventQuery(ev) == CUDA_ERROR_NOT_READY);
    CHECK(cuStreamQuery(nullptr) == CUDA_ERROR_NOT_READY);
    gate.open();
    CHECK(cuStreamSynchronize(CU_STREAM_LEGACY) == CUDA_SUCCESS);
    CHECK(cuEventQuery(ev) == CUDA_SUCCESS);
    CHECK(cuStreamBeginCapture(nullptr, CU_STREAM_CAPTURE_MODE_RELAXED) ==
          CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  }

  SECTION("each thread has its own per-thread stream; _ptsz maps handle 0 to it") {
    Gate gate;
    REQUIRE(cuLaunchHostFunc_ptsz(nullptr, Gate::hold, &gate) == CUDA_SUCCESS);
    REQUIRE(cuEventRecord(ev, CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
    CHECK(cuStreamQuery(CU_STREAM_PER_THREAD) == CUDA_ERROR_NOT_READY);
    CHECK(cuStreamQuery_ptsz(nullptr) == CUDA_ERROR_NOT_READY);
    CHECK(cuStreamQuery(nullptr) == CUDA_SUCCESS);  // the legacy stream is not blocked

    std::atomic<int> runs{0};
    std::thread([&] {
      REQUIRE(cuLaunchHostFunc(CU_STREAM_PER_THREAD, countUp, &runs) == CUDA_SUCCESS);
      CHECK(cuStreamSynchronize(CU_STREAM_PER_THREAD) == CUDA_SUCCESS);
    }).join();
    CHECK(runs == 1);
    CHECK(cuEventQuery(ev) == CUDA_ERROR_NOT_READY);

    gate.open();
    CHECK(cuStreamSynchronize_ptsz(nullptr) == CUDA_SUCCESS);
    CHECK(cuEventQuery(ev) == CUDA_SUCCESS);
  }

  SECTION("the legacy stream cannot be used while a blocking stream captures") {
    CUstream blocking = nullptr, nonBlocking = newStream();
    REQUIRE(cuStreamCreate(&blocking, CU_STREAM_DEFAULT) == CUDA_SUCCESS);
    CUgraph graph = nullptr;
    CUstreamCaptureStatus status;
    std::atomic<int> runs{0};

    REQUIRE(cuStreamBeginCapture(nonBlocking, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
    CHECK(cuStreamIsCapturing(nullptr, &status) == CUDA_SUCCESS);
    CHECK(cuLaunchHostFunc(nullptr, countUp, &runs) == CUDA_SUCCESS);
    CHECK(cuStreamSynchronize(nullptr) == CUDA_SUCCESS);
    CHECK(runs == 1);
    REQUIRE(cuStreamEndCapture(nonBlocking, &graph) == CUDA_SUCCESS);
    CHECK(cuGraphDestroy(graph) == CUDA_SUCCESS);

    REQUIRE(cuStreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_RELAXED) == CUDA_SUCCESS);
    CHECK(cuStreamIsCapturing(nullptr, &status) == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    CHECK(captureStatus(blocking) == CU_STREAM_CAPTURE_STATUS_ACTIVE);  // asking is harmless
    CHECK(cuEventRecord(ev, nullptr) == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    CHECK(captureStatus(blocking) == CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CHECK(cuStreamEndCapture(blocking, &graph) == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(cuStreamIsCapturing(nullptr, &status) == CUDA_SUCCESS);

    CHECK(cuStreamDestroy(blocking) == CUDA_SUCCESS);
    CHECK(cuStreamDestroy(nonBlocking) == CUDA_SUCCESS);
  }

  CHECK(cuEventDestroy(ev) == CUDA_SUCCESS);
}

TEST_CASE("destroying a stream with pending work drains it first") {
  makePrimaryCurrent(0);
  CUstream s = newStream();
  CUevent ev = newEvent();
  Gate gate;
  RunLog log;
  std::vector<RunLog::Entry> entries;
  for (int i = 0; i < 5; ++i) entries.push_back({&log, i});

  REQUIRE(cuLaunchHostFunc(s, Gate::hold, &gate) == CUDA_SUCCESS);
  for (auto& e : entries) REQUIRE(cuLaunchHostFunc(s, RunLog::append, &e) == CUDA_SUCCESS);
  REQUIRE(cuEventRecord(ev, s) == CUDA_SUCCESS);
  // Returns at once, as the real driver does; the handles go away, the work does not.
  REQUIRE(cuStreamDestroy(s) == CUDA_SUCCESS);
  REQUIRE(cuEventDestroy(ev) == CUDA_SUCCESS);
  CHECK(cuStreamQuery(s) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(cuStreamDestroy(s) == CUDA_ERROR_INVALID_HANDLE);
  CHECK(log.tags().empty());

  gate.open();
  REQUIRE(log.waitForCount(entries.size(), 10s));
  CHECK(log.tags() == std::vector<int>{0, 1, 2, 3, 4});

  // The retired worker is reaped by a later create/destroy.
  CUstream next = newStream();
  CHECK(cuStreamDestroy(next) == CUDA_SUCCESS);
}

namespace {
struct Relay {
  CUstream target;
  std::atomic<int>* runs;
};
void relayToTarget(void* p) {
  auto* r = static_cast<Relay*>(p);
  cuLaunchHostFunc(r->target, countUp, r->runs);
}
}  // namespace

TEST_CASE("host functions may call back into the driver") {
  makePrimaryCurrent(0);
  CUstream a = newStream(), b = newStream();
  std::atomic<int> runs{0};
  Relay relay{b, &runs};
  REQUIRE(cuLaunchHostFunc(a, relayToTarget, &relay) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(a) == CUDA_SUCCESS);
  REQUIRE(cuStreamSynchronize(b) == CUDA_SUCCESS);
  CHECK(runs == 1);
  CHECK(cuStreamDestroy(a) == CUDA_SUCCESS);
  CHECK(cuStreamDestroy(b) == CUDA_SUCCESS);
}

TEST_CASE("device memory is host memory") {
  makePrimaryCurrent(0);
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, 100) == CUDA_SUCCESS);
  CHECK(p % 256 == 0);
  REQUIRE(cuMemsetD8(p, 0xab, 100) == CUDA_SUCCESS);
  unsigned char out[100] = {};
  REQUIRE(cuMemcpyDtoH(out, p, sizeof out) == CUDA_SUCCESS);
  CHECK(out[0] == 0xab);
  CHECK(out[99] == 0xab);
  const char text[] = "hello";
  REQUIRE(cuMemcpyHtoD(p, text, sizeof text) == CUDA_SUCCESS);
  REQUIRE(cuMemcpyDtoH(out, p, sizeof text) == CUDA_SUCCESS);
  CHECK(std::string(reinterpret_cast<char*>(out)) == "hello");
  CHECK(cuMemAlloc(&p, 0) == CUDA_ERROR_INVALID_VALUE);
  CHECK(cuMemFree(p) == CUDA_SUCCESS);
  CHECK(cuMemFree(p) == CUDA_ERROR_INVALID_VALUE);
}

TEST_CASE("error names and strings") {
  const char* text = nullptr;
  CHECK(cuGetErrorName(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, &text) == CUDA_SUCCESS);
  CHECK(std::string(text) == "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED");
  CHECK(cuGetErrorString(CUDA_ERROR_NOT_READY, &text) == CUDA_SUCCESS);
  CHECK(std::string(text) == "device not ready");
  CHECK(cuGetErrorName(static_cast<CUresult>(12345), &text) == CUDA_ERROR_INVALID_VALUE);
  CHECK(text == nullptr);
}

TEST_CASE("every driver symbol is exported") {
  std::vector<std::string> names = {
      "cuInit", "cuDriverGetVersion", "cuDeviceGet", "cuDeviceGetCount", "cuDeviceGetName",
      "cuDeviceGetPCIBusId", "cuDevicePrimaryCtxRetain", "cuCtxGetCurrent", "cuCtxSetCurrent",
      "cuCtxGetDevice", "cuStreamCreate", "cuThreadExchangeStreamCaptureMode",
      "cuGraphInstantiate", "cuGraphInstantiate_v2", "cuGraphInstantiateWithFlags",
      "cuGraphExecDestroy", "cuGraphDestroy", "cuEventCreate", "cuEventQuery",
      "cuEventSynchronize", "cuGetErrorString", "cuGetErrorName"};
  for (const char* base : {"cuDevicePrimaryCtxRelease", "cuCtxPushCurrent", "cuCtxPopCurrent",
                           "cuMemAlloc", "cuMemFree", "cuStreamDestroy", "cuEventElapsedTime",
                           "cuEventDestroy"})
    for (const char* suffix : {"", "_v2"}) names.push_back(std::string(base) + suffix);
  for (const char* base : {"cuMemcpyHtoD", "cuMemcpyDtoH", "cuMemsetD8"})
    for (const char* suffix : {"", "_v2", "_v2_ptds"}) names.push_back(std::string(base) + suffix);
  for (const char* base : {"cuStreamSynchronize", "cuStreamQuery", "cuStreamGetCtx",
                           "cuStreamIsCapturing", "cuStreamEndCapture", "cuGraphLaunch",
                           "cuEventRecord", "cuLaunchHostFunc", "cuStreamBeginCapture",
                           "cuStreamBeginCapture_v2", "cuStreamGetCaptureInfo",
                           "cuStreamGetCaptureInfo_v2", "cuStreamGetCaptureInfo_v3"})
    for (const char* suffix : {"", "_ptsz"}) names.push_back(std::string(base) + suffix);
  // Every name libncclwatch's loader may ask for.
#define NCCLWATCH_TEST_LOADER_NAMES(field, params, sym1, sym2) \
  names.push_back(sym1);                                       \
  names.push_back(sym2);
  NCCLWATCH_FOR_EACH_DRIVER_FN(NCCLWATCH_TEST_LOADER_NAMES)
#undef NCCLWATCH_TEST_LOADER_NAMES

  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  REQUIRE(lib != nullptr);
  for (const std::string& name : names) {
    INFO(name);
    CHECK(dlsym(lib, name.c_str()) != nullptr);
  }
  dlclose(lib);
}
