// The endings real jobs have (issue: verdicts that stay right when jobs end messily), on small
// hand-made dump sets: the framework's abort first, an NCCL error, a rank that exits, a healthy
// job stopped or snapshotted, a setup hang, stale evidence, reused directories, shared pids.
#include <catch2/catch.hpp>

#include "format/display.h"
#include "render/render_report.h"
#include "fixtures.h"

using namespace ncclwatch;
using namespace ncclwatch::testing;
using analysis::Cause;
using R = trace::DumpReason;

namespace {

const std::string kWorld = "00000000000000a1";
const std::string kOther = "00000000000000a2";

const char* Name(R r) { return trace::DumpReasonName(r); }
std::vector<int> Ranks(std::initializer_list<int> r) { return r; }

// A later dump of the same process (dump_seq + 1).
Document Then(Document d, R reason) {
  d.summary.dump_seq += 1;
  d.summary.reason = trace::DumpReasonValue::Of(reason);
  d.summary.answered.reset();
  d.summary.time_unix_ns += 1000000000;
  return d;
}

}  // namespace

// PyTorch's watchdog (4 s timeout, ncclwatch's deadline 600 s) aborts the waiting ranks 1-3's
// communicators, then abort(): an abort dump, then a fatal_signal dump. Rank 0 is busy in a
// checkpoint and answers the job-wide request the abort wrote. With `answer_between`, each
// waiting rank also answers a peer's request between its abort and its SIGABRT (a busy machine).
namespace {
std::vector<Document> FrameworkAbortThenSigabrt(bool answer_between) {
  Document busy = Dump(0, 4, {Comm(kWorld, 4, 0, 7, 7, 7)}, {}, Name(R::PeerRequest));
  busy.summary.answered->reason = Name(R::Abort);
  std::vector<Document> dumps = {busy, Then(busy, R::Signal)};
  for (int r = 1; r < 4; ++r) {
    Document abort = Dump(r, 4, {Comm(kWorld, 4, r, 8, 8, 7)}, {Op(kWorld, 8, "AllGather", "gpu_reached", 4.2)},
                          Name(R::Abort));
    dumps.push_back(abort);
    if (answer_between) dumps.push_back(abort = Then(abort, R::PeerRequest));
    dumps.push_back(Then(abort, R::FatalSignal));
  }
  return dumps;
}
}  // namespace

TEST_CASE("the framework aborts first: the abort is the evidence, not the SIGABRT after it", "[endings]") {
  for (bool answer_between : {false, true}) {
    INFO("a peer's request answered between the abort and the SIGABRT: " << answer_between);
    TempDir dir;
    auto report = Analyze(dir, FrameworkAbortThenSigabrt(answer_between));
    INFO(analysis::ReportToJson(report).dump());
    REQUIRE(report.verdicts.size() == 1);
    const auto& v = report.verdicts[0];
    CHECK(v.cause == Cause::RankMissing);
    CHECK(v.culprit_ranks == Ranks({0}));
    CHECK(v.seq == 8);
    CHECK(v.waiting_ranks == Ranks({1, 2, 3}));
  }
}

// ncclwatch's deadline (5 s) names rank 0, busy in a checkpoint; minutes later the framework's
// watchdog aborts ranks 1-3's communicators, then ends them: exit(6) or abort() (SIGABRT). Each
// waiting rank: a stall dump, an abort dump, its end. `old_library`: a library before the
// `aborted` state counted the operations the abort released as completed: a recovery dump, and
// an end whose last_completed moved on. `abort_dump`: false when the abort wrote none (its dump
// budget spent): only the later dumps show the communicator aborted.
namespace {
std::vector<Document> AbortAfterVerdict(R ending, bool old_library, bool abort_dump, bool stall_dump = true,
                                        bool error_after_abort = false) {
  Document busy = Dump(0, 4, {Comm(kWorld, 4, 0, 7, 7, 7)}, {}, Name(R::PeerRequest));
  busy.summary.answered->reason = Name(R::Stall);
  std::vector<Document> dumps = {busy, Then(busy, R::Signal)};
  for (int r = 1; r < 4; ++r) {
    trace::Op op = Op(kWorld, 8, "AllReduce", "gpu_reached", 5.2);
    op.deadline_s = 5;
    Document stall = Dump(r, 4, {Comm(kWorld, 4, r, 8, 8, 7)}, {op}, Name(R::Stall));
    stall.summary.stalled = op;
    if (stall_dump) dumps.push_back(stall);
    Document d = stall;
    d.summary.stalled.reset();
    d.summary.in_flight[0].age_s = 600;
    d.summary.comms[0].state = trace::CommStateName(trace::CommState::Aborted);
    d = Then(d, R::Abort);
    if (abort_dump) dumps.push_back(d);
    if (old_library) {
      d.summary.comms[0].last_completed = 8;
      d.summary.in_flight.clear();
      dumps.push_back(d = Then(d, R::Recovery));
    }
    d.summary.in_flight.clear();
    if (error_after_abort) {  // the training thread's next collective, on the aborted communicator
      Document error = Then(d, R::NcclError);
      error.summary.comms[0].last_enqueued = 9;
      error.summary.failed = Op(kWorld, 9, "AllReduce", "error", 0.001);
      error.summary.failed->result = 5;  // ncclInvalidUsage
      error.summary.error_result = 5;
      dumps.push_back(d = error);
    }
    Document end = Then(d, ending);
    end.summary.failed.reset();
    end.summary.error_result = 0;
    if (ending == R::Exit) {
      end.summary.exit_status = 6;
      end.summary.detail = "exit status 6";
    } else {
      end.summary.detail = "signal SIGABRT (Aborted)";
    }
    dumps.push_back(end);
  }
  return dumps;
}
}  // namespace

