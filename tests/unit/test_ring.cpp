#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "record/flight_ring.h"

using namespace ncclwatch;

namespace {
OpSnapshot MakeOp(uint64_t seq, uint64_t comm) {
  OpSnapshot o;
  o.comm_id = comm;
  o.seq = seq;
  o.count = seq * 3;  // derived, so a torn read shows up as a mismatch
  o.bytes = seq * 12;
  o.kind = trace::OpKind::AllGather;
  o.dtype = 7;
  return o;
}
}  // namespace

TEST_CASE("ring keeps the newest entries in order and counts the overwritten ones") {
  FlightRing ring(16);
  for (uint64_t i = 1; i <= 40; ++i) {
    auto o = MakeOp(i, 1);
    ring.Record(o);
  }
  CHECK(ring.recorded() == 40);
  CHECK(ring.overwritten() == 24);
  auto snap = ring.Snapshot();
  REQUIRE(snap.size() == 16);
  for (size_t i = 0; i < snap.size(); ++i) {
    CHECK(snap[i].seq == 25 + i);
    CHECK(snap[i].index == 24 + i);
  }
}

TEST_CASE("state changes apply to the right record only") {
  FlightRing ring(4);
  auto o = MakeOp(1, 1);
  uint64_t idx = ring.Record(o);
  CHECK(ring.SetState(idx, trace::OpState::GpuReached, 100));
  CHECK(ring.SetState(idx, trace::OpState::Completed, 200));
  OpSnapshot r;
  REQUIRE(ring.Read(idx, &r));
  CHECK(r.state == trace::OpState::Completed);
  CHECK(r.gpu_reached_ns == 100);
  CHECK(r.completed_ns == 200);
  for (int i = 0; i < 4; ++i) {
    auto n = MakeOp(2 + i, 1);
    ring.Record(n);
  }
  // The slot now holds a newer record: a late update for the old one must not touch it.
  CHECK_FALSE(ring.SetState(idx, trace::OpState::Error));
  CHECK_FALSE(ring.Read(idx, &r));
  REQUIRE(ring.Read(idx + 4, &r));
  CHECK(r.state == trace::OpState::Enqueued);
}

TEST_CASE("multi-threaded stress: many producers, a state updater and readers never see torn records") {
  FlightRing ring(256);
  constexpr int kThreads = 6, kPerThread = 40000, kMinReads = 50;
  std::atomic<bool> stop{false};
  std::atomic<int> ready{0};
  std::atomic<uint64_t> torn{0}, snapshots{0}, read{0}, total{0};
  std::thread updater([&] {
    ready.fetch_add(1);
    while (!stop.load()) {
      uint64_t h = ring.recorded();
      for (uint64_t i = h > 64 ? h - 64 : 0; i < h; ++i) ring.SetState(i, trace::OpState::Completed, i + 1);
    }
  });
  std::thread reader([&] {
    ready.fetch_add(1);
    while (!stop.load()) {
      for (auto& o : ring.Snapshot()) {
        read.fetch_add(1);
        if (o.count != o.seq * 3 || o.bytes != o.seq * 12 || o.comm_id > kThreads) torn.fetch_add(1);
      }
      snapshots.fetch_add(1);
    }
  });
  while (ready.load() < 2) std::this_thread::yield();
  std::vector<std::thread> producers;
  for (int t = 1; t <= kThreads; ++t)
    producers.emplace_back([&, t] {
      // Keep writing until the reader has really raced with us, however the machine schedules.
      uint64_t i = 0;
      while (++i <= kPerThread || snapshots.load() < kMinReads) {
        auto o = MakeOp(i, t);
        ring.Record(o);
      }
      total.fetch_add(i - 1);
    });
  for (auto& p : producers) p.join();
  stop.store(true);
  updater.join();
  reader.join();
  CHECK(ring.recorded() == total.load());
  CHECK(torn.load() == 0);
  CHECK(snapshots.load() >= kMinReads);
  CHECK(read.load() > 0);
  // Every remaining entry is intact and each producer's entries are in its own order.
  auto snap = ring.Snapshot();
  CHECK(snap.size() == 256);
  std::vector<uint64_t> last(kThreads + 1, 0);
  for (auto& o : snap) {
    CHECK(o.seq > last[o.comm_id]);
    last[o.comm_id] = o.seq;
  }
}
