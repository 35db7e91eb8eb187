// Stalls that recovered: no hang, and what held them up at the time.
#include <catch2/catch.hpp>

#include "render/render_report.h"
#include "fixtures.h"

using namespace ncclwatch;
using namespace ncclwatch::testing;
using analysis::Cause;

namespace {

const std::string kWorld = "000000000000000a";

trace::Thread MainThread(int64_t tid, const char* function) {
  trace::Thread t;
  t.tid = tid;
  t.name = "python";
  t.stack.python.push_back({"train.py", 42, function, false});
  return t;
}

// Rank 0 waits in AllReduce #31 past its deadline (a stall dump and its request); rank 1, busy
// in save_checkpoint, answers from #30. Then #31 completes: rank 0's recovery dump.
std::vector<Document> RecoveredEpisode() {
  std::vector<Document> dumps;
  trace::Op stalled = Op(kWorld, 31, "AllReduce", "gpu_reached", 10.0);
  stalled.deadline_s = 10.0;
  Document stall = Dump(0, 2, {Comm(kWorld, 2, 0, 31, 31, 30)}, {stalled}, "stall");
  stall.summary.stalled = stalled;
  stall.detail.threads.push_back(MainThread(stall.summary.pid, "train_step"));
  dumps.push_back(stall);

  Document busy = Dump(1, 2, {Comm(kWorld, 2, 1, 30, 30, 30)});  // answers rank 0's stall request
  busy.detail.threads.push_back(MainThread(busy.summary.pid, "save_checkpoint"));
  dumps.push_back(busy);

  Document recovery = Dump(0, 2, {Comm(kWorld, 2, 0, 33, 33, 32)},
                           {Op(kWorld, 33, "AllReduce", "enqueued", 0.0)}, "recovery");
  recovery.summary.dump_seq = 1;
  recovery.summary.time_unix_ns += 15000000000LL;
  recovery.detail.light = true;
  recovery.detail.recoveries.push_back({kWorld, 31, "AllReduce", 10.0, 15.0});
  dumps.push_back(recovery);
  return dumps;
}

}  // namespace

TEST_CASE("a stall that recovered is no hang, and the report says what held it up", "[recovery]") {
  TempDir dir;
  auto report = Analyze(dir, RecoveredEpisode());
  CHECK_FALSE(report.Hang());
  REQUIRE(report.recovered_stalls.size() == 1);
  const auto& r = report.recovered_stalls[0];
  CHECK(r.rank == 0);
  CHECK(r.op.op == "AllReduce");
  CHECK(r.op.seq == 31);
  CHECK(r.stalled_after_s == Approx(10.0));
  CHECK(r.recovered_after_s == Approx(15.0));
  CHECK(r.cause == Cause::RankMissing);
  CHECK(r.waiting_for == std::vector<int>{1});
  REQUIRE(r.culprit);
  REQUIRE_FALSE(r.culprit->current.python.empty());
  CHECK(r.culprit->current.python[0].function == "save_checkpoint");

  std::string text = analysis::RenderReportText(report, {});
  CHECK(text.find("no hang") != std::string::npos);
  CHECK(text.find("AllReduce #31") != std::string::npos);
  CHECK(text.find("stalled 15.0 s") != std::string::npos);
  CHECK(text.find("waiting for rank 1 (busy in save_checkpoint") != std::string::npos);
  CHECK(text.find("it recovered") != std::string::npos);
  auto j = analysis::ReportToJson(report);
  REQUIRE(j["recovered_stalls"].size() == 1);
  CHECK(j["recovered_stalls"][0]["waiting_for"] == nlohmann::json::array({1}));
}

TEST_CASE("a stall that recovered does not hide a later one that did not", "[recovery]") {
  TempDir dir;
  auto dumps = RecoveredEpisode();
  // Later, rank 0 stalls again in #40 and rank 1 never comes: a hang.
  trace::Op stalled = Op(kWorld, 40, "AllReduce", "gpu_reached", 10.0);
  stalled.deadline_s = 10.0;
  Document again = Dump(0, 2, {Comm(kWorld, 2, 0, 40, 40, 39)}, {stalled}, "stall");
  again.summary.stalled = stalled;
  again.summary.dump_seq = 2;
  again.summary.time_unix_ns += 60000000000LL;
  dumps.push_back(again);
  Document busy = Dump(1, 2, {Comm(kWorld, 2, 1, 39, 39, 39)});
  busy.summary.dump_seq = 1;
  busy.summary.time_unix_ns += 60000000000LL;
  dumps.push_back(busy);
  auto report = Analyze(dir, dumps);
  REQUIRE(report.Hang());
  CHECK(report.verdicts[0].cause == Cause::RankMissing);
  CHECK(report.verdicts[0].seq == 40);
  CHECK(report.verdicts[0].culprit_ranks == std::vector<int>{1});
  REQUIRE(report.recovered_stalls.size() == 1);
  CHECK(report.recovered_stalls[0].op.seq == 31);
}

