// Evidence about one culprit: where it is (as data) and its stacks, read from its full dump.
#pragma once

#include "model/dump_set.h"
#include "model/wait_graph.h"
#include "report/report.h"

namespace ncclwatch {
namespace analysis {

class Evidence {
 public:
  Evidence(const WaitGraph& graph, DumpSet& set) : g_(graph), set_(set) {}
  // Fills everything but rank and comm_rank (the caller's); `blocked` is the verdict's blocked
  // operation (null: none), `dump` the culprit's (-1: it left none).
  void Fill(const BlockedOp* blocked, int dump, CulpritEvidence* e);
  // Where the culprit of `dump` is; on the communicator of `blocked` too when `blocked` is a collective.
  CulpritPosition PositionOf(const BlockedOp* blocked, int dump) const;

 private:
  const WaitGraph& g_;
  DumpSet& set_;
};

}  // namespace analysis
}  // namespace ncclwatch