TEST_CASE("the framework's abort after the verdict keeps it: the aborting ranks ended after the wait", "[endings]") {
  for (R ending : {R::Exit, R::FatalSignal})
    for (bool old_library : {false, true})
      for (bool abort_dump : {true, false}) {
        INFO("ending " << Name(ending) << ", old library " << old_library << ", abort dump " << abort_dump);
        TempDir dir;
        auto report = Analyze(dir, AbortAfterVerdict(ending, old_library, abort_dump));
        INFO(analysis::ReportToJson(report).dump());
        REQUIRE(report.verdicts.size() == 1);
        const auto& v = report.verdicts[0];
        CHECK(v.cause == Cause::RankMissing);
        CHECK(v.culprit_ranks == Ranks({0}));
        CHECK(v.seq == 8);
        CHECK(v.waiting_ranks == Ranks({1, 2, 3}));
        REQUIRE(v.ended_by_framework.size() == 3);
        for (const auto& e : v.ended_by_framework) {
          CHECK(e.reason == Name(ending));
          CHECK(analysis::FrameworkEndingText(e) ==
                (ending == R::Exit ? "ncclCommAbort, then exit status 6" : "ncclCommAbort, then SIGABRT"));
        }
        CHECK(report.recovered_stalls.empty());
        const std::string text = analysis::RenderReportText(report, {});
        CHECK(text.find("ranks 1-3: ended by their framework after the wait (ncclCommAbort, then ") != std::string::npos);
        CHECK(text.find("rank_dead") == std::string::npos);
      }
}

TEST_CASE("an NCCL error on a communicator the rank itself aborted is part of its teardown", "[endings]") {
  // The framework's thread aborts; the training thread's next collective on that communicator
  // returns ncclInvalidUsage (an nccl_error dump) before the SIGABRT: no nccl_error verdict.
  for (bool abort_dump : {true, false}) {
    INFO("abort dump " << abort_dump);
    TempDir dir;
    auto report = Analyze(dir, AbortAfterVerdict(R::FatalSignal, false, abort_dump, true, /*error_after_abort=*/true));
    INFO(analysis::ReportToJson(report).dump());
    REQUIRE(report.verdicts.size() == 1);
    CHECK(report.verdicts[0].cause == Cause::RankMissing);
    CHECK(report.verdicts[0].culprit_ranks == Ranks({0}));
    CHECK(report.verdicts[0].waiting_ranks == Ranks({1, 2, 3}));
    CHECK(report.verdicts[0].ended_by_framework.size() == 3);
  }
}

TEST_CASE("the culprit back just after the framework gave up is still the one that never came", "[endings]") {
  // Ranks 1-3 wait in #8 until their framework aborts at T; rank 0, back from its checkpoint,
  // issues #8 at T + 0.3 s (same host) and waits in it alone until its own framework aborts.
  // Every member is then inside #8, but for those who waited rank 0 never came: rank_missing,
  // not stuck_in_collective. Issued before T, it is what it was (every member inside: stuck).
  for (double entered_after_s : {0.3, -0.5}) {
    INFO("rank 0 issued #8 " << entered_after_s << " s after the others' abort");
    TempDir dir;
    std::vector<Document> dumps = AbortAfterVerdict(R::FatalSignal, false, true);
    dumps.erase(dumps.begin(), dumps.begin() + 2);  // rank 0's own dumps, made again below
    const int64_t abort_unix = dumps[1].summary.time_unix_ns;  // rank 1's abort
    for (auto& d : dumps) d.summary.host = "h0";
    trace::Op op = Op(kWorld, 8, "AllReduce", "gpu_reached", 5);
    Document late = Dump(0, 4, {Comm(kWorld, 4, 0, 8, 8, 7)}, {op}, Name(R::Abort));
    late.summary.host = "h0";
    late.summary.comms[0].state = trace::CommStateName(trace::CommState::Aborted);
    late.summary.time_unix_ns = abort_unix + static_cast<int64_t>((entered_after_s + 5) * 1e9);
    late.summary.in_flight[0].enqueue_ns = late.summary.time_mono_ns - 5'000'000'000LL;
    dumps.push_back(late);
    dumps.push_back(Then(late, R::FatalSignal));
    auto report = Analyze(dir, dumps);
    INFO(analysis::ReportToJson(report).dump());
    REQUIRE(report.verdicts.size() == 1);
    if (entered_after_s > 0) {
      CHECK(report.verdicts[0].cause == Cause::RankMissing);
      CHECK(report.verdicts[0].seq == 8);
      CHECK(report.verdicts[0].culprit_ranks == Ranks({0}));
      CHECK(report.verdicts[0].waiting_ranks == Ranks({1, 2, 3}));
    } else {
      CHECK(report.verdicts[0].cause == Cause::StuckInCollective);
    }
  }
}

TEST_CASE("the culprit that completed the collective the others had aborted came too late for them", "[endings]") {
  // As above, but rank 0's side of #8 completed (from what the others had posted before their
  // abort, or as their abort happened) and it waits in #9 alone.
  TempDir dir;
  std::vector<Document> dumps = AbortAfterVerdict(R::FatalSignal, false, true);
  dumps.erase(dumps.begin(), dumps.begin() + 2);
  Document late = Dump(0, 4, {Comm(kWorld, 4, 0, 9, 9, 8)}, {Op(kWorld, 9, "AllReduce", "gpu_reached", 5)},
                       Name(R::Abort));
  late.summary.comms[0].state = trace::CommStateName(trace::CommState::Aborted);
  dumps.push_back(late);
  dumps.push_back(Then(late, R::FatalSignal));
  auto report = Analyze(dir, dumps);
  INFO(analysis::ReportToJson(report).dump());
  REQUIRE(report.verdicts.size() == 1);
  CHECK(report.verdicts[0].cause == Cause::RankMissing);
  CHECK(report.verdicts[0].culprit_ranks == Ranks({0}));
  CHECK(report.verdicts[0].seq == 8);
  CHECK(report.verdicts[0].ended_by_framework.size() == 3);
}

