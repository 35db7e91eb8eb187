#include <catch2/catch.hpp>

#include "watchdog/deadlines.h"
#include "watchdog/setup_hangs.h"

using namespace ncclwatch;
using trace::OpKind;

TEST_CASE("without history the default applies, and fixed per-op values always win") {
  DeadlineSpec spec;
  spec.default_s = 60;
  spec.per_op_s[static_cast<int>(OpKind::Send)] = 600;
  DeadlinePolicy p(spec, 20, 10, 3);
  CHECK(p.DeadlineS(1, OpKind::AllGather, 1 << 20) == 60);
  CHECK(p.DeadlineS(1, OpKind::Send, 1 << 20) == 600);
  for (int i = 0; i < 10; ++i) p.RecordHealthy(1, OpKind::Send, 1 << 20, 0.001);
  CHECK(p.DeadlineS(1, OpKind::Send, 1 << 20) == 600);
}

TEST_CASE("adaptive deadline: a multiple of the slowest healthy completion, within floor and default") {
  DeadlineSpec spec;
  spec.default_s = 60;
  DeadlinePolicy p(spec, 20, 10, 3);
  p.RecordHealthy(1, OpKind::AllReduce, 4096, 0.002);
  p.RecordHealthy(1, OpKind::AllReduce, 4096, 0.003);
  CHECK(p.DeadlineS(1, OpKind::AllReduce, 4096) == 60);  // not enough samples yet
  p.RecordHealthy(1, OpKind::AllReduce, 4096, 0.001);
  CHECK(p.DeadlineS(1, OpKind::AllReduce, 4096) == 10);  // 20 x 3 ms is below the floor
  p.RecordHealthy(1, OpKind::AllReduce, 4096, 1.0);
  CHECK(p.DeadlineS(1, OpKind::AllReduce, 4096) == Approx(20.0));
  p.RecordHealthy(1, OpKind::AllReduce, 4096, 10.0);
  CHECK(p.DeadlineS(1, OpKind::AllReduce, 4096) == 60);  // never looser than the default
  // History is per communicator, op and size class.
  CHECK(p.DeadlineS(2, OpKind::AllReduce, 4096) == 60);
  CHECK(p.DeadlineS(1, OpKind::AllGather, 4096) == 60);
  CHECK(p.DeadlineS(1, OpKind::AllReduce, 64 << 20) == 60);
  CHECK(p.DeadlineS(1, OpKind::AllReduce, 5000) == 60);  // 4096 and 5000 share a size class
}

TEST_CASE("size classes are powers of four") {
  CHECK(DeadlinePolicy::SizeClass(1024) == DeadlinePolicy::SizeClass(3000));
  CHECK(DeadlinePolicy::SizeClass(1 << 20) != DeadlinePolicy::SizeClass(4 << 20));
}

TEST_CASE("adaptive off: the default stays") {
  DeadlineSpec spec;
  spec.default_s = 30;
  DeadlinePolicy p(spec, 0, 10, 1);
  p.RecordHealthy(1, OpKind::AllReduce, 8, 0.001);
  CHECK(p.DeadlineS(1, OpKind::AllReduce, 8) == 30);
}

TEST_CASE("a communicator's creation past the default deadline is one setup hang said once") {
  DeadlineSpec spec;
  spec.default_s = 60;
  spec.per_op_s[static_cast<int>(OpKind::AllReduce)] = 5;  // per-operation values do not apply to setup
  DeadlinePolicy p(spec, 20, 10, 3);
  SetupWatch w;
  const uint64_t s = 1'000'000'000;
  const uint64_t a = w.Begin("ncclCommInitRank", 0xabc, 8, 3, s);
  w.Begin("ncclCommInitRankConfig", 0xdef, 4, 1, s + 30 * s);
  CHECK(w.Pending().size() == 2);
  CHECK_FALSE(w.Check(s + 59 * s, p.DefaultS()));
  auto hang = w.Check(s + 61 * s, p.DefaultS());
  REQUIRE(hang);
  CHECK(hang->detail.find("ncclCommInitRank blocked for 61.0 s") == 0);
  CHECK(hang->detail.find("(rank 3 of 8)") != std::string::npos);
  CHECK(hang->stuck_s == Approx(61.0));
  CHECK_FALSE(w.Check(s + 62 * s, p.DefaultS()));  // once per call
  auto second = w.Check(s + 91 * s, p.DefaultS());
  REQUIRE(second);
  CHECK(second->detail.find("ncclCommInitRankConfig") == 0);
  w.End(a);
  REQUIRE(w.Pending().size() == 1);
  CHECK(w.Pending()[0].function == std::string("ncclCommInitRankConfig"));
}
