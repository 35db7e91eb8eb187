// Fills the process-wide call-site table (its own program: the table cannot be emptied).
#include <algorithm>
#include <vector>

#include <catch2/catch.hpp>

#include "stacks.h"
#include "call_sites.h"

using namespace ncclwatch::stacks;

TEST_CASE("the process-wide table fills up cleanly") {
  constexpr int kLevels = 13;  // 8192 distinct stacks, twice the capacity
  constexpr unsigned kPaths = 1u << kLevels;
  std::vector<int32_t> ids[2];
  for (auto& round : ids) {  // the second round repeats the very same stacks
    for (unsigned path = 0; path < kPaths; ++path) round.push_back(stacks_test::CaptureOnPath(path, kLevels));
  }
  const auto accepted = std::count_if(ids[0].begin(), ids[0].end(), [](int32_t id) { return id >= 0; });
  CHECK(accepted == kCallsiteCapacity);
  CHECK(CallsiteCount() == static_cast<size_t>(kCallsiteCapacity));
  // Known call sites keep their ids; new ones keep being refused without harm.
  CHECK(ids[1] == ids[0]);
  CHECK(stacks_test::CaptureAtSiteA(16) == -1);
  CHECK(CallsiteCount() == static_cast<size_t>(kCallsiteCapacity));
  Callsite callsite;
  REQUIRE(GetCallsite(kCallsiteCapacity - 1, &callsite));
  CHECK(!callsite.ips.empty());
}