TEST_CASE("a rank its framework ended mid-wait is no crash, even with no stall or abort dump", "[endings]") {
  // The framework's timeout came before ncclwatch's deadline, and the abort wrote no dump: the
  // SIGABRT's dump alone shows the communicator aborted with #8 issued and not completed.
  TempDir dir;
  auto report = Analyze(dir, AbortAfterVerdict(R::FatalSignal, false, false, /*stall_dump=*/false));
  INFO(analysis::ReportToJson(report).dump());
  REQUIRE(report.verdicts.size() == 1);
  CHECK(report.verdicts[0].cause == Cause::RankMissing);
  CHECK(report.verdicts[0].culprit_ranks == Ranks({0}));
  CHECK(report.verdicts[0].ended_by_framework.size() == 3);
}

TEST_CASE("a crash with no abort before it is still rank_dead", "[endings]") {
  TempDir dir;
  std::vector<Document> dumps = {Dump(0, 2, {Comm(kWorld, 2, 0, 5, 5, 4)}, {}, Name(R::FatalSignal)),
                                 Dump(1, 2, {Comm(kWorld, 2, 1, 6, 6, 5)}, {Op(kWorld, 6, "AllReduce", "gpu_reached")},
                                      Name(R::Stall))};
  auto report = Analyze(dir, dumps);
  REQUIRE(report.verdicts.size() == 1);
  CHECK(report.verdicts[0].cause == Cause::RankDead);
  CHECK(report.verdicts[0].culprit_ranks == Ranks({0}));
}

TEST_CASE("an NCCL error names the call that failed, not ranks that only heard of it", "[endings]") {
  TempDir dir;
  // Rank 2's ncclAllReduce #12 returned ncclSystemError; it printed it and exited (status 3).
  // Rank 3 got ncclRemoteError asynchronously; ranks 0 and 1 wait inside #12.
  trace::Op failed = Op(kWorld, 12, "AllReduce", "error", -1);
  failed.result = 2;
  failed.callsite = 0;
  Document err = Dump(2, 4, {Comm(kWorld, 4, 2, 12, 11, 11)}, {}, Name(R::NcclError));
  err.summary.failed = failed;
  err.summary.detail = "ncclAllReduce returned 2 (unhandled system error) on comm " + kWorld;
  err.detail.callsites.push_back({0, {{}, {{"train.py", 88, "train_step", false}}}, "", ""});
  Document exit = Then(err, R::Exit);
  exit.summary.exit_status = 3;
  Document remote = Dump(3, 4, {Comm(kWorld, 4, 3, 12, 12, 11)}, {}, Name(R::AsyncError));
  remote.summary.detail = "ncclCommGetAsyncError reported asynchronous error 6 (remote process exited or there was a network error)";
  remote.summary.error_result = 6;
  std::vector<Document> dumps = {err, exit, remote};
  for (int r = 0; r < 2; ++r)
    dumps.push_back(Dump(r, 4, {Comm(kWorld, 4, r, 12, 12, 11)}, {Op(kWorld, 12, "AllReduce", "gpu_reached", 700)},
                         Name(R::Stall)));
  auto report = Analyze(dir, dumps);
  INFO(analysis::ReportToJson(report).dump());
  REQUIRE(!report.verdicts.empty());
  const auto& v = report.verdicts[0];
  CHECK(v.cause == Cause::NcclError);
  CHECK(v.culprit_ranks == Ranks({2}));
  CHECK(v.seq == 12);
  REQUIRE(v.evidence.size() == 1);
  CHECK(analysis::WhereText(v.evidence[0]).find("returned 2 (unhandled system error)") != std::string::npos);
  CHECK(analysis::WhereText(v.evidence[0]).find("then exit") != std::string::npos);
  REQUIRE(v.evidence[0].callsite_op);
  CHECK(v.evidence[0].callsite_op->op == "AllReduce");
  CHECK(v.evidence[0].callsite_op->seq == 12);
  REQUIRE_FALSE(v.evidence[0].callsite.python.empty());
  CHECK(v.evidence[0].callsite.python[0].function == "train_step");
  CHECK(analysis::AdviceText(v, report).find("unhandled system error") != std::string::npos);
}

TEST_CASE("a remote error is known by its result code, whichever call reported it", "[endings]") {
  // Rank 2's AllReduce #12 failed (ncclSystemError); rank 3 heard of it as ncclRemoteError:
  // from ncclGroupEnd (synchronous, no failed operation recorded), from ncclCommGetAsyncError,
  // or from its AllReduce itself. Only rank 2 is the cause, however rank 3's detail reads.
  struct Case {
    const char* name;
    R reason;
    const char* detail;
    bool failed_op;
  };
  for (const Case& c : {Case{"group end", R::NcclError, "ncclGroupEnd returned 6 (remote process exited or there was a network error)", false},
                        Case{"async", R::AsyncError, "ncclCommGetAsyncError reported asynchronous error 6 (...)", false},
                        Case{"the call", R::NcclError, "ncclAllReduce returned 6 (...)", true},
                        Case{"worded otherwise", R::NcclError, "ncclGroupEnd: remote error", false}}) {
    SECTION(c.name) {
      TempDir dir;
      trace::Op failed = Op(kWorld, 12, "AllReduce", "error", -1);
      failed.result = 2;
      Document err = Dump(2, 4, {Comm(kWorld, 4, 2, 12, 11, 11)}, {}, Name(R::NcclError));
      err.summary.failed = failed;
      err.summary.error_result = 2;
      err.summary.detail = "ncclAllReduce returned 2 (unhandled system error)";
      Document remote = Dump(3, 4, {Comm(kWorld, 4, 3, 12, 12, 11)}, {}, Name(c.reason));
      remote.summary.detail = c.detail;
      remote.summary.error_result = 6;
      if (c.failed_op) {
        trace::Op r = failed;
        r.result = 6;
        remote.summary.failed = r;
      }
      std::vector<Document> dumps = {err, remote};
      for (int r = 0; r < 2; ++r)
        dumps.push_back(Dump(r, 4, {Comm(kWorld, 4, r, 12, 12, 11)},
                             {Op(kWorld, 12, "AllReduce", "gpu_reached", 700)}, Name(R::Stall)));
      auto report = Analyze(dir, dumps);
      INFO(analysis::ReportToJson(report).dump());
      REQUIRE(!report.verdicts.empty());
      CHECK(report.verdicts[0].cause == Cause::NcclError);
      CHECK(report.verdicts[0].culprit_ranks == Ranks({2}));
    }
  }
}

