// A process that drives several ranks (several devices): its dump is one dump per rank.
#include <catch2/catch.hpp>

#include "model/rank_split.h"
#include "report/report.h"
#include "fixtures.h"

using namespace ncclwatch;
using namespace ncclwatch::testing;

namespace {

const std::string kWorld = "00000000000000aa";

// Process `p` of two, driving global ranks 4p..4p+3 on devices 0-3; `stuck_device`'s stream
// never reaches AllReduce #30, which every other rank's GPU is inside.
Document ProcessOfFour(int p, int stuck_device, bool with_devices = true) {
  std::vector<trace::CommSummary> comms;
  std::vector<trace::Op> ops;
  for (int d = 0; d < 4; ++d) {
    const int rank = 4 * p + d;
    const bool stuck = d == stuck_device;
    comms.push_back(Comm(kWorld, 8, rank, 30, stuck ? 29 : 30, 29));
    if (with_devices) comms.back().device = d;
    ops.push_back(Op(kWorld, 30, "AllReduce", stuck ? "enqueued" : "gpu_reached", 20));
    ops.back().comm_rank = rank;
  }
  Document doc = Dump(p, 2, comms, ops);  // RANK = the process's index, WORLD_SIZE = 2
  doc.summary.pid = 4000 + p;
  doc.summary.host = "node0" + std::to_string(p);
  return doc;
}

analysis::Dump AsDump(const Document& doc) {
  analysis::Dump d;
  d.summary = doc.summary;
  d.detail = std::make_shared<trace::Detail>(doc.detail);
  return d;
}

}  // namespace

TEST_CASE("a dump that holds a communicator as several ranks is one dump per rank", "[rank_split]") {
  auto ranks = analysis::SplitByRank(AsDump(ProcessOfFour(1, 2)));
  REQUIRE(ranks.size() == 4);
  for (int d = 0; d < 4; ++d) {
    const auto& r = ranks[d];
    CHECK(r.summary.rank == 4 + d);
    CHECK(r.summary.world_size == 8);
    CHECK(r.summary.local_rank == d);
    REQUIRE(r.summary.comms.size() == 1);
    CHECK(r.summary.comms[0].rank == 4 + d);
    REQUIRE(r.summary.in_flight.size() == 1);
    CHECK(r.summary.in_flight[0].comm_rank == 4 + d);
    REQUIRE(r.share);
    CHECK(r.share->device == d);
    CHECK(r.share->process_ranks == std::vector<int>{4, 5, 6, 7});
    CHECK(r.share->process_rank == 1);
    CHECK(r.ProcessKey() != ranks[(d + 1) % 4].ProcessKey());  // each rank's dumps a history of its own
    CHECK(r.ProcessOnlyKey() == ranks[(d + 1) % 4].ProcessOnlyKey());
  }
}

TEST_CASE("a dump without its communicators' devices (older, or one rank) stays one dump", "[rank_split]") {
  CHECK(analysis::SplitByRank(AsDump(ProcessOfFour(1, 2, false))).size() == 1);
  Document one = Dump(3, 8, {Comm(kWorld, 8, 3, 30, 30, 29)});
  CHECK(analysis::SplitByRank(AsDump(one)).size() == 1);
}

TEST_CASE("a stuck device of a process that drives four ranks is that rank's gpu_not_reached", "[rank_split]") {
  TempDir dir;
  auto report = Analyze(dir, {ProcessOfFour(0, -1), ProcessOfFour(1, 2)});
  REQUIRE(!report.verdicts.empty());
  const auto& v = report.verdicts[0];
  CHECK(v.cause == analysis::Cause::GpuNotReached);
  CHECK(v.culprit_ranks == std::vector<int>{6});
  REQUIRE(!v.evidence.empty());
  CHECK(v.evidence[0].device == 2);
  CHECK(v.evidence[0].pid == 4001);
  CHECK(v.evidence[0].process_ranks == std::vector<int>{4, 5, 6, 7});
}
