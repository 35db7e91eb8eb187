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

namespace {
// Producers race each other, a state updater and a reader. With a small ring a producer that is
// preempted mid-write is overtaken by one a whole wrap ahead: their writes must not mix.
void StressRing(uint64_t capacity) {
  FlightRing ring(capacity);
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
      auto intact = [&](const OpSnapshot& o) {
        read.fetch_add(1);
        if (o.count != o.seq * 3 || o.bytes != o.seq * 12 || o.comm_id > kThreads) torn.fetch_add(1);
      };
      size_t seen = 0;
      for (auto& o : ring.Snapshot()) {
        intact(o);
        ++seen;
      }
      // Also older indexes: a stalled writer's record published late must be whole too.
      uint64_t h = ring.recorded();
      OpSnapshot o;
      for (uint64_t i = h > 8 * capacity ? h - 8 * capacity : 0; i < h; ++i)
        if (ring.Read(i, &o)) intact(o);
      // Only a pass that saw records counts as racing with the producers (under load the reader
      // may run its first passes before any producer has written).
      if (seen) snapshots.fetch_add(1);
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
  // Every remaining entry is intact and each producer's entries are in its own order. (A record
  // that met a stalled writer in its slot is dropped, so the window may have gaps.)
  auto snap = ring.Snapshot();
  CHECK(snap.size() <= capacity);
  std::vector<uint64_t> last(kThreads + 1, 0);
  for (auto& o : snap) {
    CHECK((o.count == o.seq * 3 && o.bytes == o.seq * 12));
    CHECK(o.seq > last[o.comm_id]);
    last[o.comm_id] = o.seq;
  }
  // No slot is left claimed: one more window of records fills the ring completely.
  for (uint64_t i = 1; i <= capacity; ++i) {
    auto o = MakeOp(1000000 + i, 1);
    ring.Record(o);
  }
  snap = ring.Snapshot();
  REQUIRE(snap.size() == capacity);
  for (uint64_t i = 0; i < capacity; ++i) CHECK(snap[i].seq == 1000001 + i);
}
}  // namespace

TEST_CASE("multi-threaded stress: many producers, a state updater and readers never see torn records") {
  StressRing(256);
}

TEST_CASE("multi-threaded stress on a tiny ring: a producer overtaken by a whole wrap never mixes its writes with the newer record") {
  StressRing(4);
}

TEST_CASE("a writer stalled for a whole wrap keeps its slot: the newer record is dropped, never mixed") {
  FlightRing ring(4);
  std::atomic<int> phase{0};  // 1: the slow writer is halfway through its slot; 2: let it finish
  uint64_t slow_index = 0;
  std::thread slow([&] {
    auto o = MakeOp(7, 1);
    slow_index = ring.RecordWith(o, [&] {
      phase.store(1);
      while (phase.load() != 2) std::this_thread::yield();
    });
  });
  while (phase.load() != 1) std::this_thread::yield();
  // A whole wrap while it stalls: the record landing on its slot must not write there.
  uint64_t newer_index = 0;
  for (uint64_t i = 0; i < 4; ++i) {
    auto o = MakeOp(100 + i, 2);
    newer_index = ring.Record(o);
  }
  OpSnapshot r;
  CHECK_FALSE(ring.Read(newer_index, &r));  // dropped, not published over a slot being written
  CHECK_FALSE(ring.SetState(newer_index, trace::OpState::Completed, 1));
  phase.store(2);
  slow.join();
  REQUIRE(newer_index == slow_index + 4);
  REQUIRE(ring.Read(slow_index, &r));  // the stalled writer published its own record, whole
  CHECK(r.seq == 7);
  CHECK(r.count == 21);
  CHECK(r.comm_id == 1);
  CHECK_FALSE(ring.Read(newer_index, &r));
  // The other slots of the wrap hold their records, and the next record claims the slot again.
  auto snap = ring.Snapshot();
  CHECK(snap.size() == 3);
  for (auto& o : snap) CHECK(o.comm_id == 2);
  auto o = MakeOp(200, 3);
  uint64_t next = ring.Record(o);
  REQUIRE(ring.Read(next, &r));
  CHECK(r.seq == 200);
  CHECK(r.count == 600);
}