TEST_CASE("a rank that left normally is named as exited after its last call", "[endings]") {
  TempDir dir;
  Document left = Dump(1, 3, {Comm(kWorld, 3, 1, 20, 20, 20)}, {}, Name(R::Exit));
  left.summary.exit_status = 0;
  std::vector<Document> dumps = {left};
  for (int r : {0, 2})
    dumps.push_back(Dump(r, 3, {Comm(kWorld, 3, r, 21, 21, 20)}, {Op(kWorld, 21, "AllReduce", "gpu_reached", 650)},
                         Name(R::Stall)));
  auto report = Analyze(dir, dumps);
  REQUIRE(report.verdicts.size() == 1);
  const auto& v = report.verdicts[0];
  CHECK(v.cause == Cause::RankExited);
  CHECK(v.culprit_ranks == Ranks({1}));
  CHECK(v.seq == 21);
  REQUIRE(v.evidence.size() == 1);
  CHECK(analysis::WhereText(v.evidence[0]).find("exited with status 0") != std::string::npos);
  CHECK(analysis::WhereText(v.evidence[0]).find("last call on this communicator #20") != std::string::npos);
}

TEST_CASE("a healthy job stopped by SIGTERM is not a hang", "[endings]") {
  TempDir dir;
  // Every rank dumped on SIGTERM a few ms apart: they are at different sequence numbers, with
  // young operations in flight.
  std::vector<Document> dumps;
  for (int r = 0; r < 4; ++r) {
    int64_t seq = 100 + (r % 2);
    dumps.push_back(Dump(r, 4, {Comm(kWorld, 4, r, seq, seq, seq - 1)},
                         {Op(kWorld, seq, "AllReduce", r == 3 ? "enqueued" : "gpu_reached", 0.002)}, Name(R::Signal)));
  }
  auto report = Analyze(dir, dumps);
  INFO(analysis::ReportToJson(report).dump());
  CHECK_FALSE(report.Hang());
  REQUIRE(report.verdicts.size() == 1);
  CHECK(report.verdicts[0].cause == Cause::NoHang);
  CHECK(report.verdicts[0].stopped_while_healthy);
  CHECK(analysis::AdviceText(report.verdicts[0], report).find("stopped or snapshotted while healthy") !=
        std::string::npos);

  // The same moment seen through on-demand snapshots (ncclwatch dump) reads the same.
  TempDir snap;
  for (auto& d : dumps) d.summary.reason = trace::DumpReasonValue::Of(R::OnDemand);
  CHECK_FALSE(Analyze(snap, dumps).Hang());
}

TEST_CASE("an abort at shutdown with young operations is not a hang, a timeout's abort is", "[endings]") {
  for (double age : {0.001, 30.0}) {
    TempDir dir;
    std::vector<Document> dumps;
    for (int r = 0; r < 3; ++r) {
      bool behind = r == 2;  // rank 2 has not issued #9 yet
      dumps.push_back(Dump(r, 3, {Comm(kWorld, 3, r, behind ? 8 : 9, behind ? 8 : 9, 8)},
                           behind ? std::vector<trace::Op>{} : std::vector<trace::Op>{Op(kWorld, 9, "AllReduce", "gpu_reached", age)},
                           Name(R::Abort)));
    }
    auto report = Analyze(dir, dumps);
    INFO("age " << age << ": " << analysis::ReportToJson(report).dump());
    if (age < 1) {
      CHECK_FALSE(report.Hang());
    } else {
      REQUIRE(report.Hang());
      CHECK(report.verdicts[0].cause == Cause::RankMissing);
      CHECK(report.verdicts[0].culprit_ranks == Ranks({2}));
    }
  }
}

TEST_CASE("a failed communicator creation is not a hang", "[endings]") {
  TempDir dir;
  Document failed = Dump(0, 2, {}, {}, Name(R::NcclError));
  failed.summary.detail = "ncclCommInitRank returned 5 (invalid usage)";
  auto report = Analyze(dir, {failed, Dump(1, 2, {Comm(kWorld, 2, 1, 3, 3, 3)}, {}, Name(R::Exit))});
  CHECK_FALSE(report.Hang());
}

TEST_CASE("a setup hang names the ranks that never joined the communicator", "[endings]") {
  TempDir dir;
  std::vector<Document> dumps;
  for (int r : {0, 1, 3}) {
    trace::CommSummary c = Comm(kWorld, 4, r, 0, 0, 0);
    c.state = trace::CommStateName(trace::CommState::Initializing);
    Document d = Dump(r, 4, {c}, {}, Name(r == 0 ? R::Stall : R::PeerRequest));
    d.summary.in_nccl.push_back({1000 + r, "ncclCommInitRank", 61.0 + r});
    dumps.push_back(d);
  }
  auto report = Analyze(dir, dumps);
  INFO(analysis::ReportToJson(report).dump());
  REQUIRE(report.verdicts.size() == 1);
  const auto& v = report.verdicts[0];
  CHECK(v.cause == Cause::InitHang);
  CHECK(v.comm == kWorld);
  CHECK(v.culprit_ranks == Ranks({2}));
  CHECK(v.waiting_ranks == Ranks({0, 1, 3}));
  CHECK(v.op == "ncclCommInitRank");
  CHECK(v.waited_s == Approx(64));
}

