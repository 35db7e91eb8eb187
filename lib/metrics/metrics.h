// NCCLWATCH_METRICS=DIR: a Prometheus text-format file per process, rewritten every few seconds
// (atomically) for node-exporter's textfile collector. Written from the watchdog thread; off by
// default, and when off nothing here exists.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "record/comm_registry.h"
#include "record/flight_ring.h"
#include "watchdog/watchdog.h"

namespace ncclwatch {

// What one sample reads from the library's state.
struct MetricsInput {
  int rank = -1;
  std::vector<const CommInfo*> comms;
  const FlightRing* ring = nullptr;
  std::vector<InflightView> inflight;
  uint64_t stalls = 0;
  uint64_t dumps = 0;
  int nccl_version = 0;
};

class MetricsWriter {
 public:
  // `file`: the file's path; written through `file`.tmp-<pid> and a rename.
  explicit MetricsWriter(std::string file) : file_(std::move(file)) {}

  // Counts the ring's new operations (since the last call); cheap, every poll.
  void Count(const FlightRing& ring);
  // Whether Tend would write the file now.
  bool Due(uint64_t now_mono_ns) const { return now_mono_ns >= next_write_ns_; }
  // The text of one sample (also for tests), and writing it.
  std::string Render(const MetricsInput& in, uint64_t now_mono_ns, uint64_t now_unix_ns);
  bool Write(const MetricsInput& in, uint64_t now_mono_ns, uint64_t now_unix_ns);
  // The same into storage the writer keeps: once it has held a sample as large, a sample
  // allocates nothing (the watchdog's steady path).
  void RenderInto(const MetricsInput& in, uint64_t now_mono_ns, uint64_t now_unix_ns, std::string* out);
  // At a normal exit: the file goes (a dead process must not look alive to the collector).
  void Remove();
  // A watchdog-thread duty (TickSchedule): counts every tick, writes a sample (read from
  // `input`) every kMetricsInterval; a file that cannot be written is said once, then retried.
  // `fill` fills the input it is given (its vectors cleared, their storage kept).
  uint64_t Tend(uint64_t now_mono_ns, const FlightRing& ring, const std::function<void(MetricsInput*)>& fill);

  const std::string& file() const { return file_; }

 private:
  struct Totals {
    uint64_t ops = 0, bytes = 0;
  };
  std::string file_;
  uint64_t next_write_ns_ = 0;
  bool write_failure_said_ = false;
  uint64_t next_index_ = 0;                                   // ring index not yet counted
  // A communicator as one rank holds it: (id, this process's rank in it). A process that drives
  // several ranks (several devices) holds one id as several ranks, each a series of its own.
  using CommKey = std::pair<uint64_t, int32_t>;
  std::map<std::pair<CommKey, trace::OpKind>, Totals> totals_;  // (comm, op)
  std::map<CommKey, std::pair<uint64_t, uint64_t>> last_completion_;  // comm -> (seq, mono ns seen)
  // Kept across samples (Tend, watchdog thread): the input, the text, the temporary file's
  // path, and the in-flight counts by (comm, op) and the oldest by comm.
  MetricsInput input_;
  std::string text_, tmp_path_;
  std::vector<std::pair<std::pair<CommKey, trace::OpKind>, int>> inflight_;
  std::vector<std::pair<CommKey, const InflightView*>> oldest_;
  // Of a process that drives several ranks: each device's global rank (its rank in the largest
  // communicator on that device), the `rank` label of that device's series.
  std::vector<std::pair<int, int>> device_ranks_;
  bool several_ranks_ = false;
  int RankLabel(const MetricsInput& in, CommKey comm) const;
};

// "ncclwatch-<host>-<pid>.prom": the rank is a label (it may be learnt after start).
std::string MetricsFileName(const std::string& host, int pid);

}  // namespace ncclwatch
