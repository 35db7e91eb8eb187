// Operations captured into CUDA graphs (issue 47), over the fake CUDA driver: the markers put
// external records into a capture, or nothing when the driver cannot; the watchdog follows each
// replay (launched, inside, done), counts the replays it sees, reports a replay inside the
// operation past its deadline once, and never one that is only launched.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "fake_cuda_driver.h"
#include "watchdog/watchdog.h"

using namespace ncclwatch;

namespace {

using testing::FakeCuda;

int g_external_records = 0;
CUresult RecordExternal(CUevent, CUstream, unsigned flags) {
  // At capture an external record changes nothing on the event: it becomes a graph node.
  if (flags != CU_EVENT_RECORD_EXTERNAL) return CUDA_ERROR_INVALID_VALUE;
  ++g_external_records;
  return CUDA_SUCCESS;
}
CUresult RefuseExternal(CUevent, CUstream, unsigned) { return CUDA_ERROR_INVALID_VALUE; }

constexpr uint64_t S = 1000000000ull;
const CUstream kStream = reinterpret_cast<CUstream>(0x5);

struct Bench {
  Config config;
  CudaDriver driver;
  FlightRing ring{64};
  ThreadRegistry threads;
  std::unique_ptr<GpuMarkers> markers;
  CommInfo comm;
  std::vector<std::string> stalls;
  std::vector<InflightView> stalled;
  std::vector<Recovery> recoveries;
  std::unique_ptr<Watchdog> wd;

  explicit Bench(CUresult (*record_with_flags)(CUevent, CUstream, unsigned) = &RecordExternal) {
    FakeCuda::Reset();
    g_external_records = 0;
    driver = FakeCuda::Driver();
    driver.EventRecordWithFlags = record_with_flags;
    markers = std::make_unique<GpuMarkers>(&driver, false);
    config.timeout.default_s = 5;
    config.adaptive = 0;
    comm.id = 77;
    comm.size = 4;
    Watchdog::Callbacks cb;
    cb.on_stall = [this](const InflightView& v, const std::string& d) {
      stalls.push_back(d);
      stalled.push_back(v);
    };
    cb.on_recovery = [this](const Recovery& r) { recoveries.push_back(r); };
    wd = std::make_unique<Watchdog>(config, &ring, markers.get(), &threads, cb);
  }

  // Captures one all-reduce as seq 1; returns its marker (null: not watched).
  Marker* Capture(MarkResult* result) {
    FakeCuda::SetCapture(CU_STREAM_CAPTURE_STATUS_ACTIVE);
    OpSnapshot o;
    o.comm_id = comm.id;
    o.seq = 1;
    o.kind = trace::OpKind::AllReduce;
    o.bytes = 4096;
    o.stream = 0x5;
    o.enqueue_ns = 100 * S;
    o.callsite = 3;
    ring.Record(o);
    Marker* m = nullptr;
    *result = markers->Begin(kStream, &m);
    if (*result == MarkResult::kCapturedWatched) {
      REQUIRE(markers->EndCaptured(m, kStream));
      REQUIRE(wd->Submit(InflightItem::Of(o, &comm, m, /*captured=*/true)));
      // Never recorded yet: both events read as reached (a driver's fresh event does).
      FakeCuda::Reach(m->start);
      FakeCuda::Reach(m->end);
    }
    FakeCuda::SetCapture(CU_STREAM_CAPTURE_STATUS_NONE);
    return *result == MarkResult::kCapturedWatched ? m : nullptr;
  }
  // A launch of the graph: both records pending again.
  void Launch(Marker* m) {
    driver.EventRecord(m->start, kStream);
    driver.EventRecord(m->end, kStream);
  }
};

}  // namespace

