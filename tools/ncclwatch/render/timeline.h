// `ncclwatch timeline`: every rank's flight record on one aligned clock, in the Chrome
// trace-event JSON format (https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU)
// that Perfetto (ui.perfetto.dev) and chrome://tracing open: one process per rank, one track
// per communicator and stream, a slice per operation from host enqueue (or, when the host ran
// ahead, the end of the operation before it on its stream) to completion, GPU-reached marks,
// dump/stall/recovery instants; clock offsets in `otherData`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "model/clock_align.h"
#include "model/dump_set.h"

namespace ncclwatch {
namespace analysis {

struct TimelineStats {
  size_t ranks = 0;
  size_t events = 0;
};

// Writes the trace in pieces to `write` (a rank at a time: one full dump in memory). `times`
// and `clocks` come from CollectRankTimes / AlignClocks over the same set.
TimelineStats WriteTimeline(DumpSet& set, const std::vector<RankTimes>& times, const ClockAlignment& clocks,
                            const std::function<void(const std::string&)>& write);

}  // namespace analysis
}  // namespace ncclwatch
