// Attribution rules on small hand-made dump sets (docs/analysis.md "Attribution rules").
#include <fstream>
#include <iterator>
#include <set>

#include <catch2/catch.hpp>

#include "render/render_report.h"
#include "fixtures.h"

using namespace ncclwatch;
using namespace ncclwatch::testing;
using analysis::Cause;
namespace key = trace::key;

namespace {

const std::string kWorld = "000000000000000a";
const std::string kSub = "000000000000000b";

std::vector<int> Ranks(std::initializer_list<int> r) { return r; }

}  // namespace

TEST_CASE("a rank not inside NCCL is named as missing, with where it is", "[attribution]") {
  TempDir dir;
  std::vector<Document> dumps;
  dumps.push_back(Dump(0, 3, {Comm(kWorld, 3, 0, 7, 7, 7)}));  // busy elsewhere
  for (int r = 1; r < 3; ++r)
    dumps.push_back(Dump(r, 3, {Comm(kWorld, 3, r, 8, 8, 7)}, {Op(kWorld, 8, "AllReduce", "gpu_reached", 30 + r)}));
  auto report = Analyze(dir, dumps);
  REQUIRE(report.verdicts.size() == 1);
  const auto& v = report.verdicts[0];
  CHECK(v.cause == Cause::RankMissing);
  CHECK(v.comm == kWorld);
  CHECK(v.seq == 8);
  CHECK(v.op == "AllReduce");
  CHECK(v.culprit_ranks == Ranks({0}));
  CHECK(v.waiting_ranks == Ranks({1, 2}));
  CHECK(v.waited_s == Approx(32));
  REQUIRE(v.evidence.size() == 1);
  CHECK(analysis::WhereText(v.evidence[0]).find("not inside NCCL") != std::string::npos);
}

TEST_CASE("mismatch ties name the group without the lowest rank", "[attribution]") {
  TempDir dir;
  Document a = Dump(0, 2, {Comm(kWorld, 2, 0, 5, 5, 4)}, {Op(kWorld, 5, "AllReduce", "gpu_reached")});
  Document b = Dump(1, 2, {Comm(kWorld, 2, 1, 5, 5, 4)}, {Op(kWorld, 5, "Broadcast", "gpu_reached")});
  auto report = Analyze(dir, {a, b});
  REQUIRE(report.verdicts.size() == 1);
  const auto& v = report.verdicts[0];
  CHECK(v.cause == Cause::Mismatch);
  CHECK(v.tie);
  CHECK(v.culprit_ranks == Ranks({1}));
  CHECK_FALSE(v.call_count_divergence);
  REQUIRE(v.groups.size() == 2);
  CHECK(v.groups[0].op == "AllReduce");
}

TEST_CASE("every independent mismatch is reported, not only the first", "[attribution]") {
  TempDir dir;
  std::vector<Document> dumps;
  // Two sub-communicators of two ranks each; both disagree on the dtype at their seq 3.
  const std::string g0 = "00000000000000c0", g1 = "00000000000000c1";
  for (int r = 0; r < 4; ++r) {
    const std::string& g = r < 2 ? g0 : g1;
    trace::Op op = Op(g, 3, "AllGather", "gpu_reached");
    if (r % 2) op.dtype = "bfloat16";
    dumps.push_back(Dump(r, 4, {Comm(g, 2, r % 2, 3, 3, 2)}, {op}));
  }
  auto report = Analyze(dir, dumps);
  INFO(analysis::ReportToJson(report).dump());
  REQUIRE(report.verdicts.size() == 2);
  std::set<std::string> comms;
  for (const auto& v : report.verdicts) {
    CHECK(v.cause == Cause::Mismatch);
    comms.insert(v.comm);
  }
  CHECK(comms == std::set<std::string>{g0, g1});
}

TEST_CASE("an unmatched send names the peer that never posted its receive", "[attribution]") {
  TempDir dir;
  Document sender = Dump(0, 2, {Comm(kWorld, 2, 0, 2, 2, 2)}, {P2pOp(kWorld, "Send", 1, 1, "gpu_reached")});
  sender.summary.comms[0].p2p = {{1, 1, 0, 0, 0}};  // peer 1: one send enqueued
  Document idle = Dump(1, 2, {Comm(kWorld, 2, 1, 2, 2, 2)});
  auto report = Analyze(dir, {sender, idle});
  REQUIRE(report.verdicts.size() == 1);
  const auto& v = report.verdicts[0];
  CHECK(v.cause == Cause::P2pUnmatched);
  CHECK(v.culprit_ranks == Ranks({1}));
  CHECK(v.waiting_ranks == Ranks({0}));
  CHECK(v.cycle.empty());
  CHECK(v.p2p_src == 0);
  CHECK(v.p2p_dst == 1);
}

