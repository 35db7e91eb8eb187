// Call-site interning: ids, symbolization, the table's limits, and concurrency.
#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "callsite_table.h"
#include "stacks.h"
#include "call_sites.h"
#include "testing.h"

using namespace ncclwatch::stacks;
using namespace stacks_test;

namespace {

Callsite Get(int32_t id) {
  Callsite callsite;
  REQUIRE(GetCallsite(id, &callsite));
  return callsite;
}

// A small table with its own storage, for limits that the process-wide one makes slow to reach.
struct SmallTable {
  explicit SmallTable(uint32_t capacity)
      : entries(new detail::CallsiteEntry[capacity]()),
        cells(new std::atomic<uint64_t>[2 * capacity]()),
        table(entries.get(), cells.get(), capacity) {}
  std::unique_ptr<detail::CallsiteEntry[]> entries;
  std::unique_ptr<std::atomic<uint64_t>[]> cells;
  detail::CallsiteTable table;
};

detail::CallsiteKey SyntheticKey(uintptr_t seed, int depth) {
  detail::CallsiteKey key;
  key.native_depth = static_cast<uint16_t>(depth);
  key.python_depth = 0;
  key.python_driven = 0;
  for (int i = 0; i < depth; ++i) key.ips[i] = seed * 1000 + i;
  return key;
}

}  // namespace

TEST_CASE("the same call site gives the same id, different ones different ids") {
  std::vector<int32_t> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(CaptureAtSiteA(16));  // one call instruction
  const int32_t b = CaptureAtSiteB(16);
  const int32_t a_elsewhere = CaptureAtSiteA(16);  // same function, another caller line

  REQUIRE(ids[0] >= 0);
  CHECK(ids[1] == ids[0]);
  CHECK(ids[2] == ids[0]);
  CHECK(b >= 0);
  CHECK(b != ids[0]);
  CHECK(a_elsewhere >= 0);
  CHECK(a_elsewhere != ids[0]);
  CHECK(CallsiteCount() >= 3);
}

TEST_CASE("call-site frames symbolize to the capturing functions") {
  const Callsite a = Get(CaptureAtSiteA(16));
  REQUIRE(!a.ips.empty());
  CHECK(a.ips.size() <= 16);
  CHECK(a.python.empty());  // no CPython in this process
  const NativeFrame top = Symbolize(a.ips[0]);
  CHECK(top.symbol == "stacks_test::CaptureAtSiteA(int)");  // demangled
  CHECK(top.module.find("test_stacks") != std::string::npos);
  CHECK(top.offset > 0);
  CHECK(Symbolize(a.ips[0]).symbol == top.symbol);  // cached answer is the same

  CHECK(Symbolize(Get(CaptureAtSiteB(16)).ips[0]).symbol == "stacks_test::CaptureAtSiteB(int)");
}

TEST_CASE("skip drops frames and max_depth bounds the stack") {
  const Callsite skipped = Get(CaptureSkippingSelf());
  REQUIRE(!skipped.ips.empty());
  const std::string top = Symbolize(skipped.ips[0]).symbol;
  CHECK(top.find("CaptureSkippingSelf") == std::string::npos);  // its own frame was skipped

  CHECK(Get(CaptureAtSiteA(1)).ips.size() == 1);
  CHECK(Get(CaptureAtSiteA(4)).ips.size() == 4);
  CHECK(Get(CaptureAtSiteA(1000)).ips.size() <= static_cast<size_t>(kMaxNativeFrames));
  CHECK(CaptureCallsite(0, 0) == -1);
}

TEST_CASE("unknown ids are refused") {
  Callsite callsite;
  CHECK_FALSE(GetCallsite(-1, &callsite));
  CHECK_FALSE(GetCallsite(kCallsiteCapacity, &callsite));
  CHECK_FALSE(GetCallsite(static_cast<int32_t>(CallsiteCount()), &callsite));
}

