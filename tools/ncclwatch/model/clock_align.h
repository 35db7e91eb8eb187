// One clock for every rank's times. Times in dumps are each host's monotonic clock, which
// starts anywhere: they are comparable within a host only. Members of a communicator finish the
// same collective at nearly the same moment, so the difference between two hosts' completion
// times of shared collectives, over many of them, is the difference between their clocks
// (the median: robust to the watchdog's poll granularity and to a slow collective). Hosts
// sharing too few collectives with any aligned host fall back to the wall clock.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/dump_set.h"

namespace ncclwatch {
namespace analysis {

// One collective as one rank recorded it (host monotonic clock, ns; 0 unknown).
struct CollectiveTimes {
  uint64_t comm_key = 0;  // hash of the communicator id
  int64_t seq = 0;
  int64_t enqueue_ns = 0;
  int64_t completed_ns = 0;
  int32_t callsite = -1;
};

// What alignment and slow-rank detection need of one rank, read once from its full dump.
struct RankTimes {
  size_t dump_index = 0;  // in DumpSet::dumps()
  int rank = -1;
  std::string host;
  int64_t unix_minus_mono_ns = 0;  // summary.time_unix_ns - summary.time_mono_ns
  int64_t earliest_ns = 0;         // the earliest enqueue in its ring (0: empty ring)
  std::vector<CollectiveTimes> collectives;  // from the ring, oldest first
};

// Reads every selected dump's ring (one at a time: at most one full dump in memory).
std::vector<RankTimes> CollectRankTimes(DumpSet& set);

struct HostClock {
  int64_t offset_ns = 0;  // add to this host's monotonic times to get the reference clock
  int64_t spread_ns = 0;  // p90 - p10 of the per-collective differences (0 for the reference)
  size_t samples = 0;     // shared collectives the offset was estimated from
  std::string method;     // "reference", "collectives" or "wall_clock"
  std::string via;        // the host it was aligned against
};

struct ClockAlignment {
  std::string reference_host;  // the lowest rank's host
  std::map<std::string, HostClock> hosts;
  // `mono_ns` of `host` on the reference clock.
  int64_t Align(const std::string& host, int64_t mono_ns) const {
    auto it = hosts.find(host);
    return mono_ns + (it == hosts.end() ? 0 : it->second.offset_ns);
  }
};

// Shared collectives a host needs with an aligned one to be aligned from them.
constexpr size_t kMinClockSamples = 8;

ClockAlignment AlignClocks(const std::vector<RankTimes>& ranks);

}  // namespace analysis
}  // namespace ncclwatch
