// Stalls that recovered: an operation past its deadline that completed later is no hang, but
// the report tells what held it up, from the dumps of that moment (the stall and the answers
// to its request), as the hang's verdict would have told it.
#pragma once

#include <vector>

#include "model/dump_set.h"
#include "report/report.h"

namespace ncclwatch {
namespace analysis {

// Stalled collectives analyzed in full (each reads its culprit's dump); the rest are counted.
constexpr size_t kMaxRecoveredStallsExplained = 8;

// One entry per stalled (communicator, sequence number), oldest first.
std::vector<RecoveredStall> FindRecoveredStalls(DumpSet& set, size_t* more);

}  // namespace analysis
}  // namespace ncclwatch
