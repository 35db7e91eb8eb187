// The watchdog over a fake CUDA driver whose events the test completes by hand.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "fake_cuda_driver.h"
#include "watchdog/watchdog.h"

using namespace ncclwatch;

namespace {

using testing::FakeCuda;

struct Bench {
  Config config;
  CudaDriver driver = FakeCuda::Driver();
  FlightRing ring{64};
  ThreadRegistry threads;
  GpuMarkers markers{&driver, false};
  CommInfo comm;
  std::vector<std::string> stalls;
  std::vector<Recovery> recoveries;
  std::unique_ptr<Watchdog> wd;

  Bench() {
    FakeCuda::Reset();
    config.timeout.default_s = 5;
    config.adaptive = 20;
    config.adaptive_floor_s = 1;
    config.adaptive_min_samples = 1;
    comm.id = 77;
    comm.size = 4;
    Watchdog::Callbacks cb;
    cb.on_stall = [this](const InflightView&, const std::string& d) { stalls.push_back(d); };
    cb.on_recovery = [this](const Recovery& r) { recoveries.push_back(r); };
    wd = std::make_unique<Watchdog>(config, &ring, &markers, &threads, cb);
  }

  // Records and launches one collective on `stream` at time `t`; returns its marker.
  Marker* Launch(uint64_t seq, uint64_t t, uintptr_t stream = 0x5) {
    OpSnapshot o;
    o.comm_id = comm.id;
    o.seq = seq;
    o.kind = trace::OpKind::AllGather;
    o.bytes = 1 << 20;
    o.stream = stream;
    o.enqueue_ns = t;
    return Launch(o);
  }
  // Records `o` (its index is set), launches it on its stream and hands it to the watchdog.
  Marker* Launch(OpSnapshot& o) {
    ring.Record(o);
    Marker* m = nullptr;
    REQUIRE(markers.Begin(reinterpret_cast<CUstream>(o.stream), &m) == MarkResult::kMarked);
    REQUIRE(markers.End(m, reinterpret_cast<CUstream>(o.stream)));
    comm.live().last_enqueued = o.seq;
    REQUIRE(wd->Submit(InflightItem::Of(o, &comm, m)));
    return m;
  }
  trace::OpState StateOf(uint64_t index) {
    OpSnapshot o;
    REQUIRE(ring.Read(index, &o));
    return o.state;
  }
};

constexpr uint64_t S = 1000000000ull;

}  // namespace

TEST_CASE("states move forward as the GPU reaches and completes the operation") {
  Bench b;
  Marker* m = b.Launch(1, 100 * S);
  b.wd->PollOnce(101 * S);
  CHECK(b.StateOf(0) == trace::OpState::Enqueued);
  FakeCuda::Reach(m->start);
  b.wd->PollOnce(102 * S);
  CHECK(b.StateOf(0) == trace::OpState::GpuReached);
  CHECK(b.comm.live().last_gpu_reached == 1);
  CHECK(b.comm.live().last_completed == 0);
  FakeCuda::Reach(m->end);
  b.wd->PollOnce(103 * S);
  CHECK(b.StateOf(0) == trace::OpState::Completed);
  CHECK(b.comm.live().last_completed == 1);
  CHECK(b.wd->Inflight(100).empty());
  CHECK(b.stalls.empty());
}

TEST_CASE("a stall is reported once, with where the operation is, and its recovery follows") {
  Bench b;
  Marker* m = b.Launch(1, 100 * S);
  FakeCuda::Reach(m->start);
  b.wd->PollOnce(104 * S);
  CHECK(b.stalls.empty());
  b.wd->PollOnce(106 * S);  // 6 s > 5 s default deadline
  REQUIRE(b.stalls.size() == 1);
  CHECK(b.stalls[0].find("AllGather seq 1") != std::string::npos);
  CHECK(b.stalls[0].find("reached by the GPU but not completed") != std::string::npos);
  b.wd->PollOnce(107 * S);
  CHECK(b.stalls.size() == 1);  // not again
  auto inflight = b.wd->Inflight(100, 107 * S);
  REQUIRE(inflight.size() == 1);
  CHECK(inflight[0].stalled);
  CHECK(inflight[0].age_s == Approx(7.0).margin(0.1));
  FakeCuda::Reach(m->end);
  b.wd->PollOnce(110 * S);
  REQUIRE(b.recoveries.size() == 1);
  CHECK(b.recoveries[0].recovered_after_s == Approx(10.0));
}