TEST_CASE("sends queued before receives on both GPUs are out of order", "[attribution]") {
  TempDir dir;
  std::vector<Document> dumps;
  for (int r = 0; r < 2; ++r) {
    int peer = 1 - r;
    Document d = Dump(r, 2, {Comm(kWorld, 2, r, 0, 0, 0)},
                  {P2pOp(kWorld, "Send", peer, 1, "gpu_reached"), P2pOp(kWorld, "Recv", peer, 1, "enqueued")});
    d.summary.comms[0].p2p = {{peer, 1, 0, 1, 0}};  // one send and one recv enqueued
    dumps.push_back(d);
  }
  auto report = Analyze(dir, dumps);
  REQUIRE(report.verdicts.size() == 1);
  const auto& v = report.verdicts[0];
  // Each issued the receive the other's send waits for, queued behind its own send (issue 45).
  CHECK(v.cause == Cause::P2pOutOfOrder);
  CHECK(v.cycle.size() == 3);
  CHECK(v.cycle.front() == v.cycle.back());
  CHECK(v.culprit_ranks == Ranks({0, 1}));
}

TEST_CASE("a send and its receive of different sizes are a p2p_mismatch naming both sides", "[attribution]") {
  TempDir dir;
  trace::Op send = P2pOp(kWorld, "Send", 1, 13, "gpu_reached");
  send.count = 512;
  send.bytes = 2048;
  Document a = Dump(0, 2, {Comm(kWorld, 2, 0, 0, 0, 0)}, {send});
  a.summary.comms[0].p2p = {{1, 13, 12, 0, 0}};
  Document b = Dump(1, 2, {Comm(kWorld, 2, 1, 0, 0, 0)}, {P2pOp(kWorld, "Recv", 0, 13, "gpu_reached")});
  b.summary.comms[0].p2p = {{0, 0, 0, 13, 12}};
  auto report = Analyze(dir, {a, b});
  REQUIRE(report.verdicts.size() == 1);
  const auto& v = report.verdicts[0];
  CHECK(v.cause == Cause::P2pMismatch);
  CHECK(v.culprit_ranks == Ranks({0, 1}));
  CHECK(v.p2p_mismatch == "size");
  REQUIRE(v.p2p_calls.size() == 2);
  CHECK(v.p2p_calls[0].count == 512);
  CHECK(v.p2p_calls[1].count == 1024);
  const std::string text = analysis::RenderReportText(report, {});
  CHECK(text.find("rank 0's Send #13 to rank 1 carries 2 KiB (512 float32); rank 1's Recv #13 from rank 0 expects "
                  "4 KiB (1024 float32)") != std::string::npos);
  CHECK(text.find("transport") == std::string::npos);
}

TEST_CASE("a transfer whose completed side left no record says its pairing is unknown", "[attribution]") {
  TempDir dir;
  // Rank 1's send completed and its ring no longer holds it: the sizes cannot be compared.
  Document a = Dump(0, 2, {Comm(kWorld, 2, 0, 0, 0, 0)}, {P2pOp(kWorld, "Recv", 1, 7, "gpu_reached")});
  a.summary.comms[0].p2p = {{1, 0, 0, 7, 6}};
  Document b = Dump(1, 2, {Comm(kWorld, 2, 1, 0, 0, 0)});
  b.summary.comms[0].p2p = {{0, 7, 7, 0, 0}};
  auto report = Analyze(dir, {a, b});
  REQUIRE(report.verdicts.size() == 1);
  const auto& v = report.verdicts[0];
  CHECK(v.cause == Cause::StuckInCollective);
  CHECK(v.p2p_mismatch == "unknown");
  const std::string text = analysis::RenderReportText(report, {});
  CHECK(text.find("rank 1: Send #7 to rank 0: no record of it is left") != std::string::npos);
  CHECK(text.find("whether their sizes and datatypes agree is unknown") != std::string::npos);
}