TEST_CASE("evidence much older than the rest is said", "[endings]") {
  TempDir dir;
  std::vector<Document> dumps;
  for (int r = 0; r < 3; ++r)
    dumps.push_back(Dump(r, 3, {Comm(kWorld, 3, r, 9, 9, 8)}, {Op(kWorld, 9, "AllReduce", "gpu_reached", 700)},
                         Name(R::Stall)));
  dumps[1].summary.time_unix_ns -= int64_t{3600} * 1000000000;
  auto report = Analyze(dir, dumps);
  REQUIRE(analysis::NotesText(report).size() == 1);
  CHECK(analysis::NotesText(report)[0].find("rank 1's evidence") != std::string::npos);
  CHECK(analysis::NotesText(report)[0].find("older than the newest dump") != std::string::npos);
}

TEST_CASE("a reused directory: the latest attempt is analyzed, another on request", "[endings]") {
  TempDir dir;
  std::vector<Document> dumps;
  // Attempt 1 (an hour ago): rank 3 never entered #5 on communicator A.
  for (int r = 0; r < 4; ++r) {
    Document d = r == 3 ? Dump(r, 4, {Comm(kWorld, 4, r, 4, 4, 4)}, {}, Name(R::PeerRequest))
                        : Dump(r, 4, {Comm(kWorld, 4, r, 5, 5, 4)}, {Op(kWorld, 5, "AllReduce", "gpu_reached", 700)},
                               Name(R::Stall));
    d.summary.start_unix_ns = d.summary.time_unix_ns - int64_t{3600} * 1000000000;
    d.summary.time_unix_ns = d.summary.start_unix_ns + 1000;
    d.summary.pid = 500 + r;
    dumps.push_back(d);
  }
  // Attempt 2 (now, same ranks, new communicator): healthy, stopped at the end.
  for (int r = 0; r < 4; ++r) {
    Document d = Dump(r, 4, {Comm(kOther, 4, r, 50, 50, 50)}, {}, Name(R::Exit));
    d.summary.start_unix_ns = d.summary.time_unix_ns - 60000000000;
    dumps.push_back(d);
  }
  auto latest = Analyze(dir, dumps);
  INFO(analysis::ReportToJson(latest).dump());
  CHECK_FALSE(latest.Hang());
  CHECK(latest.attempts.size() == 2);
  CHECK(latest.attempt == 2);
  REQUIRE_FALSE(analysis::NotesText(latest).empty());
  CHECK(analysis::NotesText(latest).back().find("2 attempts") != std::string::npos);

  TempDir again;
  analysis::LoadOptions first;
  first.attempt = 1;
  auto old = Analyze(again, dumps, first);
  REQUIRE(old.Hang());
  CHECK(old.verdicts[0].cause == Cause::RankMissing);
  CHECK(old.verdicts[0].culprit_ranks == Ranks({3}));
}

TEST_CASE("ranks sharing host and pid (separate PID namespaces) are told apart", "[endings]") {
  TempDir dir;
  std::vector<Document> dumps;
  for (int r = 0; r < 4; ++r) {
    Document d = r == 2 ? Dump(r, 4, {Comm(kWorld, 4, r, 4, 4, 4)}, {}, Name(R::PeerRequest))
                        : Dump(r, 4, {Comm(kWorld, 4, r, 5, 5, 4)}, {Op(kWorld, 5, "AllReduce", "gpu_reached", 700)},
                               Name(R::Stall));
    d.summary.host = "node1";
    d.summary.pid = 1;  // every container's first process
    d.summary.process_uid = "00000000000000f" + std::to_string(r);
    dumps.push_back(d);
  }
  auto report = Analyze(dir, dumps);
  INFO(analysis::ReportToJson(report).dump());
  CHECK(report.ranks_seen == 4);
  REQUIRE(report.verdicts.size() == 1);
  CHECK(report.verdicts[0].cause == Cause::RankMissing);
  CHECK(report.verdicts[0].culprit_ranks == Ranks({2}));
}

TEST_CASE("a culprit's current stack is the application's, never ncclwatch's own thread", "[endings]") {
  // Rank 1 is busy outside NCCL; its dump lists ncclwatch's watchdog first (marked own), then a
  // worker thread with native frames only. The main thread is not in the dump.
  TempDir dir;
  Document busy = Dump(1, 2, {Comm(kWorld, 2, 1, 5, 5, 5)}, {}, Name(R::PeerRequest));
  trace::Thread watchdog;
  watchdog.tid = 4242;
  watchdog.name = "ncclwatch";
  watchdog.own = true;
  watchdog.stack.native = {{0x1000, "/lib/libncclwatch.so", "ncclwatch::Runtime::Dump", 16, "", 0x1000}};
  trace::Thread worker;
  worker.tid = 4343;
  worker.name = "trainer";
  worker.stack.native = {{0x2000, "/opt/app/train", "save_checkpoint", 8, "", 0x2000}};
  busy.detail.threads = {watchdog, worker};
  Document waiting = Dump(0, 2, {Comm(kWorld, 2, 0, 6, 6, 5)}, {Op(kWorld, 6, "AllReduce", "gpu_reached", 650)},
                          Name(R::Stall));
  auto report = Analyze(dir, {waiting, busy});
  REQUIRE(report.verdicts.size() == 1);
  const auto& v = report.verdicts[0];
  CHECK(v.culprit_ranks == Ranks({1}));
  REQUIRE(v.evidence.size() == 1);
  CHECK(v.evidence[0].current_thread == "trainer");
  CHECK(v.evidence[0].current_tid == 4343);
  REQUIRE(v.evidence[0].current.native.size() == 1);
  CHECK(v.evidence[0].current.native[0].symbol == "save_checkpoint");
}

