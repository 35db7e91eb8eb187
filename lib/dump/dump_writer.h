// Serializes one dump in the documented format (include/ncclwatch/trace_format.h,
// docs/trace-format.md). Pure: everything it writes is in DumpInput, so tests can build one.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/process_info.h"
#include "dump/dump_files.h"
#include "record/comm_registry.h"
#include "record/op_record.h"
#include "record/thread_registry.h"
#include "watchdog/watchdog.h"

namespace ncclwatch {

struct FrameOut {
  uint64_t ip = 0;
  std::string module, symbol;
  uint64_t offset = 0;
};
struct PyFrameOut {
  std::string file, function;
  int line = 0;
  bool library = false;
};
struct CallsiteOut {
  int32_t id = -1;
  std::vector<FrameOut> frames;
  std::vector<PyFrameOut> python;
  std::string note;  // why Python frames are missing (the GIL could not be had)
};
struct ThreadOut {
  int tid = 0;
  std::string name, note;
  std::vector<FrameOut> frames;
  std::vector<PyFrameOut> python;
};

struct DumpInput {
  trace::DumpReason reason = trace::DumpReason::OnDemand;
  std::string detail;
  std::optional<PeerRequest> trigger;
  ProcessIdentity identity;
  int global_rank = -1;
  int world_size = -1;
  int nccl_version = 0;
  int cuda_driver_version = 0;
  uint64_t dump_seq = 0;
  uint64_t time_unix_ns = 0, time_mono_ns = 0, start_mono_ns = 0;
  const Config* config = nullptr;
  std::vector<const CommInfo*> comms;
  std::vector<ThreadRegistry::InCall> in_nccl;
  std::vector<InflightView> inflight;
  std::optional<InflightView> stalled;
  std::vector<Recovery> recoveries;
  // Full detail (absent from light dumps).
  bool light = false;
  std::vector<std::pair<std::string, std::string>> environment;
  std::string exe, cwd;
  std::vector<std::string> cmdline;
  uint64_t ring_capacity = 0, ring_recorded = 0, ring_overwritten = 0;
  std::vector<OpSnapshot> ring;
  std::vector<CallsiteOut> callsites;
  std::vector<ThreadOut> threads;
};

std::string SerializeDump(const DumpInput& in);
// "rank00003-host-1234-0-stall"
std::string DumpFileStem(int global_rank, const std::string& host, int pid, uint64_t dump_seq,
                         trace::DumpReason reason);

}  // namespace ncclwatch