TEST_CASE("an operation that ends after its communicator was aborted is aborted, not completed or recovered") {
  // The framework's watchdog aborts a communicator whose collective stalled: the abort releases
  // its GPU work, so the end marker completes afterwards (on real hardware too). Whether the
  // abort came before the end marker completed, or while it did (between the poll's search and
  // its reading of the comm), the operation is aborted: no completion count, no recovery.
  for (bool during : {false, true}) {
    Bench b;
    Marker* m = b.Launch(1, 100 * S);
    Marker* behind = b.Launch(2, 100 * S);  // queued behind it on the same stream
    FakeCuda::Reach(m->start);
    b.wd->PollOnce(106 * S);
    REQUIRE(b.stalls.size() == 1);
    if (!during) b.comm.live().state.store(CommState::Aborted);
    FakeCuda::Reach(m->end);
    FakeCuda::Reach(behind->start);
    FakeCuda::Reach(behind->end);
    if (during) b.comm.live().state.store(CommState::Aborted);
    b.wd->PollOnce(110 * S);
    CHECK(b.StateOf(0) == trace::OpState::Aborted);
    CHECK(b.StateOf(1) == trace::OpState::Aborted);
    CHECK(b.comm.live().last_completed == 0);
    CHECK(b.comm.live().last_gpu_reached == 1);  // it had reached #1, never #2
    CHECK(b.recoveries.empty());
    CHECK(b.wd->Recoveries().empty());
    CHECK(b.wd->Inflight(100, 110 * S).empty());
  }
}

TEST_CASE("an operation whose GPU never reached it is reported as such") {
  Bench b;
  b.Launch(1, 100 * S);
  b.wd->PollOnce(106 * S);
  REQUIRE(b.stalls.size() == 1);
  CHECK(b.stalls[0].find("launched but not reached by the GPU") != std::string::npos);
}

TEST_CASE("the watchdog reads a launched operation's record from the ring") {
  Bench b;
  OpSnapshot o;
  o.comm_id = b.comm.id;
  o.seq = 4;
  o.kind = trace::OpKind::ReduceScatter;
  o.count = 1234;  // only the ring has these: the hand-off record does not carry them
  o.dtype = 7;
  o.callsite = 42;
  o.stream = 0x5;
  o.enqueue_ns = 100 * S;
  b.Launch(o);
  auto inflight = b.wd->Inflight(100, 101 * S);
  REQUIRE(inflight.size() == 1);
  CHECK(inflight[0].op.index == o.index);
  CHECK(inflight[0].op.seq == 4);
  CHECK(inflight[0].op.count == 1234);
  CHECK(inflight[0].op.dtype == 7);
  CHECK(inflight[0].op.callsite == 42);
}

TEST_CASE("an operation whose ring record was overwritten before the watchdog took it is still followed") {
  Bench b;  // a 64-entry ring
  Marker* m = b.Launch(1, 100 * S);
  OpSnapshot filler;
  for (int i = 0; i < 70; ++i) b.ring.Record(filler);  // a burst wraps the ring before the poll
  OpSnapshot gone;
  REQUIRE_FALSE(b.ring.Read(0, &gone));
  b.wd->PollOnce(101 * S);
  auto inflight = b.wd->Inflight(100, 101 * S);
  REQUIRE(inflight.size() == 1);
  CHECK(inflight[0].op.comm_id == 77);
  CHECK(inflight[0].op.comm_size == 4);
  CHECK(inflight[0].op.bytes == 1u << 20);
  FakeCuda::Reach(m->start);
  b.wd->PollOnce(106 * S);
  REQUIRE(b.stalls.size() == 1);
  CHECK(b.stalls[0].find("AllGather seq 1 on comm") != std::string::npos);
  CHECK(b.stalls[0].find("reached by the GPU but not completed") != std::string::npos);
  FakeCuda::Reach(m->end);
  b.wd->PollOnce(107 * S);
  CHECK(b.wd->Inflight(100).empty());
  CHECK(b.comm.live().last_completed == 1);
}