TEST_CASE("a full table returns -1 for new keys and keeps serving known ones") {
  SmallTable small(8);
  std::vector<int32_t> ids;
  for (int i = 0; i < 8; ++i) {
    const auto result = small.table.Intern(SyntheticKey(i + 1, 4));
    CHECK(result.inserted);
    ids.push_back(result.id);
  }
  CHECK(ids == std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7});  // dense, in insertion order
  CHECK(small.table.Intern(SyntheticKey(100, 4)).id == -1);
  CHECK(small.table.Intern(SyntheticKey(101, 4)).id == -1);
  CHECK(small.table.Size() == 8);
  for (int i = 0; i < 8; ++i) {
    const auto again = small.table.Intern(SyntheticKey(i + 1, 4));
    CHECK(again.id == i);
    CHECK_FALSE(again.inserted);
  }
  detail::CallsiteKey read;
  REQUIRE(small.table.Get(5, &read));
  CHECK(read == SyntheticKey(6, 4));
  CHECK_FALSE(small.table.Get(8, &read));
}

TEST_CASE("keys differing only in depth or Python frames are different call sites") {
  SmallTable small(16);
  detail::CallsiteKey key = SyntheticKey(1, 4);
  const int32_t base = small.table.Intern(key).id;
  detail::CallsiteKey shorter = SyntheticKey(1, 3);
  detail::CallsiteKey with_python = key;
  with_python.python_depth = 1;
  with_python.py_code[0] = 0x1000;
  with_python.py_position[0] = 7;
  detail::CallsiteKey other_position = with_python;
  other_position.py_position[0] = 8;

  const int32_t ids[] = {small.table.Intern(shorter).id, small.table.Intern(with_python).id,
                         small.table.Intern(other_position).id};
  CHECK(base == 0);
  CHECK(ids[0] == 1);
  CHECK(ids[1] == 2);
  CHECK(ids[2] == 3);
  CHECK(small.table.Intern(with_python).id == 2);
}

TEST_CASE("concurrent captures keep ids stable and entries whole") {
  constexpr int kThreads = 8;
  constexpr int kIterations = 200000;
  constexpr int kSites = 4;
  std::atomic<int> ready{0};
  std::vector<std::vector<int32_t>> first_ids(kThreads, std::vector<int32_t>(kSites, -2));
  std::vector<int> mismatches(kThreads, 0);

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) {
      }  // start together so that first inserts race
      for (int i = 0; i < kIterations; ++i) {
        const int site = (i + t) % kSites;
        int32_t id;
        switch (site) {
          case 0: id = CaptureAtSiteA(16); break;
          case 1: id = CaptureAtSiteB(16); break;
          case 2: id = CaptureAtSiteA(8); break;
          default: id = CaptureAtSiteB(8); break;
        }
        if (first_ids[t][site] == -2) first_ids[t][site] = id;
        if (id < 0 || id != first_ids[t][site]) ++mismatches[t];
      }
    });
  }
  for (auto& thread : threads) thread.join();

  for (int t = 0; t < kThreads; ++t) {
    CHECK(mismatches[t] == 0);
    CHECK(first_ids[t] == first_ids[0]);  // every thread got the same id for the same site
  }
  std::vector<int32_t> distinct = first_ids[0];
  std::sort(distinct.begin(), distinct.end());
  CHECK(std::unique(distinct.begin(), distinct.end()) == distinct.end());
  const char* expected[kSites] = {"CaptureAtSiteA", "CaptureAtSiteB", "CaptureAtSiteA", "CaptureAtSiteB"};
  const size_t depth[kSites] = {16, 16, 8, 8};
  for (int site = 0; site < kSites; ++site) {
    const Callsite callsite = Get(first_ids[0][site]);
    CHECK(callsite.ips.size() <= depth[site]);
    CHECK(Symbolize(callsite.ips[0]).symbol.find(expected[site]) != std::string::npos);
  }
}

TEST_CASE("many new call sites inserted by racing threads are interned once each") {
  constexpr int kThreads = 8;
  constexpr int kLevels = 9;  // 512 distinct stacks
  constexpr unsigned kPaths = 1u << kLevels;
  const size_t before = CallsiteCount();
  std::atomic<int> ready{0};
  std::vector<std::vector<int32_t>> ids(kThreads, std::vector<int32_t>(kPaths));

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) {
      }
      for (unsigned path = 0; path < kPaths; ++path) ids[t][path] = CaptureOnPath(path, kLevels);
    });
  }
  for (auto& thread : threads) thread.join();

  // Racing inserts of one key may lose an entry each (never published): count published ones.
  size_t published = 0;
  Callsite callsite;
  for (size_t id = before; id < CallsiteCount(); ++id) published += GetCallsite(static_cast<int32_t>(id), &callsite);
  CHECK(published == kPaths);
  std::vector<int32_t> sorted = ids[0];
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted.front() >= 0);
  CHECK(std::unique(sorted.begin(), sorted.end()) == sorted.end());
  for (int t = 1; t < kThreads; ++t) CHECK(ids[t] == ids[0]);
}