TEST_CASE("a stall whose operation completed before the rank exited is no hang", "[recovery]") {
  TempDir dir;
  auto dumps = RecoveredEpisode();
  dumps.pop_back();  // no recovery dump: the process exited first, with #31 completed
  for (int r = 0; r < 2; ++r) {
    Document exit = Dump(r, 2, {Comm(kWorld, 2, r, 50, 50, 50)}, {}, "exit");
    exit.summary.dump_seq = 1;
    exit.summary.exit_status = 0;
    exit.summary.time_unix_ns += 30000000000LL;
    dumps.push_back(exit);
  }
  auto report = Analyze(dir, dumps);
  CHECK_FALSE(report.Hang());
  REQUIRE(report.recovered_stalls.size() == 1);
  CHECK(report.recovered_stalls[0].recovered_after_s < 0);  // no recovery record: unknown
  CHECK(report.recovered_stalls[0].waiting_for == std::vector<int>{1});
}

TEST_CASE("operations an aborted communicator counts as ended did not recover", "[recovery]") {
  // The framework's timeout aborted the communicator with #6 in flight on ranks 1 and 2; their
  // exit records count #6 as ended, on an aborted communicator: that is the teardown.
  TempDir dir;
  std::vector<Document> dumps;
  dumps.push_back(Dump(0, 3, {Comm(kWorld, 3, 0, 5, 5, 5)}, {}, "signal"));
  for (int r = 1; r < 3; ++r) {
    Document abort = Dump(r, 3, {Comm(kWorld, 3, r, 6, 6, 5)}, {Op(kWorld, 6, "AllReduce", "gpu_reached", 1.9)}, "abort");
    abort.summary.comms[0].state = "aborted";
    Document exit = Dump(r, 3, {Comm(kWorld, 3, r, 6, 6, 6)}, {}, "exit");
    exit.summary.comms[0].state = "aborted";
    exit.summary.dump_seq = 1;
    dumps.push_back(abort);
    dumps.push_back(exit);
  }
  auto report = Analyze(dir, dumps);
  REQUIRE(report.Hang());
  CHECK(report.verdicts[0].cause == Cause::RankMissing);
  CHECK(report.verdicts[0].culprit_ranks == std::vector<int>{0});
}

TEST_CASE("a recovered stall names the busy rank from its answer to whichever rank asked", "[recovery]") {
  // Ranks 0, 1 and 3 stall in AllReduce #31; rank 3 got stuck first and wrote the job-wide
  // request (the others found it fresh and wrote none). Busy rank 2 answered it from #30, then
  // went on: the finding names rank 2 busy in save_checkpoint, never dead or without a dump.
  TempDir dir;
  std::vector<Document> dumps;
  for (int r : {0, 1, 3}) {
    trace::Op stalled = Op(kWorld, 31, "AllReduce", "gpu_reached", 10.0);
    stalled.deadline_s = 10.0;
    Document stall = Dump(r, 4, {Comm(kWorld, 4, r, 31, 31, 30)}, {stalled}, "stall");
    stall.summary.stalled = stalled;
    stall.detail.threads.push_back(MainThread(stall.summary.pid, "train_step"));
    dumps.push_back(stall);
    Document recovery = Dump(r, 4, {Comm(kWorld, 4, r, 33, 33, 32)}, {Op(kWorld, 33, "AllReduce", "enqueued", 0.0)},
                             "recovery");
    recovery.summary.dump_seq = 1;
    recovery.summary.time_unix_ns += 15000000000LL;
    recovery.detail.light = true;
    recovery.detail.recoveries.push_back({kWorld, 31, "AllReduce", 10.0, 15.0});
    dumps.push_back(recovery);
  }
  Document busy = Dump(2, 4, {Comm(kWorld, 4, 2, 30, 30, 30)});
  busy.summary.answered = trace::AnsweredRequest{"h0-1003-0", 3, "h0", trace::DumpReasonName(trace::DumpReason::Stall)};
  busy.summary.time_unix_ns += 500000000LL;  // its answer, half a second into the stall's request
  busy.detail.threads.push_back(MainThread(busy.summary.pid, "save_checkpoint"));
  dumps.push_back(busy);

  auto report = Analyze(dir, dumps);
  INFO(analysis::ReportToJson(report).dump());
  CHECK_FALSE(report.Hang());
  REQUIRE(report.recovered_stalls.size() == 1);
  const auto& r = report.recovered_stalls[0];
  CHECK(r.cause == Cause::RankMissing);
  CHECK(r.waiting_for == std::vector<int>{2});
  REQUIRE(r.culprit);
  REQUIRE_FALSE(r.culprit->current.python.empty());
  CHECK(r.culprit->current.python[0].function == "save_checkpoint");
  std::string text = analysis::RenderReportText(report, {});
  CHECK(text.find("waiting for rank 2 (busy in save_checkpoint") != std::string::npos);
  CHECK(text.find("rank_dead") == std::string::npos);
  CHECK(text.find("left no dump") == std::string::npos);
}