TEST_CASE("a missing member whose global rank cannot be inferred is a comm rank", "[attribution]") {
  TempDir dir;
  // Sub-communicator of 2: global rank 5 is comm rank 0; comm rank 1 left no dump and there
  // is no second known member to infer a stride from.
  std::vector<Document> dumps;
  for (int r = 0; r < 8; ++r) {
    std::vector<trace::CommSummary> comms = {Comm(kWorld, 8, r, 4, 4, 4)};
    std::vector<trace::Op> ops;
    if (r == 5) {
      comms.push_back(Comm(kSub, 2, 0, 2, 2, 1));
      ops.push_back(Op(kSub, 2, "AllReduce", "gpu_reached"));
    }
    if (r != 3) dumps.push_back(Dump(r, 8, comms, ops));
  }
  auto report = Analyze(dir, dumps);
  REQUIRE(report.verdicts.size() == 1);
  const auto& v = report.verdicts[0];
  CHECK(v.cause == Cause::RankDead);
  CHECK(v.comm == kSub);
  CHECK(v.culprit_ranks.empty());
  CHECK(v.culprit_comm_ranks == Ranks({1}));
  CHECK(analysis::AdviceText(v, report).find("comm rank 1 (global rank unknown)") != std::string::npos);
  CHECK(report.ranks_without_dump == Ranks({3}));
}

TEST_CASE("a crash dump is a dead rank even before anyone waits for it", "[attribution]") {
  TempDir dir;
  auto report = Analyze(dir, {Dump(0, 2, {Comm(kWorld, 2, 0, 3, 3, 3)}, {}, "on_demand"),
                              Dump(1, 2, {Comm(kWorld, 2, 1, 3, 3, 3)}, {}, "fatal_signal")});
  REQUIRE(report.verdicts.size() == 1);
  CHECK(report.verdicts[0].cause == Cause::RankDead);
  CHECK(report.verdicts[0].culprit_ranks == Ranks({1}));
  CHECK(report.verdicts[0].comm.empty());
}

TEST_CASE("a GPU queued behind a blocked operation waits on it, not on itself", "[attribution]") {
  TempDir dir;
  // Rank 1 is busy; rank 0 waits in the world all-reduce. Rank 0's next op on the sub-comm is
  // queued behind it on the same stream, so rank 2 waiting there is a consequence.
  Document r0 = Dump(0, 3, {Comm(kWorld, 3, 0, 5, 5, 4), Comm(kSub, 2, 0, 2, 1, 1)},
                 {Op(kWorld, 5, "AllReduce", "gpu_reached"), Op(kSub, 2, "AllGather", "enqueued")});
  Document r1 = Dump(1, 3, {Comm(kWorld, 3, 1, 4, 4, 4)});
  Document r2 = Dump(2, 3, {Comm(kWorld, 3, 2, 5, 5, 4), Comm(kSub, 2, 1, 2, 2, 1)},
                 {Op(kWorld, 5, "AllReduce", "gpu_reached"), Op(kSub, 2, "AllGather", "gpu_reached")});
  auto report = Analyze(dir, {r0, r1, r2});
  REQUIRE(report.verdicts.size() == 1);
  const auto& v = report.verdicts[0];
  CHECK(v.cause == Cause::RankMissing);
  CHECK(v.culprit_ranks == Ranks({1}));
  REQUIRE(v.consequences.size() == 1);
  CHECK(v.consequences[0].comm == kSub);
  CHECK(v.consequences[0].waiting_ranks == Ranks({2}));
}

TEST_CASE("every member inside the collective blames the transport and shows NCCL settings", "[attribution]") {
  TempDir dir;
  std::vector<Document> dumps;
  for (int r = 0; r < 2; ++r) {
    Document d = Dump(r, 2, {Comm(kWorld, 2, r, 9, 9, 8)}, {Op(kWorld, 9, "AllReduce", "gpu_reached")});
    d.detail.process.env = {{"NCCL_IB_TIMEOUT", "22"}, {"RANK", std::to_string(r)}};
    dumps.push_back(d);
  }
  auto report = Analyze(dir, dumps);
  REQUIRE(report.verdicts.size() == 1);
  const auto& v = report.verdicts[0];
  CHECK(v.cause == Cause::StuckInCollective);
  CHECK(v.culprit_ranks.empty());
  CHECK(v.nccl_env == std::map<std::string, std::string>{{"NCCL_IB_TIMEOUT", "22"}});
}

