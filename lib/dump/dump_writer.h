// Turns the library's state at dump time into the trace format's records and writes them with
// the format's one writer (lib/format/trace_writer.h). Pure: everything it writes is in
// DumpInput, so tests can build one.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/process_info.h"
#include "dump/dump_files.h"
#include "format/records.h"
#include "format/trace_writer.h"
#include "record/comm_registry.h"
#include "record/flight_ring.h"
#include "record/op_record.h"
#include "record/thread_registry.h"
#include "watchdog/watchdog.h"

namespace ncclwatch {

struct DumpInput {
  trace::DumpReason reason = trace::DumpReason::OnDemand;
  std::string detail;
  std::optional<trace::DumpRequest> answered;
  ProcessIdentity identity;
  int global_rank = -1;
  int world_size = -1;
  int nccl_version = 0;
  int cuda_driver_version = 0;
  uint64_t dump_seq = 0;
  uint64_t time_unix_ns = 0, time_mono_ns = 0, start_mono_ns = 0;
  const Config* config = nullptr;
  std::vector<const CommInfo*> comms;
  // Communicators being created (ncclCommInitRank* not returned): summary.comms, `initializing`.
  struct Initializing {
    uint64_t id = 0;
    int size = 0, rank = -1;
  };
  std::vector<Initializing> initializing;
  std::vector<ThreadRegistry::InCall> in_nccl;
  std::vector<InflightView> inflight;
  std::optional<InflightView> stalled;
  std::optional<OpSnapshot> failed;  // reason nccl_error: the call that returned the error
  int exit_status = -1;              // reason exit / exit_in_flight
  int error_result = 0;              // reasons nccl_error, async_error: the ncclResult_t
  int64_t states_as_of_mono_ns = -1;  // postmortem: when op states were last mirrored (trace::Summary)
  std::optional<trace::UncaughtException> exception;  // reason exit: the Python exception it ended with
  std::optional<trace::StopRecord> stopped;  // reasons stopped, postmortem: its host saw it stopped
  std::vector<Recovery> recoveries;
  // Full detail (absent from light dumps).
  bool light = false;
  std::vector<std::pair<std::string, std::string>> environment;
  std::string exe, cwd;
  std::vector<std::string> cmdline;
  uint64_t ring_capacity = 0, ring_recorded = 0, ring_overwritten = 0;
  // The ring's entries: read from `live_ring` one at a time (indexes [ring_from, ring_to);
  // entries overwritten meanwhile are skipped), so a dump never copies a big ring; else `ring`.
  const FlightRing* live_ring = nullptr;
  uint64_t ring_from = 0, ring_to = 0;
  std::vector<OpSnapshot> ring;
  std::vector<trace::Callsite> callsites;
  std::vector<trace::Thread> threads;
};

// Streams the dump to `sink` in pieces (trace::WriteDocument): memory stays about one piece
// whatever the ring's size. False if the sink failed.
bool StreamDump(const DumpInput& in, const trace::TextSink& sink);
std::string SerializeDump(const DumpInput& in);
// The dump's file name without its suffix (format/file_name.h).
std::string DumpFileStem(const DumpInput& in);

// Record conversions (also used by tests).
trace::Op OpRecordOf(const OpSnapshot& o);
trace::Op InflightRecordOf(const InflightView& v);

}  // namespace ncclwatch