// A rank stopped (SIGSTOP, a debugger, a frozen cgroup) answers nothing: its host's caretaker
// writes a stand-in from its black box (reason stopped, summary.stopped), and a postmortem if it
// is then killed. Wherever it stopped (inside the collective, or before it), it is the one the
// others wait for, and it is stopped: not stuck_in_collective, rank_missing or an OOM story.
namespace {
Document StandIn(int rank, trace::CommSummary comm, std::vector<trace::Op> in_flight, const char* how = "stopped") {
  Document d = Dump(rank, 4, {comm}, std::move(in_flight), Name(R::Stopped));
  d.summary.stopped = trace::StopRecord{how, 1'700'010'000'000'000'000LL, 1'700'010'020'000'000'000LL};  // 01:00:00 UTC
  d.summary.states_as_of_mono_ns = d.summary.time_mono_ns - 100'000'000;
  d.summary.detail = "stopped (SIGSTOP or a debugger), seen by its host";
  return d;
}

std::vector<Document> OthersStallIn8(int stopped) {
  std::vector<Document> dumps;
  for (int r = 0; r < 4; ++r)
    if (r != stopped)
      dumps.push_back(Dump(r, 4, {Comm(kWorld, 4, r, 8, 8, 7)}, {Op(kWorld, 8, "AllReduce", "gpu_reached", 30)},
                           Name(r == 0 ? R::Stall : R::PeerRequest)));
  return dumps;
}
}  // namespace

TEST_CASE("a stopped rank is rank_stopped, wherever it stopped, and stays so once killed", "[endings]") {
  struct Case {
    const char* name;
    trace::CommSummary comm;
    std::vector<trace::Op> in_flight;
    const char* how;
  };
  for (const Case& c : {Case{"inside #8", Comm(kWorld, 4, 2, 8, 8, 7), {Op(kWorld, 8, "AllReduce", "gpu_reached", 31)}, "stopped"},
                        Case{"before #8", Comm(kWorld, 4, 2, 7, 7, 7), {}, "traced"},
                        Case{"its GPU behind", Comm(kWorld, 4, 2, 8, 7, 7), {Op(kWorld, 8, "AllReduce", "enqueued", 31)}, "frozen"}}) {
    for (bool killed : {false, true}) {
      INFO(c.name << (killed ? ", then killed" : ""));
      TempDir dir;
      std::vector<Document> dumps = OthersStallIn8(2);
      Document stand_in = StandIn(2, c.comm, c.in_flight, c.how);
      dumps.push_back(stand_in);
      if (killed) {  // its postmortem: the same box, the same number, the stop kept
        Document pm = stand_in;
        pm.summary.reason = trace::DumpReasonValue::Of(R::Postmortem);
        pm.summary.detail = "was stopped (SIGSTOP or a debugger), then killed while stopped (SIGKILL: its launcher's or a user's)";
        dumps.push_back(pm);
      }
      auto report = Analyze(dir, dumps);
      INFO(analysis::ReportToJson(report).dump());
      REQUIRE(report.verdicts.size() == 1);
      const auto& v = report.verdicts[0];
      CHECK(v.cause == Cause::RankStopped);
      CHECK(v.culprit_ranks == Ranks({2}));
      CHECK(v.seq == 8);
      CHECK(v.waiting_ranks == Ranks({0, 1, 3}));
      CHECK(v.culprit_stopped_killed == killed);
      REQUIRE(v.evidence.size() == 1);
      CHECK(v.evidence[0].position.state == analysis::CulpritState::Stopped);
      const std::string where = analysis::WhereText(v.evidence[0]);
      trace::StopKind how;
      REQUIRE(trace::ParseStopKind(c.how, &how));
      CHECK(where.find(trace::StopKindText(how) + " since 2023-11-15 01:00:00 UTC") != std::string::npos);
      CHECK((where.find("then killed while stopped") != std::string::npos) == killed);
      CHECK(where.find("OOM") == std::string::npos);
      const std::string text = analysis::RenderReportText(report, {});
      CHECK(text.find(killed ? "rank 2 was stopped, then killed while stopped" : "rank 2 is stopped") != std::string::npos);
      // The pid on the command line, and the advice points up at the lines printed before it.
      CHECK(text.find("kill -CONT " + std::to_string(v.evidence[0].pid) + "`") != std::string::npos);
      CHECK(text.find("<pid>") == std::string::npos);
      CHECK(text.find("are below") == std::string::npos);
      CHECK(text.find("rank 2 (") != std::string::npos);
      CHECK(text.find("its last call site are above") > text.find("rank 2 ("));
      CHECK(report.problems.empty());
    }
  }
}

TEST_CASE("a rank stopped, then continued, is not stopped: its own later dumps say what it did", "[endings]") {
  // Its stand-in carries the number of its next own dump: that dump (its exit record here)
  // comes after it, and is no duplicate. Every rank then exited: no hang.
  TempDir dir;
  std::vector<Document> dumps;
  for (int r = 0; r < 4; ++r) {
    Document exit = Dump(r, 4, {Comm(kWorld, 4, r, 20, 20, 20)}, {}, Name(R::Exit));
    exit.summary.exit_status = 0;
    exit.summary.time_unix_ns += 30'000'000'000LL;
    dumps.push_back(exit);
  }
  dumps.push_back(StandIn(2, Comm(kWorld, 4, 2, 8, 8, 7), {Op(kWorld, 8, "AllReduce", "gpu_reached", 31)}));
  auto report = Analyze(dir, dumps);
  INFO(analysis::ReportToJson(report).dump());
  REQUIRE(report.verdicts.size() == 1);
  CHECK(report.verdicts[0].cause == Cause::NoHang);
  CHECK(report.problems.empty());
}