TEST_CASE("an operation's clock starts when the one before it on the stream completes") {
  Bench b;
  Marker* m1 = b.Launch(1, 100 * S);
  b.Launch(2, 100 * S);  // queued behind seq 1 on the same stream
  b.wd->PollOnce(104 * S);
  FakeCuda::Reach(m1->start);
  FakeCuda::Reach(m1->end);
  b.wd->PollOnce(104 * S);
  b.wd->PollOnce(108 * S);  // seq 2 is 8 s old but current for 4 s only
  CHECK(b.stalls.empty());
  b.wd->PollOnce(110 * S);
  CHECK(b.stalls.size() == 1);
}

TEST_CASE("history tightens the deadline to the adaptive one") {
  Bench b;
  Marker* m = b.Launch(1, 100 * S);
  FakeCuda::Reach(m->start);
  FakeCuda::Reach(m->end);
  b.wd->PollOnce(100 * S + S / 10);  // healthy in 0.1 s
  b.Launch(2, 101 * S);
  b.wd->PollOnce(103 * S + S / 10);  // 2.1 s > max(floor 1 s, 20 x 0.1 s)
  CHECK(b.stalls.size() == 1);
}

TEST_CASE("captured operations get no marker, and the watchdog's queries never invalidate a capture") {
  Bench b;
  FakeCuda::SetCapture(CU_STREAM_CAPTURE_STATUS_ACTIVE);
  Marker* m = nullptr;
  CHECK(b.markers.Begin(reinterpret_cast<CUstream>(0x5), &m) == MarkResult::kCaptured);
  CHECK(m == nullptr);
  CHECK(FakeCuda::Created() == 0);
  b.markers.PrepareThread();
  CHECK(FakeCuda::LastCaptureMode() == CU_STREAM_CAPTURE_MODE_RELAXED);
}

TEST_CASE("markers come back to the pool: no new events in steady state") {
  Bench b;
  for (uint64_t i = 1; i <= 50; ++i) {
    Marker* m = b.Launch(i, (100 + i) * S);
    FakeCuda::Reach(m->start);
    FakeCuda::Reach(m->end);
    b.wd->PollOnce((100 + i) * S + 1);
  }
  CHECK(FakeCuda::Created() == 2);  // one start/end pair, reused
}

TEST_CASE("a thread blocked inside an NCCL call past the deadline is a stall too") {
  Bench b;
  ThreadSlot* slot = b.threads.Claim(4242);
  REQUIRE(slot);
  {
    InNcclScope scope(slot, "ncclCommInitRank", 100 * S);
    b.wd->PollOnce(103 * S);
    CHECK(b.stalls.empty());
    b.wd->PollOnce(106 * S);
    REQUIRE(b.stalls.size() == 1);
    CHECK(b.stalls[0].find("blocked inside ncclCommInitRank") != std::string::npos);
    b.wd->PollOnce(107 * S);
    CHECK(b.stalls.size() == 1);
  }
  b.wd->PollOnce(108 * S);
  CHECK(b.threads.InsideNccl().empty());
}

TEST_CASE("a call creating a communicator is left to the setup-hang check: one stall, not two") {
  Bench b;
  ThreadSlot* slot = b.threads.Claim(4243);
  REQUIRE(slot);
  {
    InNcclScope scope(slot, "ncclCommInitRankConfig", 100 * S);
    InNcclScope::SetCreating(slot, true);
    b.wd->PollOnce(106 * S);
    CHECK(b.stalls.empty());  // DumpPolicy::CheckSetups dumps it, naming the communicator
    REQUIRE(b.threads.InsideNccl().size() == 1);
    CHECK(b.threads.InsideNccl()[0].creating);
  }
  {
    InNcclScope scope(slot, "ncclCommDestroy", 200 * S);  // the next call on the thread is not creating
    b.wd->PollOnce(206 * S);
    REQUIRE(b.stalls.size() == 1);
    CHECK(b.stalls[0].find("blocked inside ncclCommDestroy") != std::string::npos);
  }
}

