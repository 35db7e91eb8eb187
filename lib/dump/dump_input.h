// Assembling a dump's input (dump_writer.h's DumpInput) from the running library: the
// registries, the watchdog's view of the operations in flight, and the stacks captured and
// symbolized now. The runtime says when and why a dump is written; this says what it holds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/timing.h"
#include "dump/dump_writer.h"
#include "watchdog/watchdog.h"

namespace ncclwatch {

// What only some dumps carry.
struct DumpExtra {
  bool light = false;                // summary and recoveries only
  bool exit_record = false;          // the exiting thread's stack and the ring's tail only
  int exit_status = -1;
  int error_result = 0;  // the ncclResult_t of an nccl_error / async_error dump
  std::optional<OpSnapshot> failed;  // the call that returned an NCCL error
  int32_t exiting_site = -1;         // exit record: the exiting thread's stack, when captured by that thread
  int32_t exiting_tid = 0;
  std::optional<trace::UncaughtException> exception;  // exit record: the Python exception it ended with
};

// The parts of the running library a dump reads.
struct DumpSources {
  const Config* config = nullptr;
  const ProcessIdentity* identity = nullptr;
  uint64_t start_mono_ns = 0;
  int nccl_version = 0, cuda_driver_version = 0;
  CommRegistry* comms = nullptr;
  ThreadRegistry* threads = nullptr;
  FlightRing* ring = nullptr;
  Watchdog* watchdog = nullptr;
};

// Everything a dump says but its rank, world size, sequence number and time (the runtime's).
// Captures stacks (signals to the threads a report shows) unless `extra` asks for a light dump
// or an exit record.
DumpInput AssembleDumpInput(const DumpSources& src, trace::DumpReason reason, const std::string& detail,
                            const std::optional<trace::DumpRequest>& answered, const std::optional<InflightView>& stalled,
                            const DumpExtra& extra);

// Return addresses, symbolized (a call site's frames).
std::vector<trace::NativeFrame> Symbolized(const std::vector<uintptr_t>& ips);

}  // namespace ncclwatch
