// GPU marker pools over a thread-safe fake driver: LIFO reuse, the per-context bound, failed
// event creation, and concurrent take/give-back from several threads.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "fake_cuda_driver.h"
#include "gpu/markers.h"

using namespace ncclwatch;

namespace {

using testing::FakeCuda;

// A fresh fake GPU for each test.
CudaDriver FakeDriver() {
  FakeCuda::Reset();
  return FakeCuda::Driver();
}

const CUstream kStream = reinterpret_cast<CUstream>(0x1234);

Marker* Take(GpuMarkers& markers) {
  Marker* m = nullptr;
  if (markers.Begin(kStream, &m) != MarkResult::kMarked) return nullptr;
  REQUIRE(markers.End(m, kStream));
  return m;
}

}  // namespace

TEST_CASE("a marker given back is the next one taken, with its events") {
  CudaDriver driver = FakeDriver();
  GpuMarkers markers(&driver, false);
  Marker* first = Take(markers);
  REQUIRE(first);
  Marker* second = Take(markers);
  REQUIRE(second);
  CHECK(second != first);
  markers.Release(first);
  markers.Release(second);
  // LIFO: the last one given back (still in cache) comes first; no event is created again.
  CHECK(Take(markers) == second);
  CHECK(Take(markers) == first);
  CHECK(FakeCuda::Created() == 4);
  CHECK(markers.MarkersCreated() == 2);
}

TEST_CASE("a group's shared marker returns to the pool with its last reference") {
  CudaDriver driver = FakeDriver();
  GpuMarkers markers(&driver, false);
  Marker* shared = Take(markers);
  REQUIRE(shared);
  shared->refs.store(3);
  markers.Release(shared);
  markers.Release(shared);
  Marker* other = Take(markers);  // two references left: not in the pool
  CHECK(other != shared);
  markers.Release(shared);
  CHECK(Take(markers) == shared);
}

TEST_CASE("beyond the per-context bound operations go unmonitored until a marker comes back") {
  CudaDriver driver = FakeDriver();
  GpuMarkers markers(&driver, false);
  std::vector<Marker*> held;
  for (uint32_t i = 0; i < GpuMarkers::kMaxMarkersPerContext; ++i) {
    Marker* m = nullptr;
    if (markers.Begin(kStream, &m) != MarkResult::kMarked) break;
    held.push_back(m);
  }
  REQUIRE(held.size() == GpuMarkers::kMaxMarkersPerContext);
  Marker* extra = nullptr;
  CHECK(markers.Begin(kStream, &extra) == MarkResult::kUnmonitored);
  CHECK(extra == nullptr);
  markers.Abandon(held.back());
  CHECK(markers.Begin(kStream, &extra) == MarkResult::kMarked);
  CHECK(extra == held.back());
}

TEST_CASE("a marker whose events could not be created is retried, not lost") {
  CudaDriver driver = FakeDriver();
  GpuMarkers markers(&driver, false);
  FakeCuda::FailNextCreates(1);
  Marker* m = nullptr;
  CHECK(markers.Begin(kStream, &m) == MarkResult::kUnmonitored);
  Marker* retried = Take(markers);
  REQUIRE(retried);
  CHECK(retried->start != nullptr);
  CHECK(retried->end != nullptr);
  CHECK(markers.MarkersCreated() == 1);  // the same pool slot, now with its pair
}

TEST_CASE("threads taking and giving back markers never share one") {
  CudaDriver driver = FakeDriver();
  GpuMarkers markers(&driver, false);
  constexpr int kThreads = 4, kRounds = 20000, kHeld = 24;
  std::vector<std::atomic<int>> owner(GpuMarkers::kMaxMarkersPerContext);
  std::atomic<int> shared_found{0}, unmonitored{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<Marker*> held;
      for (int i = 0; i < kRounds; ++i) {
        Marker* m = nullptr;
        if (markers.Begin(kStream, &m) != MarkResult::kMarked) {
          unmonitored.fetch_add(1);
          continue;
        }
        int expected = 0;
        if (!owner[m->index].compare_exchange_strong(expected, t + 1)) shared_found.fetch_add(1);
        held.push_back(m);
        // Give back in a varying order and amount, as the watchdog does.
        while (held.size() > static_cast<size_t>((i * 7 + t) % kHeld)) {
          Marker* back = held[(i + held.size()) % held.size()];
          held.erase(std::find(held.begin(), held.end(), back));
          owner[back->index].store(0);
          markers.Release(back);
        }
      }
      for (Marker* m : held) {
        owner[m->index].store(0);
        markers.Release(m);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(shared_found == 0);
  CHECK(unmonitored == 0);
  CHECK(markers.MarkersCreated() <= static_cast<size_t>(kThreads * kHeld));
}