TEST_CASE("a captured operation gets external records and is followed at every replay") {
  Bench b;
  MarkResult r;
  Marker* m = b.Capture(&r);
  REQUIRE(r == MarkResult::kCapturedWatched);
  CHECK(g_external_records == 2);
  CHECK(b.markers->CapturedMarkers() == 1);
  b.wd->PollOnce(101 * S);
  CHECK(b.wd->Inflight(100, 101 * S).empty());  // between replays: nothing in flight
  for (int replay = 1; replay <= 3; ++replay) {
    b.Launch(m);
    b.wd->PollOnce((101 + replay * 10) * S);
    auto in = b.wd->Inflight(100, (101 + replay * 10) * S);
    REQUIRE(in.size() == 1);
    CHECK(in[0].captured);
    CHECK(in[0].replays == static_cast<uint64_t>(replay));
    CHECK(in[0].op.state == trace::OpState::Enqueued);
    CHECK(in[0].op.seq == 1);
    CHECK(in[0].op.callsite == 3);
    FakeCuda::Reach(m->start);
    b.wd->PollOnce((102 + replay * 10) * S);
    in = b.wd->Inflight(100, (102 + replay * 10) * S);
    REQUIRE(in.size() == 1);
    CHECK(in[0].op.state == trace::OpState::GpuReached);
    FakeCuda::Reach(m->end);
    b.wd->PollOnce((103 + replay * 10) * S);
    CHECK(b.wd->Inflight(100, (103 + replay * 10) * S).empty());
  }
  CHECK(b.stalls.empty());
}

TEST_CASE("a replay inside a captured operation past its deadline is a stall named by what was captured") {
  Bench b;
  MarkResult r;
  Marker* m = b.Capture(&r);
  REQUIRE(m);
  b.wd->PollOnce(101 * S);
  b.Launch(m);
  FakeCuda::Reach(m->start);
  b.wd->PollOnce(102 * S);
  b.wd->PollOnce(106 * S);
  CHECK(b.stalls.empty());  // 4 s inside, deadline 5 s
  b.wd->PollOnce(108 * S);
  REQUIRE(b.stalls.size() == 1);
  CHECK(b.stalls[0].find("AllReduce seq 1 (captured in a CUDA graph)") != std::string::npos);
  CHECK(b.stalls[0].find("replays seen 1") != std::string::npos);
  CHECK(b.stalled[0].captured);
  CHECK(b.stalled[0].op.callsite == 3);
  b.wd->PollOnce(109 * S);
  CHECK(b.stalls.size() == 1);  // once
  FakeCuda::Reach(m->end);
  b.wd->PollOnce(110 * S);
  CHECK(b.recoveries.size() == 1);
}

TEST_CASE("a replay only launched (the GPU busy before it) is never a stall of its own") {
  Bench b;
  MarkResult r;
  Marker* m = b.Capture(&r);
  REQUIRE(m);
  b.wd->PollOnce(101 * S);
  b.Launch(m);
  for (uint64_t t = 102; t < 160; t += 5) b.wd->PollOnce(t * S);
  CHECK(b.stalls.empty());
  auto in = b.wd->Inflight(100, 160 * S);
  REQUIRE(in.size() == 1);
  CHECK(in[0].op.state == trace::OpState::Enqueued);
}

TEST_CASE("a captured operation whose communicator ended is no longer followed") {
  Bench b;
  MarkResult r;
  Marker* m = b.Capture(&r);
  REQUIRE(m);
  b.Launch(m);
  FakeCuda::Reach(m->start);
  b.wd->PollOnce(101 * S);
  b.comm.live().state.store(CommState::Destroyed);
  b.wd->PollOnce(120 * S);
  CHECK(b.stalls.empty());
  CHECK(b.wd->Inflight(100, 120 * S).empty());
}

TEST_CASE("without cuEventRecordWithFlags, or when the driver refuses it, a captured operation is left alone") {
  {
    Bench b(nullptr);
    MarkResult r;
    CHECK(b.Capture(&r) == nullptr);
    CHECK(r == MarkResult::kCaptured);
    CHECK(FakeCuda::Created() == 0);  // nothing taken
  }
  {
    Bench b(&RefuseExternal);
    MarkResult r;
    CHECK(b.Capture(&r) == nullptr);
    CHECK(r == MarkResult::kCaptured);
    CHECK(b.markers->CapturedMarkers() == 0);
    CHECK(b.Capture(&r) == nullptr);  // not tried again
    CHECK(r == MarkResult::kCaptured);
  }
  {
    Bench b;
    GpuMarkers off(&b.driver, false, /*watch_captures=*/false);
    FakeCuda::SetCapture(CU_STREAM_CAPTURE_STATUS_ACTIVE);
    Marker* m = nullptr;
    CHECK(off.Begin(kStream, &m) == MarkResult::kCaptured);
    FakeCuda::SetCapture(CU_STREAM_CAPTURE_STATUS_NONE);
  }
}