TEST_CASE("a rank whose GPU never finished what its peers completed is the GPU culprit", "[attribution]") {
  TempDir dir;
  // Ranks 0 and 2 completed seq 5 and wait in 6; rank 1 did its part of 5 (the others could
  // complete it) but its GPU never finished it, so its host never issued 6.
  std::vector<Document> dumps;
  for (int r : {0, 2})
    dumps.push_back(Dump(r, 3, {Comm(kWorld, 3, r, 6, 6, 5)}, {Op(kWorld, 6, "AllReduce", "gpu_reached", 40)}));
  dumps.push_back(Dump(1, 3, {Comm(kWorld, 3, 1, 5, 5, 4)}, {Op(kWorld, 5, "AllReduce", "gpu_reached", 41)}));
  auto report = Analyze(dir, dumps);
  REQUIRE(report.verdicts.size() == 1);
  const auto& v = report.verdicts[0];
  CHECK(v.cause == Cause::GpuNotReached);
  CHECK(v.seq == 6);
  CHECK(v.culprit_ranks == Ranks({1}));
  CHECK(v.waiting_ranks == Ranks({0, 2}));
  REQUIRE(v.evidence.size() == 1);
  CHECK(analysis::WhereText(v.evidence[0]).find("has not finished #5") != std::string::npos);
}

TEST_CASE("a root that finished its broadcast early does not hide the blocked broadcast", "[attribution]") {
  TempDir dir;
  // The root completed seq 4 (its data went out); the three receivers sit inside it.
  std::vector<Document> dumps = {Dump(0, 4, {Comm(kWorld, 4, 0, 4, 4, 4)})};
  for (int r = 1; r < 4; ++r) {
    trace::Op op = Op(kWorld, 4, "Broadcast", "gpu_reached");
    op.root = 0;
    dumps.push_back(Dump(r, 4, {Comm(kWorld, 4, r, 4, 4, 3)}, {op}));
  }
  auto report = Analyze(dir, dumps);
  REQUIRE(report.verdicts.size() == 1);
  CHECK(report.verdicts[0].cause == Cause::StuckInCollective);
  CHECK(report.verdicts[0].seq == 4);
  CHECK(report.verdicts[0].waiting_ranks == Ranks({1, 2, 3}));
}