namespace {

// Ranks 0..ended-1 ended normally after #40 (exit 0, nothing in flight); the others wait in #41,
// issued from call site `callsite` (-1: unknown), after #39 and #40 from call site 0 (the loop's).
std::vector<Document> EndedAndWaiting(int n, int ended, int64_t callsite) {
  std::vector<Document> dumps;
  for (int r = 0; r < n; ++r) {
    if (r < ended) {
      Document d = Dump(r, n, {Comm(kWorld, n, r, 40, 40, 40)}, {}, Name(R::Exit));
      d.summary.exit_status = 0;
      dumps.push_back(d);
      continue;
    }
    trace::Op op = Op(kWorld, 41, "AllReduce", "gpu_reached", 700);
    op.callsite = callsite;
    Document d = Dump(r, n, {Comm(kWorld, n, r, 41, 41, 40)}, {op}, Name(r == ended ? R::Stall : R::PeerRequest));
    d.detail.ring.capacity = 8;
    for (int64_t seq : {39, 40}) {
      trace::Op e = Op(kWorld, seq, "AllReduce", "completed");
      e.callsite = 0;
      d.detail.ring.entries.push_back(e);
    }
    d.detail.ring.entries.push_back(op);
    d.detail.ring.recorded = 3;
    d.detail.callsites = {{0, {}, "", ""}, {1, {}, "", ""}};
    dumps.push_back(d);
  }
  return dumps;
}

}  // namespace

TEST_CASE("ranks that ended normally while others wait in a call of their own: extra_call", "[endings]") {
  struct Case {
    int n, ended;
    int64_t callsite;  // of the waiting ranks' #41: 1 their own, 0 the loop's, -1 unknown
    Cause cause;
  };
  for (const Case& c : {Case{4, 3, 1, Cause::ExtraCall}, Case{4, 2, 1, Cause::ExtraCall}, Case{4, 1, 1, Cause::ExtraCall},
                        Case{4, 3, 0, Cause::RankExited}, Case{2, 1, 0, Cause::RankExited},
                        Case{4, 3, -1, Cause::ExtraCall}, Case{4, 1, -1, Cause::RankExited}}) {
    INFO(c.ended << " of " << c.n << " ended; call site " << c.callsite);
    TempDir dir;
    auto report = Analyze(dir, EndedAndWaiting(c.n, c.ended, c.callsite));
    INFO(analysis::ReportToJson(report).dump());
    REQUIRE(report.verdicts.size() == 1);
    const auto& v = report.verdicts[0];
    std::vector<int> ended, waiting;
    for (int r = 0; r < c.n; ++r) (r < c.ended ? ended : waiting).push_back(r);
    CHECK(v.cause == c.cause);
    CHECK(v.seq == 41);
    CHECK(v.culprit_ranks == (c.cause == Cause::ExtraCall ? waiting : ended));
    if (c.cause != Cause::ExtraCall) continue;
    CHECK(v.ended_ranks == ended);
    CHECK(v.ended_after_seq == 40);
    CHECK(v.waiting_ranks == waiting);
    REQUIRE(!v.evidence.empty());
    CHECK(v.evidence[0].rank == waiting.front());
    REQUIRE(v.evidence[0].callsite_op);
    CHECK(v.evidence[0].callsite_op->seq == 41);
    const std::string text = analysis::RenderReportText(report, {});
    CHECK(text.find("completed #40 and ended normally") != std::string::npos);
  }
}

namespace {

// A postmortem of a rank that ended without a word at `ms` on its host's clock, after #40.
Document Killed(int rank, int n, int64_t ms, const std::string& host,
                const char* detail = "ended without a word: SIGKILL or the OOM killer") {
  Document d = Dump(rank, n, {Comm(kWorld, n, rank, 40, 40, 40)}, {}, Name(R::Postmortem));
  d.summary.detail = detail;
  d.summary.host = host;
  d.summary.time_mono_ns = 5000000000000LL + ms * 1000000;
  d.summary.time_unix_ns = 1700000000000000000LL + ms * 1000000;
  d.summary.states_as_of_mono_ns = d.summary.time_mono_ns - 40000000;
  return d;
}

}  // namespace

TEST_CASE("every rank killed within a moment is one story: job_killed, no hang", "[endings]") {
  {
    TempDir dir;
    auto report = Analyze(dir, {Killed(0, 4, 0, "a"), Killed(1, 4, 3, "a"), Killed(2, 4, 1, "b"), Killed(3, 4, 5, "b")});
    INFO(analysis::ReportToJson(report).dump());
    REQUIRE(report.verdicts.size() == 1);
    const auto& v = report.verdicts[0];
    CHECK(v.cause == Cause::JobKilled);
    CHECK(v.killed_ranks == Ranks({0, 1, 2, 3}));
    CHECK(v.killed_within_ms == Approx(5.0));
    CHECK(v.culprit_ranks.empty());
    CHECK_FALSE(report.Hang());  // analyze's exit status 0
    const std::string text = analysis::RenderReportText(report, {});
    CHECK(text.find("1. job_killed  every rank ended within 5 ms: the job was killed from outside") != std::string::npos);
    CHECK(text.find("OOM") == std::string::npos);
  }
  // Seconds apart, or one named by the kernel's OOM killer: each its own death, as before.
  for (bool oom : {false, true}) {
    INFO((oom ? "the OOM killer named one" : "seconds apart"));
    TempDir dir;
    std::vector<Document> dumps = {Killed(0, 3, 0, "a"), Killed(1, 3, oom ? 2 : 3000, "a"),
                                   Killed(2, 3, oom ? 4 : 6000, "a", oom ? "killed by the kernel's OOM killer (Out of memory: Killed process 1002)"
                                                                        : "ended without a word: SIGKILL or the OOM killer")};
    auto report = Analyze(dir, dumps);
    INFO(analysis::ReportToJson(report).dump());
    REQUIRE(!report.verdicts.empty());
    for (const auto& v : report.verdicts) CHECK(v.cause == Cause::RankDead);
    CHECK(report.Hang());
  }
}

