// The wait-for graph alone (wait_graph.h), on hand-built dump sets: which operation each
// communicator is blocked at, who blocks it, and where each wait ends. The rules that name
// causes read only this.
#include <catch2/catch.hpp>

#include "model/wait_graph.h"
#include "format/dump_reader.h"
#include "fixtures.h"

using namespace ncclwatch;
using namespace ncclwatch::testing;
using analysis::BlockKind;
using analysis::Terminal;
using R = trace::DumpReason;

namespace {

const std::string kWorld = "00000000000000b1";
const std::string kTp = "00000000000000b2";

// Loads the documents as the analyzer would (through the writer and the reader).
analysis::DumpSet SetOf(const std::vector<Document>& docs) {
  std::vector<analysis::Dump> dumps;
  for (const auto& d : docs) {
    analysis::Dump dump;
    REQUIRE(trace::ReadDumpBuffer(Text(d), trace::ReadDepth::kSummary, &dump).usable);
    dumps.push_back(std::move(dump));
  }
  analysis::DumpSet set;
  set.LoadFromDumps(std::move(dumps));
  return set;
}

const analysis::Blocker* BlockerOf(const analysis::BlockedOp& blocked, int global) {
  for (const auto& b : blocked.blockers)
    if (b.global == global) return &b;
  return nullptr;
}

}  // namespace

TEST_CASE("wait graph: each kind of member that keeps a collective open", "[wait_graph]") {
  // World of 5 blocked at #9: rank 0 is inside (waiting), rank 1 never issued it and is busy,
  // rank 2's GPU has not reached it, rank 3 exited, rank 4's call failed.
  std::vector<Document> docs;
  docs.push_back(Dump(0, 5, {Comm(kWorld, 5, 0, 9, 9, 8)}, {Op(kWorld, 9, "AllReduce", "gpu_reached")}, "stall"));
  docs.push_back(Dump(1, 5, {Comm(kWorld, 5, 1, 8, 8, 8)}));
  docs.push_back(Dump(2, 5, {Comm(kWorld, 5, 2, 9, 8, 8)}, {Op(kWorld, 9, "AllReduce", "enqueued")}));
  docs.push_back(Dump(3, 5, {Comm(kWorld, 5, 3, 8, 8, 8)}, {}, trace::DumpReasonName(R::Exit)));
  Document err = Dump(4, 5, {Comm(kWorld, 5, 4, 9, 8, 8)}, {}, trace::DumpReasonName(R::NcclError));
  err.summary.failed = Op(kWorld, 9, "AllReduce", "error");
  docs.push_back(err);
  analysis::DumpSet set = SetOf(docs);
  analysis::WaitGraph g(set);
  REQUIRE(g.blocked_ops().size() == 1);
  const analysis::BlockedOp& blocked = g.blocked_ops()[0];
  CHECK(blocked.seq == 9);
  CHECK(blocked.waiting == std::vector<int>{0});
  REQUIRE(blocked.blockers.size() == 4);
  CHECK(BlockerOf(blocked, 1)->kind == BlockKind::kHostMissing);
  CHECK(BlockerOf(blocked, 1)->terminal == Terminal::kBusy);
  CHECK(BlockerOf(blocked, 2)->kind == BlockKind::kGpuLag);
  CHECK(BlockerOf(blocked, 2)->terminal == Terminal::kGpuStuck);
  CHECK(BlockerOf(blocked, 3)->terminal == Terminal::kExited);
  CHECK(BlockerOf(blocked, 4)->terminal == Terminal::kError);
}

TEST_CASE("wait graph: a rank held by another blocked operation points at it", "[wait_graph]") {
  // Rank 2 waits in its TP all-gather #4 for rank 3 (busy); ranks 0-1 wait for rank 2 in the
  // world all-reduce #6.
  std::vector<Document> docs;
  for (int r : {0, 1})
    docs.push_back(Dump(r, 4, {Comm(kWorld, 4, r, 6, 6, 5)}, {Op(kWorld, 6, "AllReduce", "gpu_reached")}, "stall"));
  docs.push_back(Dump(2, 4, {Comm(kWorld, 4, 2, 5, 5, 5), Comm(kTp, 2, 0, 4, 4, 3)},
                      {Op(kTp, 4, "AllGather", "gpu_reached")}));
  docs.push_back(Dump(3, 4, {Comm(kWorld, 4, 3, 5, 5, 5), Comm(kTp, 2, 1, 3, 3, 3)}));
  analysis::DumpSet set = SetOf(docs);
  analysis::WaitGraph g(set);
  REQUIRE(g.blocked_ops().size() == 2);
  int world = g.comms()[g.CommOf(kWorld)].blocked_op, tp = g.comms()[g.CommOf(kTp)].blocked_op;
  const analysis::Blocker* two = BlockerOf(g.blocked_ops()[world], 2);
  REQUIRE(two);
  CHECK(two->terminal == Terminal::kNone);
  CHECK(two->target == tp);
  CHECK(BlockerOf(g.blocked_ops()[tp], 3)->terminal == Terminal::kBusy);
  CHECK_FALSE(g.Cyclic(world));
}

TEST_CASE("wait graph: a communicator still being created waits for the members never joined", "[wait_graph]") {
  std::vector<Document> docs;
  for (int r : {0, 2}) {
    trace::CommSummary c = Comm(kWorld, 3, r, 0, 0, 0);
    c.state = trace::CommStateName(trace::CommState::Initializing);
    docs.push_back(Dump(r, 3, {c}, {}, "stall"));
  }
  analysis::DumpSet set = SetOf(docs);
  analysis::WaitGraph g(set);
  REQUIRE(g.blocked_ops().size() == 1);
  CHECK(g.blocked_ops()[0].init);
  CHECK(g.blocked_ops()[0].waiting == std::vector<int>{0, 2});
  REQUIRE(g.blocked_ops()[0].blockers.size() == 1);
  CHECK(g.blocked_ops()[0].blockers[0].global == 1);
}
