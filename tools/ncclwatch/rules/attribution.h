// Cross-rank attribution: from one dump per rank to verdicts naming the culprit ranks, the
// operation and the code behind a hang. Rules: docs/analysis.md "Attribution rules".
#pragma once

#include <cstddef>

#include "model/dump_set.h"
#include "report/report.h"

namespace ncclwatch {
namespace analysis {

struct AttributionOptions {
  // Culprits per verdict whose full dump is read for stacks (the rest are named only), so
  // that a verdict blaming thousands of ranks stays fast and small.
  size_t max_evidence = 8;
  // Slow ranks (slow_ranks.h), a finding below the verdicts: -1 when the set has at most
  // kSlowRanksDefaultMaxRanks ranks (each full dump is read), 1 always, 0 never.
  int slow_ranks = -1;
  // Stalls that recovered, below the verdicts (recovered_stalls.h): each is analyzed as of
  // its moment.
  bool recovered_stalls = true;
};

// Reads full details (via set.Detail) only for culprits and one waiting rank per verdict.
Report Attribute(DumpSet& set, const AttributionOptions& options = {});

}  // namespace analysis
}  // namespace ncclwatch
