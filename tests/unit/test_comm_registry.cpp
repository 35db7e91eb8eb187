#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "record/comm_registry.h"

using namespace ncclwatch;

TEST_CASE("communicator id from the unique id: equal for equal ids, different otherwise") {
  unsigned char a[128], b[128];
  memset(a, 7, sizeof a);
  memcpy(b, a, sizeof b);
  CHECK(CommIdFromUniqueIds(a, 128) == CommIdFromUniqueIds(b, 128));
  b[127] ^= 1;
  CHECK(CommIdFromUniqueIds(a, 128) != CommIdFromUniqueIds(b, 128));
  CHECK(CommIdHex(0x1234).size() == 16);
}

TEST_CASE("split and shrink ids depend on parent, color and the parent's split count only") {
  uint64_t p = 42;
  CHECK(CommIdForSplit(p, 0, 1) == CommIdForSplit(p, 0, 1));
  CHECK(CommIdForSplit(p, 0, 1) != CommIdForSplit(p, 0, 2));
  CHECK(CommIdForSplit(p, 0, 1) != CommIdForSplit(p, 1, 1));
  CHECK(CommIdForSplit(p, 0, 1) != CommIdForSplit(43, 0, 1));
  int ex1[] = {3, 1}, ex2[] = {1, 3}, ex3[] = {1, 2};
  CHECK(CommIdForShrink(p, 0, ex1, 2) == CommIdForShrink(p, 0, ex2, 2));  // order of the list does not matter
  CHECK(CommIdForShrink(p, 0, ex1, 2) != CommIdForShrink(p, 0, ex3, 2));
  CHECK(CommIdForShrink(p, 0, nullptr, 0) != CommIdForSplit(p, 0, 0));
}

TEST_CASE("registry: lookup by handle, reuse of a handle, all communicators kept") {
  CommRegistry reg;
  int h1, h2;
  auto a = std::make_unique<CommInfo>();
  a->handle = &h1;
  a->id = 1;
  a->size = 4;
  CommInfo* ra = reg.Register(std::move(a));
  CHECK(reg.Lookup(&h1) == ra);
  CHECK(reg.Lookup(&h2) == nullptr);
  REQUIRE(ra->Peer(3) != nullptr);
  CHECK(ra->Peer(4) == nullptr);
  auto b = std::make_unique<CommInfo>();
  b->handle = &h1;  // NCCL handed out the same pointer again after a destroy
  b->id = 2;
  CommInfo* rb = reg.Register(std::move(b));
  CHECK(reg.Lookup(&h1) == rb);
  CHECK(reg.All().size() == 2);
}

TEST_CASE("registry: concurrent lookups while communicators are added") {
  CommRegistry reg;
  std::vector<int> handles(2000);
  std::atomic<bool> done{false};
  std::atomic<int> wrong{0};
  std::thread reader([&] {
    while (!done.load())
      for (size_t i = 0; i < handles.size(); ++i) {
        CommInfo* c = reg.Lookup(&handles[i]);
        if (c && c->id != i) wrong.fetch_add(1);
      }
  });
  for (size_t i = 0; i < handles.size(); ++i) {
    auto c = std::make_unique<CommInfo>();
    c->handle = &handles[i];
    c->id = i;
    reg.Register(std::move(c));
  }
  done.store(true);
  reader.join();
  CHECK(wrong.load() == 0);
  for (size_t i = 0; i < handles.size(); ++i) CHECK(reg.Lookup(&handles[i])->id == i);
}

TEST_CASE("ended communicators past a bound are forgotten: dumps and memory do not grow with them") {
  CommRegistry reg;
  std::vector<CommRecord> records(16);
  reg.UseStorage(records.data(), records.size());
  std::vector<CommInfo*> made;
  auto make = [&](uintptr_t handle) {
    auto c = std::make_unique<CommInfo>();
    c->handle = reinterpret_cast<const void*>(handle);
    c->id = handle;
    c->size = 8;
    return reg.Register(std::move(c));
  };
  for (uintptr_t h = 1; h <= 5000; ++h) {
    CommInfo* c = make(h * 64);
    c->live().state.store(CommState::Destroyed);
    c->live().ended_ns.store(h);  // ended in creation order
    made.push_back(c);
  }
  CommInfo* live = make(999999 * 64);
  CommInfo* followed = made[10];  // the watchdog still follows an operation of this one
  CHECK(reg.EndedCount() == 5000);
  // Ended after the cut: kept, whatever the bound.
  CHECK(reg.ForgetEnded(64, 3, {}) == 2);
  CHECK(reg.ForgetEnded(64, 1000000, {followed}) == 5000 - 2 - 64 - 1);
  std::vector<CommInfo*> all = reg.All();
  CHECK(all.size() == 64 + 1 + 1);
  CHECK(std::find(all.begin(), all.end(), live) != all.end());
  CHECK(std::find(all.begin(), all.end(), followed) != all.end());
  CHECK(all.back() == live);
  CHECK(reg.Lookup(reinterpret_cast<const void*>(5000 * 64)) == made.back());  // the newest are kept
  CHECK(reg.Lookup(reinterpret_cast<const void*>(500 * 64)) == nullptr);       // a forgotten one is not found
  // Its handle handed out again by NCCL: found again, as the new communicator.
  CommInfo* again = make(500 * 64);
  CHECK(reg.Lookup(reinterpret_cast<const void*>(500 * 64)) == again);
  // The black box's records of forgotten communicators serve new ones.
  CHECK(again->record_index >= 0);
  CHECK(records[static_cast<size_t>(again->record_index)].id == 500 * 64);
}
