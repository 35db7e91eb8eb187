// Slow ranks: on the aligned clock (clock_align.h), a rank that reaches most collectives of a
// communicator last, by a clear margin, slows every member down (a straggler: a slower GPU, a
// busy host, an unbalanced data loader). Measured at host enqueue, over the collectives every
// member's ring holds. A finding, never a hang cause.
#pragma once

#include <vector>

#include "model/clock_align.h"
#include "report/report.h"

namespace ncclwatch {
namespace analysis {

// Thresholds: named only with enough shared history, last most of the time, and late by more
// than both a fixed floor and the clocks' uncertainty (jitter alone names nobody).
constexpr size_t kSlowRankMinCollectives = 10;
constexpr double kSlowRankMinLastShare = 0.6;
constexpr double kSlowRankMinLatenessMs = 5.0;
// Ranks up to which analyze looks for slow ranks by default (each needs its full dump read).
constexpr size_t kSlowRanksDefaultMaxRanks = 64;

// Reads the culprit's full dump again for its call-site stack.
std::vector<Finding> FindSlowRanks(DumpSet& set, const std::vector<RankTimes>& times, const ClockAlignment& clocks);

}  // namespace analysis
}  // namespace ncclwatch