TEST_CASE("threads inserting the same new key at the same moment all get one id") {
  constexpr int kThreads = 4;
  constexpr int kRounds = 2000;
  SmallTable small(kRounds * kThreads);  // room for the entries that races lose
  std::atomic<int> arrived{0};
  std::vector<std::vector<int32_t>> ids(kThreads, std::vector<int32_t>(kRounds));

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < kRounds; ++round) {
        // Barrier: every thread inserts round's key together.
        arrived.fetch_add(1);
        while (arrived.load() < (round + 1) * kThreads) std::this_thread::yield();
        ids[t][round] = small.table.Intern(SyntheticKey(round + 1, 8)).id;
      }
    });
  }
  for (auto& thread : threads) thread.join();

  size_t published = 0;
  detail::CallsiteKey key;
  for (uint32_t id = 0; id < small.table.Size(); ++id) published += small.table.Get(static_cast<int32_t>(id), &key);
  CHECK(published == static_cast<size_t>(kRounds));
  for (int round = 0; round < kRounds; ++round) {
    for (int t = 1; t < kThreads; ++t) CHECK(ids[t][round] == ids[0][round]);
    REQUIRE(small.table.Get(ids[0][round], &key));
    CHECK(key == SyntheticKey(round + 1, 8));
  }
}

TEST_CASE("the table's memory is reported") {
  CHECK(CallsiteTableBytes() >= static_cast<size_t>(kCallsiteCapacity) * kMaxNativeFrames * sizeof(uintptr_t));
}

// Remembered paths are per thread: each case captures on a fresh thread, whatever ran before.
template <typename F>
void OnFreshThread(F&& body) {
  std::thread thread(std::forward<F>(body));
  thread.join();
}

TEST_CASE("a repeated call path is recognised without unwinding and gives the unwound id") {
  std::vector<int32_t> ids;
  uint64_t hits = 0;
  OnFreshThread([&] {
    for (int i = 0; i < 20; ++i) ids.push_back(ViaOuterA());  // one call instruction: one path
    hits = detail::CallPathHitsForTesting();
  });
  REQUIRE(ids[0] >= 0);
  for (int32_t id : ids) CHECK(id == ids[0]);
  // The first capture unwinds and remembers the path; the later ones are served from it.
  CHECK(hits >= 19);
  CHECK(StackContains(Get(ids.back()).ips, "ViaOuterA"));
}

TEST_CASE("paths that differ in one return address at the same stack slot keep their own ids") {
  std::vector<int32_t> a_ids, b_ids;
  uint64_t hits = 0;
  OnFreshThread([&] {
    for (int i = 0; i < 50; ++i) {
      a_ids.push_back(ViaOuterA());
      b_ids.push_back(ViaOuterB());
    }
    hits = detail::CallPathHitsForTesting();
  });
  REQUIRE(a_ids[0] >= 0);
  REQUIRE(b_ids[0] >= 0);
  CHECK(a_ids[0] != b_ids[0]);
  for (int i = 0; i < 50; ++i) {
    CHECK(a_ids[i] == a_ids[0]);
    CHECK(b_ids[i] == b_ids[0]);
  }
  CHECK(hits >= 98);  // both remembered side by side
  const Callsite b = Get(b_ids[0]);
  CHECK(StackContains(b.ips, "ViaOuterB"));
  CHECK_FALSE(StackContains(b.ips, "ViaOuterA"));
}

TEST_CASE("a call site deeper than a remembered path can hold is still unwound every time") {
  std::vector<int32_t> ids;
  uint64_t hits = 1;
  OnFreshThread([&] {
    for (int i = 0; i < 5; ++i) ids.push_back(CaptureAtSiteA(kMaxNativeFrames));
    hits = detail::CallPathHitsForTesting();
  });
  for (int32_t id : ids) CHECK(id == ids[0]);
  CHECK(hits == 0);
}