TEST_CASE("an operation recorded after the poll read its clock is not late") {
  // Regression: at high operation rates, enqueue_ns can be later than the poll's "now", and an
  // unsigned subtraction made such an operation look billions of seconds old.
  Bench b;
  Marker* m = b.Launch(1, 100 * S);
  b.wd->PollOnce(100 * S - 1000);  // the poll's clock was read just before the launch
  CHECK(b.stalls.empty());
  FakeCuda::Reach(m->start);
  FakeCuda::Reach(m->end);
  b.wd->PollOnce(100 * S - 500);
  CHECK(b.recoveries.empty());
  // ...and the healthy duration recorded for it is 0, not huge: history still tightens deadlines.
  Marker* m2 = b.Launch(2, 101 * S);
  (void)m2;
  b.wd->PollOnce(111 * S + 1);  // past the 10 s floor... and the 5 s default
  CHECK(b.stalls.size() == 1);
}

TEST_CASE("the watchdog paces its polls to the operation rate") {
  const uint64_t poll = 100 * 1000000ull;
  CHECK(Watchdog::PaceNs(0, poll, poll) == poll);          // nothing new: the poll interval
  CHECK(Watchdog::PaceNs(10, poll, poll) == poll);         // a quiet job: the poll interval
  CHECK(Watchdog::PaceNs(Watchdog::kPaceBatch, poll, poll) == poll);
  // 1000 operations in 10 ms: 10 us each, so the next kPaceBatch take 2.56 ms.
  CHECK(Watchdog::PaceNs(1000, 10 * 1000000ull, poll) == Watchdog::kPaceBatch * 10000);
  // A million a second would mean 256 us; a faster rate stops at the floor.
  CHECK(Watchdog::PaceNs(100000, 1000000ull, poll) == Watchdog::kMinPaceNs);
}

TEST_CASE("at a steady high operation rate the watchdog keeps up without the application waking it") {
  // On a loaded machine the watchdog thread can be starved for a burst, and then waking it from
  // Submit is the designed fallback: the pacing must show in one of a few runs, not in every one.
  uint64_t best_wakes = ~0ull;
  for (int run = 0; run < 3 && best_wakes > 2; ++run) {
    Bench b;
    b.config.poll_ms = 100;
    REQUIRE(b.wd->Start());
    // Up to 40 000 operations a second, each finished on the GPU at once, until there have been
    // 8 * kWakeBacklog: without pacing the watchdog would sleep its 100 ms and be woken from
    // Submit every kWakeBacklog operations.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    uint64_t seq = 0;
    while (seq < 8 * Watchdog::kWakeBacklog && std::chrono::steady_clock::now() < give_up) {
      for (int i = 0; i < 40; ++i) {
        Marker* m = b.Launch(++seq, MonoNs());
        FakeCuda::Reach(m->start);
        FakeCuda::Reach(m->end);
      }
      // The behaviour under test: a steady rate, 40 operations a millisecond at most.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    b.wd->Stop(2000);
    REQUIRE(!b.wd->running());
    INFO(seq << " operations, " << FakeCuda::Created() / 2 << " markers created");
    REQUIRE(seq >= 8 * Watchdog::kWakeBacklog);
    // Markers came back for reuse: far fewer than the operations.
    CHECK(static_cast<uint64_t>(FakeCuda::Created() / 2) < seq / 4);
    best_wakes = std::min<uint64_t>(best_wakes, b.wd->submit_wakes());
  }
  // The first burst may need one wake-up before the pace is known; after that, none.
  CHECK(best_wakes <= 2);
}