TEST_CASE("every rank of one host killed within a moment while others wait: host_lost", "[endings]") {
  for (bool one_left : {false, true}) {
    INFO((one_left ? "a rank of that host lives" : "the whole host"));
    TempDir dir;
    std::vector<Document> dumps = {Killed(2, 5, 0, "b"), Killed(3, 5, 2, "b")};
    for (int r : {0, 1, 4}) {
      Document d = Dump(r, 5, {Comm(kWorld, 5, r, 41, 41, 40)}, {Op(kWorld, 41, "AllReduce", "gpu_reached", 700)},
                        Name(r == 0 ? R::Stall : R::PeerRequest));
      d.summary.host = r == 4 && one_left ? "b" : "a";
      dumps.push_back(d);
    }
    auto report = Analyze(dir, dumps);
    INFO(analysis::ReportToJson(report).dump());
    REQUIRE(report.verdicts.size() == 1);
    const auto& v = report.verdicts[0];
    CHECK(v.culprit_ranks == Ranks({2, 3}));
    CHECK(v.seq == 41);
    CHECK(v.waiting_ranks == Ranks({0, 1, 4}));
    if (one_left) {
      CHECK(v.cause == Cause::RankDead);
      continue;
    }
    CHECK(v.cause == Cause::HostLost);
    CHECK(v.killed_host == "b");
    CHECK(v.killed_within_ms == Approx(2.0));
    const std::string text = analysis::RenderReportText(report, {});
    CHECK(text.find("host_lost  every rank of host b (ranks 2, 3) ended within 2 ms; others wait in AllReduce #41") !=
          std::string::npos);
  }
}

// Two hosts stall at once, each linked to the launcher's store: rank 1 (host A) and rank 2
// (host B) each dump their stall and write a request; each request reaches the other host
// seconds later, through the store. Rank 3 (host B) is busy in host code. Rank 2's latest dump
// answers host A's request, a moment before rank 0's answer to host B's own request, the newest
// round: rank 2 asked that one itself, right after its stall dump, and answered it so.
TEST_CASE("the rank that wrote the newest request answered it with the dump before it", "[endings]") {
  const int64_t t0 = 1700000000000000000LL;
  auto waiting = [&](int r, R reason, int64_t at) {
    Document d = Dump(r, 4, {Comm(kWorld, 4, r, 21, 21, 20)}, {Op(kWorld, 21, "AllReduce", "gpu_reached", 2.1)},
                      Name(reason));
    d.summary.host = r < 2 ? "hosta" : "hostb";
    d.summary.time_unix_ns = t0 + at;
    return d;
  };
  const trace::AnsweredRequest from_a{"hosta-1001-0", 1, "hosta", Name(R::Stall)};
  const trace::AnsweredRequest from_b{"hostb-1002-0", 2, "hostb", Name(R::Stall)};
  auto answer = [&](Document d, const trace::AnsweredRequest& request, int64_t at) {
    d = Then(d, R::PeerRequest);
    d.summary.answered = request;
    d.summary.time_unix_ns = t0 + at;
    return d;
  };
  const int64_t ms = 1000000;
  Document r0 = waiting(0, R::Stall, 3 * ms), r1 = waiting(1, R::Stall, 3 * ms), r2 = waiting(2, R::Stall, 0);
  Document r0a = answer(r0, from_a, 9 * ms);
  Document r3 = Dump(3, 4, {Comm(kWorld, 4, 3, 20, 20, 20)}, {}, Name(R::PeerRequest));
  r3.summary.host = "hostb";
  r3.summary.answered = from_b;
  r3.summary.time_unix_ns = t0 + 200 * ms;
  const std::vector<Document> dumps = {r0, r0a, answer(r0a, from_b, 8020 * ms), r1, answer(r1, from_b, 8200 * ms),
                                       r2, answer(r2, from_a, 8016 * ms), r3, answer(r3, from_a, 8017 * ms)};
  TempDir dir;
  auto report = Analyze(dir, dumps);
  INFO(analysis::ReportToJson(report).dump());
  REQUIRE(report.verdicts.size() == 1);
  CHECK(report.verdicts[0].cause == Cause::RankMissing);
  CHECK(report.verdicts[0].culprit_ranks == Ranks({3}));
  CHECK(report.verdicts[0].waiting_ranks == Ranks({0, 1, 2}));
}

TEST_CASE("the rank that wrote the newest request, its own dump missing, did not answer it", "[endings]") {
  // A snapshot every rank answered; seconds later rank 2 stalled, dumped and asked, and the
  // others answered. Without rank 2's stall dump (not yet copied, removed), its latest is the
  // snapshot's: from before the round, left out and said, never its verdict.
  const int64_t t0 = 1700000000000000000LL, ms = 1000000;
  const trace::AnsweredRequest snapshot{"cli-hosta-900-1", trace::kUnknownRank, "hosta", "on_demand"};
  const trace::AnsweredRequest from_2{"hosta-1002-0", 2, "hosta", Name(R::Stall)};
  std::vector<Document> dumps;
  for (int r = 0; r < 4; ++r) {
    Document d = Dump(r, 4, {Comm(kWorld, 4, r, 100, 100, 100)}, {}, Name(R::PeerRequest));
    d.summary.answered = snapshot;
    d.summary.time_unix_ns = t0 + r * ms;
    if (r != 1) {
      dumps.push_back(d);
      if (r == 2) continue;
      // Ranks 0 and 3 wait in #601, which rank 1 never called.
      d = Then(d, R::PeerRequest);
      d.summary.comms = {Comm(kWorld, 4, r, 601, 600, 600)};
      d.summary.in_flight = {Op(kWorld, 601, "AllReduce", "gpu_reached", 3.0)};
    } else {
      dumps.push_back(d);
      d = Then(d, R::PeerRequest);
      d.summary.comms = {Comm(kWorld, 4, r, 600, 600, 600)};
    }
    d.summary.answered = from_2;
    d.summary.time_unix_ns = t0 + 4000 * ms + r * ms;
    dumps.push_back(d);
  }
  TempDir dir;
  auto report = Analyze(dir, dumps);
  INFO(analysis::ReportToJson(report).dump());
  REQUIRE(report.unanswered.size() == 1);
  CHECK(report.unanswered[0].rank == 2);
  REQUIRE(!report.verdicts.empty());
  for (const auto& v : report.verdicts) CHECK(v.seq > 100);  // nothing from the snapshot's moment
}