// Adding a cause is one row (rules/causes.h, checked at compile time), its sentences and its
// docs: each cause has advice of its own and a place in docs/analysis.md.
TEST_CASE("attribution: every cause has its advice and its docs", "[attribution]") {
  std::ifstream in(DOCS_DIR "/analysis.md");
  REQUIRE(in);
  std::string docs((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  analysis::Report report;
  std::set<std::string> advice;
  for (size_t i = 0; i < static_cast<size_t>(Cause::Count); ++i) {
    analysis::Verdict v;
    v.cause = static_cast<Cause>(i);
    v.culprit_ranks = {3};
    v.op = "AllReduce";
    v.seq = 7;
    const std::string name = analysis::CauseName(v.cause);
    INFO(name);
    CHECK(docs.find("`" + name + "`") != std::string::npos);
    const std::string text = analysis::AdviceText(v, report);
    CHECK_FALSE(text.empty());
    advice.insert(text);
  }
  CHECK(advice.size() == static_cast<size_t>(Cause::Count));  // no cause borrows another's words
}

namespace {
template <typename E, typename NameFn, typename ParseFn>
void CheckNamesParseBack(NameFn name, ParseFn parse) {
  for (size_t i = 0; i < static_cast<size_t>(E::Count); ++i) {
    E v = E::Count;
    INFO(name(static_cast<E>(i)));
    REQUIRE(parse(name(static_cast<E>(i)), &v));
    CHECK(static_cast<size_t>(v) == i);
  }
  E v = E::Count;
  CHECK_FALSE(parse("no such name", &v));
}
}  // namespace

TEST_CASE("report vocabulary: every name parses back to its value", "[attribution]") {
  CheckNamesParseBack<Cause>(analysis::CauseName, analysis::ParseCause);
  CheckNamesParseBack<analysis::CulpritState>(analysis::CulpritStateName, analysis::ParseCulpritState);
  CheckNamesParseBack<analysis::CommPosition>(analysis::CommPositionName, analysis::ParseCommPosition);
}

TEST_CASE("an init hang with every member inside blames the bootstrap, not a blank rank list", "[attribution]") {
  analysis::Verdict v;
  v.cause = Cause::InitHang;
  v.op = "ncclCommInitRank";
  const std::string advice = analysis::AdviceText(v, analysis::Report());
  CHECK(advice.rfind("Every member is inside ncclCommInitRank", 0) == 0);
  CHECK(advice.find("ranks  ") == std::string::npos);
}

TEST_CASE("the culprit's stack is the thread that issued its collectives, then main and the others", "[attribution]") {
  // Rank 0 issues its collectives from a worker thread (a side thread, a thread pool, autograd's
  // threads); its main thread only waits for that worker. The worker is in save_checkpoint.
  TempDir dir;
  std::vector<Document> dumps;
  Document busy = Dump(0, 3, {Comm(kWorld, 3, 0, 7, 7, 7)});
  const int64_t pid = busy.summary.pid, worker = pid + 5, idle = pid + 6, own = pid + 7;
  trace::Op last = Op(kWorld, 7, "AllReduce", "completed");
  last.tid = worker;
  busy.detail.ring.entries.push_back(last);
  auto thread = [](int64_t tid, const char* name, std::vector<trace::PythonFrame> py, bool is_own = false) {
    trace::Thread t;
    t.tid = tid;
    t.name = name;
    t.stack.python = std::move(py);
    t.own = is_own;
    return t;
  };
  busy.detail.threads.push_back(thread(pid, "python", {{"/usr/lib/python3.11/concurrent/futures/_base.py", 451, "result", true},
                                                       {"train.py", 90, "main", false}}));
  busy.detail.threads.push_back(thread(own, "ncclwatch", {}, true));
  busy.detail.threads.push_back(thread(idle, "pool-1", {{"/usr/lib/python3.11/queue.py", 171, "get", true}}));
  busy.detail.threads.push_back(thread(worker, "pool-0", {{"ckpt.py", 12, "save_checkpoint", false},
                                                          {"train.py", 60, "train_step", false}}));
  dumps.push_back(busy);
  for (int r = 1; r < 3; ++r)
    dumps.push_back(Dump(r, 3, {Comm(kWorld, 3, r, 8, 8, 7)}, {Op(kWorld, 8, "AllReduce", "gpu_reached", 30)}));
  auto report = Analyze(dir, dumps);
  REQUIRE(report.verdicts.size() == 1);
  REQUIRE(report.verdicts[0].evidence.size() == 1);
  const auto& e = report.verdicts[0].evidence[0];
  CHECK(e.current_tid == worker);
  CHECK(e.current_role == analysis::ThreadRole::IssuedLastCall);
  REQUIRE_FALSE(e.current.python.empty());
  CHECK(e.current.python[0].function == "save_checkpoint");
  REQUIRE(e.other_threads.size() == 2);  // never ncclwatch's own thread
  CHECK(e.other_threads[0].tid == pid);
  CHECK(e.other_threads[0].role == analysis::ThreadRole::Main);
  CHECK_FALSE(e.other_threads[0].idle);
  CHECK(e.other_threads[1].tid == idle);
  CHECK(e.other_threads[1].idle);

  std::string text = analysis::RenderReportText(report, {});
  INFO(text);
  CHECK(text.find("now, pool-0 (tid " + std::to_string(worker) + "), which issued AllReduce #7") != std::string::npos);
  CHECK(text.find("python (tid " + std::to_string(pid) + "), the main thread:") != std::string::npos);
  CHECK(text.find("1 idle thread: pool-1") != std::string::npos);
  CHECK(text.find("ncclwatch (tid") == std::string::npos);
  auto j = analysis::ReportToJson(report);
  const auto& threads = j["verdicts"][0]["culprit_stacks"]["0"]["threads"];
  REQUIRE(threads.size() == 3);
  CHECK(threads[0]["role"] == "issued_last_call");
  CHECK(threads[1]["role"] == "main");
  CHECK(threads[2]["idle"] == true);
}

namespace {
// A rank blocked inside ncclCommInitRank for 30 s on communicator `id` (a setup hang's dump).
Document InitHangDump(int rank, const std::string& id) {
  trace::CommSummary c = Comm(id, 4, rank, 0, 0, 0);
  c.state = trace::CommStateName(trace::CommState::Initializing);
  Document d = Dump(rank, 4, {c}, {}, "stall");
  d.summary.in_nccl.push_back({d.summary.pid, "ncclCommInitRank", 30});
  return d;
}
}  // namespace

TEST_CASE("ranks that created same-size communicators with different ids get one verdict saying so", "[attribution]") {
  // Ranks 2 and 3 read a stale unique-id file: two communicators of 4 ranks are being created,
  // each with half its members inside and waiting for the other half, which is inside the other.
  // Not two init_hang verdicts that blame each half for never joining.
  const std::string kStale = "00000000000000ee";
  for (int split : {2, 1}) {  // 2+2, and 1+3 (one rank read the stale file)
    SECTION("first " + std::to_string(split) + " ranks on the fresh id") {
      TempDir dir;
      std::vector<Document> dumps;
      for (int r = 0; r < 4; ++r) dumps.push_back(InitHangDump(r, r < split ? kWorld : kStale));
      auto report = Analyze(dir, dumps);
      INFO(analysis::ReportToJson(report).dump(1));
      REQUIRE(report.verdicts.size() == 1);
      const auto& v = report.verdicts[0];
      CHECK(v.cause == Cause::InitHang);
      REQUIRE(v.id_groups.size() == 2);
      std::vector<int> fresh, stale;
      for (int r = 0; r < 4; ++r) (r < split ? fresh : stale).push_back(r);
      CHECK(v.id_groups[0].comm == kWorld);
      CHECK(v.id_groups[0].ranks == fresh);
      CHECK(v.id_groups[1].comm == kStale);
      CHECK(v.id_groups[1].ranks == stale);
      CHECK(v.culprit_ranks == stale);
      const std::string advice = analysis::AdviceText(v, report);
      CHECK(advice.find("different ids") != std::string::npos);
      CHECK(advice.find("never called") == std::string::npos);
      const std::string text = analysis::RenderReportText(report, {});
      CHECK(text.find("never joined") == std::string::npos);
    }
  }
}

TEST_CASE("an init hang where the missing ranks are elsewhere stays an ordinary init_hang", "[attribution]") {
  // Rank 3 never started: the two creations of size 4 do not explain each other.
  TempDir dir;
  std::vector<Document> dumps;
  for (int r = 0; r < 3; ++r) dumps.push_back(InitHangDump(r, kWorld));
  auto report = Analyze(dir, dumps);
  REQUIRE(report.verdicts.size() == 1);
  CHECK(report.verdicts[0].cause == Cause::InitHang);
  CHECK(report.verdicts[0].id_groups.empty());
  CHECK(report.verdicts[0].culprit_ranks == Ranks({3}));
}

TEST_CASE("a driven call site whose Python frames were never named prints no name of its own", "[attribution]") {
  // A native thread's call site, driven from the main thread, whose Python frames were read but
  // not named (the interpreter was gone when the rank wrote its record): never "? (:0)" or
  // "during `` at :0"; a named frame among them is still the line shown.
  for (bool one_named : {false, true}) {
    TempDir dir;
    std::vector<Document> dumps;
    Document busy = Dump(0, 2, {Comm(kWorld, 2, 0, 7, 7, 7)});
    trace::Op last = Op(kWorld, 7, "AllReduce", "completed");
    last.tid = busy.summary.pid + 3;
    last.callsite = 0;
    busy.detail.ring.entries.push_back(last);
    trace::Callsite site;
    site.id = 0;
    site.python_driven_from = "main thread";
    site.stack.python = {trace::PythonFrame{}, trace::PythonFrame{}};
    if (one_named) site.stack.python[1] = {"train.py", 31, "train_step", false};
    busy.detail.callsites.push_back(site);
    dumps.push_back(busy);
    dumps.push_back(Dump(1, 2, {Comm(kWorld, 2, 1, 8, 8, 7)}, {Op(kWorld, 8, "AllReduce", "gpu_reached", 30)}));
    auto report = Analyze(dir, dumps);
    const std::string text = analysis::RenderReportText(report, {});
    INFO(text);
    CHECK(text.find("? (:0)") == std::string::npos);
    CHECK(text.find("during ``") == std::string::npos);
    CHECK(text.find(" at :0") == std::string::npos);
    if (one_named) {
      CHECK(text.find("during `train_step` at train.py:31, driven from the main thread") != std::string::npos);
    } else {
      CHECK(text.find("driven from the main thread (its Python line was not named") != std::string::npos);
      CHECK(text.find("(a Python frame not named: its code was gone when it was read)") != std::string::npos);
    }
  }
}
