// The watchdog thread's duty list: each duty runs when due, in order, and says when it is next.
#include <catch2/catch.hpp>

#include <new>
#include <string>
#include <vector>

#include "watchdog/tick_schedule.h"

using ncclwatch::TickSchedule;

TEST_CASE("A duty runs at its first tick and then only when the time it returned has come") {
  TickSchedule duties;
  std::vector<uint64_t> runs;
  duties.Add("every 10", [&](uint64_t now) {
    runs.push_back(now);
    return now + 10;
  });
  for (uint64_t t : {5, 9, 14, 15, 16, 24, 25, 100}) duties.Run(t);
  CHECK(runs == std::vector<uint64_t>{5, 15, 25, 100});
}

TEST_CASE("Duties run in the order they were added and one that returns now runs every tick") {
  TickSchedule duties;
  std::string order;
  duties.Add("a", [&](uint64_t now) {
    order += 'a';
    return now;
  });
  duties.Add("b", [&](uint64_t now) {
    order += 'b';
    return now + 2;
  });
  for (uint64_t t = 0; t < 4; ++t) duties.Run(t);
  CHECK(order == "abaaba");
  CHECK(duties.size() == 2);
}

TEST_CASE("A duty done for good never runs again") {
  TickSchedule duties;
  int runs = 0;
  duties.Add("once", [&](uint64_t) {
    ++runs;
    return TickSchedule::kNever;
  });
  for (uint64_t t = 0; t < 1000; t += 100) duties.Run(t);
  CHECK(runs == 1);
}

TEST_CASE("A duty that fails is retried at the next tick while the others still run") {
  TickSchedule duties;
  int failing = 0, other = 0;
  duties.Add("out of memory", [&](uint64_t now) -> uint64_t {
    if (++failing < 3) throw std::bad_alloc();
    return now + 1000;
  });
  duties.Add("other", [&](uint64_t now) {
    ++other;
    return now;
  });
  for (uint64_t t = 1; t <= 5; ++t) duties.Run(t);
  CHECK(failing == 3);  // ticks 1 and 2 threw, tick 3 succeeded and scheduled it far away
  CHECK(other == 5);
}
