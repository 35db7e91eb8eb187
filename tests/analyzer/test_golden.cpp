// Golden dump sets (made by ncclwatch-gen, see make_golden.sh): the analysis of each set must
// match its expected.json structurally (cause, communicator, seq, op, culprit and waiting
// ranks, consequences, problems), and expected.txt exactly where present.
#include <filesystem>

#include <algorithm>
#include <set>
#include <vector>

#include <catch2/catch.hpp>

#include "render/render_report.h"
#include "fixtures.h"

using namespace ncclwatch;
using namespace ncclwatch::testing;
using Json = nlohmann::json;  // the report type, keys sorted
namespace fs = std::filesystem;
namespace rk = analysis::report_key;

namespace {

// Every golden set; a set deleted or renamed must fail here, not be skipped.
const char* const kGoldenSets[] = {
    "rank_missing",  "gpu_not_reached", "stuck_in_collective", "mismatch",   "p2p_unmatched",
    "cross_comm_deadlock", "rank_dead_no_dump", "rank_dead_fatal", "no_hang", "mixed",
    "ring_overflow", "two_dumps_one_rank", "corrupt_files", "rank_exited", "nccl_error", "init_hang", "rank_stopped",
    "extra_call", "job_killed", "host_lost", "p2p_mismatch", "p2p_mismatch_dtype", "p2p_out_of_order",
    "p2p_missing_recv", "p2p_pairing_unknown",
    "sim_gpu_not_reached",  // real dumps from libncclwatch.so over the simulator
};

Json AnalyzeDir(const std::string& dir, analysis::Report* out = nullptr) {
  analysis::DumpSet set;
  std::string error;
  REQUIRE(set.Load(dir, {}, &error));
  analysis::Report report = analysis::Attribute(set);
  Json j = analysis::ReportToJson(report);
  if (out) *out = std::move(report);
  return j;
}

// The fields a verdict must get right; the rest (stacks, advice wording) may evolve.
Json Essential(const Json& v) {
  Json e;
  for (const char* k : {rk::kCause, rk::kComm, rk::kSeq, rk::kOp, rk::kCulpritRanks, rk::kCulpritCommRanks,
                        rk::kWaitingRanks, rk::kCycle, rk::kCallCountDivergence, rk::kTie, rk::kP2pSrc, rk::kP2pDst,
                        rk::kMismatch, rk::kP2pCalls})
    if (v.contains(k)) e[k] = v[k];
  Json consequences = Json::array();
  for (const auto& q : v[rk::kConsequences])
    consequences.push_back({{rk::kComm, q[rk::kComm]}, {rk::kSeq, q[rk::kSeq]}, {rk::kWaitingRanks, q[rk::kWaitingRanks]}});
  e[rk::kConsequences] = consequences;
  Json culprits_with_stacks = Json::array();
  for (const auto& [rank, s] : v[rk::kCulpritStacks].items())
    culprits_with_stacks.push_back({rank, !s[rk::kCurrent].empty(), !s[rk::kCallsite].empty()});
  e[rk::kCulpritStacks] = culprits_with_stacks;
  return e;
}

}  // namespace

TEST_CASE("golden dump sets give their expected verdicts", "[golden]") {
  for (const char* name : kGoldenSets) {
    DYNAMIC_SECTION(name) {
      fs::path dir = fs::path(GOLDEN_DIR) / name;
      REQUIRE(fs::exists(dir / "expected.json"));
      Json expected = Json::parse(ReadFile((dir / "expected.json").string()));
      Json actual = AnalyzeDir(dir.string());

      CHECK(actual[rk::kRanksSeen] == expected[rk::kRanksSeen]);
      CHECK(actual[rk::kWorldSize] == expected[rk::kWorldSize]);
      CHECK(actual[rk::kRanksWithoutDump] == expected[rk::kRanksWithoutDump]);
      CHECK(actual[rk::kProblems] == expected[rk::kProblems]);
      CHECK(actual[rk::kEarlierDumps] == expected[rk::kEarlierDumps]);
      CHECK(actual[rk::kFindings] == expected[rk::kFindings]);  // no slow rank invented
      REQUIRE(actual[rk::kVerdicts].size() == expected[rk::kVerdicts].size());
      for (size_t i = 0; i < expected[rk::kVerdicts].size(); ++i) {
        INFO("verdict " << i);
        CHECK(Essential(actual[rk::kVerdicts][i]).dump(1) == Essential(expected[rk::kVerdicts][i]).dump(1));
      }
    }
  }
}

// The verdicts a report's root causes must be, from the set's scenario-truth.json: written by
// ncclwatch-gen from how it built the scenario (or, for a captured set, from the injected
// fault), never from an earlier analysis.
void CheckAgainstTruth(const Json& report, const Json& truth) {
  const Json& verdicts = report[rk::kVerdicts];
  REQUIRE(verdicts.size() == truth["verdicts"].size());
  for (const auto& t : truth["verdicts"]) {
    INFO("expected " << t.dump());
    bool found = false;
    for (const auto& v : verdicts) {
      std::vector<int> culprits = v[rk::kCulpritRanks].get<std::vector<int>>();
      std::sort(culprits.begin(), culprits.end());
      bool seq_ok = t["seqs"].empty();
      for (const auto& seq : t["seqs"]) seq_ok = seq_ok || seq == v[rk::kSeq];
      found = found || (v[rk::kCause] == t[rk::kCause] && culprits == t[rk::kCulpritRanks].get<std::vector<int>>() &&
                        seq_ok);
    }
    CHECK(found);
  }
}

TEST_CASE("golden verdicts agree with the scenario each set was made from", "[golden]") {
  for (const char* name : kGoldenSets) {
    DYNAMIC_SECTION(name) {
      fs::path dir = fs::path(GOLDEN_DIR) / name;
      REQUIRE(fs::exists(dir / "scenario-truth.json"));
      Json truth = Json::parse(ReadFile((dir / "scenario-truth.json").string()));
      {
        INFO("expected.json");
        CheckAgainstTruth(Json::parse(ReadFile((dir / "expected.json").string())), truth);
      }
      {
        INFO("analysis now");
        CheckAgainstTruth(AnalyzeDir(dir.string()), truth);
      }
    }
  }
}

TEST_CASE("golden text reports render as expected", "[golden]") {
  size_t compared = 0;
  for (const char* name : kGoldenSets) {
    fs::path dir = fs::path(GOLDEN_DIR) / name;
    if (!fs::exists(dir / "expected.txt")) continue;
    DYNAMIC_SECTION(name) {
      analysis::Report report;
      AnalyzeDir(dir.string(), &report);
      analysis::ReportTextOptions options;  // no colour
      CHECK(analysis::RenderReportText(report, options) == ReadFile((dir / "expected.txt").string()));
    }
    ++compared;
  }
  CHECK(compared >= 2);
}

TEST_CASE("golden sets cover every verdict cause", "[golden]") {
  std::set<std::string> causes;
  for (const char* name : kGoldenSets) {
    Json expected = Json::parse(ReadFile((fs::path(GOLDEN_DIR) / name / "expected.json").string()));
    for (const auto& v : expected[rk::kVerdicts]) causes.insert(v[rk::kCause].get<std::string>());
  }
  for (const char* c : analysis::kCauseNames) CHECK(causes.count(c) == 1);
}
