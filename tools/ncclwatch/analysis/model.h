// In-memory model of one ncclwatch dump (docs/trace-format.md), as the analyzer needs it.
// Every field a real dump may omit has a documented "absent" value, so readers never fail on
// a missing optional key.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ncclwatch/trace_format.h"

namespace ncclwatch {
namespace analysis {

constexpr int kUnknownRank = -1;
// Values beyond these are corrupt input: the reader treats them as absent, so that arithmetic
// on ranks and sequence numbers (rank + 1, seq + 1) cannot overflow.
constexpr int kMaxRank = 1 << 24;
constexpr int64_t kMaxSeq = int64_t{1} << 60;

// OpState plus "not written / not understood".
struct OpStateValue {
  bool known = false;
  trace::OpState value = trace::OpState::Count;
  bool Is(trace::OpState s) const { return known && value == s; }
};

struct OpRecord {
  std::string comm;
  int64_t seq = 0;
  int64_t p2p_seq = 0;
  bool op_known = false;
  trace::OpKind op = trace::OpKind::Count;
  std::string op_name;  // as written, for display when the kind is unknown
  int64_t count = -1;
  std::string dtype;
  int64_t bytes = -1;
  std::string redop;  // empty: no reduction (null)
  int root = -1;
  int peer = -1;
  std::string stream;
  int64_t group = 0;
  int64_t tid = 0;
  int64_t enqueue_ns = 0;
  int64_t gpu_reached_ns = 0;
  int64_t completed_ns = 0;
  OpStateValue state;
  int64_t result = 0;
  int64_t callsite = -1;
  double gpu_ms = -1;      // < 0: absent (only with NCCLWATCH_GPU_TIMING=1)
  double age_s = -1;       // < 0: absent
  double deadline_s = -1;  // < 0: absent

  bool IsP2p() const { return op_known && trace::IsPointToPoint(op); }
  const char* OpName() const { return op_known ? trace::OpKindName(op) : op_name.c_str(); }
};

struct P2pCounters {
  int peer = -1;
  int64_t send_enqueued = 0;
  int64_t send_completed = 0;
  int64_t recv_enqueued = 0;
  int64_t recv_completed = 0;
};

struct CommSummary {
  std::string id;
  int size = 0;
  int rank = kUnknownRank;  // this process's rank in the communicator
  std::string name;
  std::string state;
  int64_t last_enqueued = 0;
  int64_t last_gpu_reached = 0;
  int64_t last_completed = 0;
  std::vector<P2pCounters> p2p;

  const P2pCounters* P2pWith(int peer) const {
    for (const auto& c : p2p)
      if (c.peer == peer) return &c;
    return nullptr;
  }
};

struct InNcclThread {
  int64_t tid = 0;
  std::string function;
  double since_s = -1;
};

// For reason peer_request: the rank whose dump request this dump answers.
struct DumpTrigger {
  std::string request;
  int origin_rank = kUnknownRank;
  std::string origin_host;
  std::string reason;
};

struct DumpSummary {
  int rank = kUnknownRank;
  int local_rank = kUnknownRank;
  int world_size = -1;
  std::string host;
  int64_t pid = 0;
  int64_t dump_seq = 0;
  std::string reason;
  std::string detail;
  std::optional<DumpTrigger> trigger;
  int64_t time_unix_ns = 0;
  int64_t time_mono_ns = 0;
  int64_t start_mono_ns = 0;
  int64_t nccl_version = 0;
  std::vector<InNcclThread> in_nccl;
  std::vector<CommSummary> comms;
  std::vector<OpRecord> in_flight;
  std::optional<OpRecord> stalled;
  int64_t ring_overwritten = 0;

  const CommSummary* Comm(const std::string& id) const {
    for (const auto& c : comms)
      if (c.id == id) return &c;
    return nullptr;
  }
};

struct NativeFrame {
  std::string ip;
  std::string module;
  std::string symbol;
  int64_t offset = 0;
};

struct PythonFrame {
  std::string file;
  int64_t line = 0;
  std::string function;
  bool library = false;
};

struct Stack {
  std::vector<NativeFrame> native;  // innermost first
  std::vector<PythonFrame> python;  // innermost first
  bool Empty() const { return native.empty() && python.empty(); }
};

struct Callsite {
  int64_t id = -1;
  Stack stack;
};

struct ThreadStack {
  int64_t tid = 0;
  std::string name;
  Stack stack;
  std::string note;
};

struct CommunicatorInfo {
  std::string id;
  int size = 0;
  int rank = kUnknownRank;
  int64_t device = -1;
  std::string name;
  std::string kind;
  std::string parent;
  int64_t color = 0;
  int64_t key = 0;
  std::string state;
};

struct RingInfo {
  int64_t capacity = 0;
  int64_t recorded = 0;
  int64_t overwritten = 0;
  std::vector<OpRecord> entries;  // oldest first
};

struct Recovery {
  std::string comm;
  int64_t seq = 0;
  std::string op;
  double stalled_after_s = 0;
  double recovered_after_s = 0;
};

// Everything after `summary`; read only for the ranks that need it (show, culprits).
struct DumpDetail {
  std::string exe;
  std::vector<std::string> cmdline;
  std::map<std::string, std::string> env;
  std::vector<CommunicatorInfo> communicators;
  RingInfo ring;
  std::vector<Callsite> callsites;
  std::vector<ThreadStack> threads;
  std::vector<Recovery> recoveries;

  const Callsite* FindCallsite(int64_t index) const {
    if (index >= 0 && static_cast<size_t>(index) < callsites.size() && callsites[index].id == index)
      return &callsites[index];
    for (const auto& c : callsites)
      if (c.id == index) return &c;
    return nullptr;
  }
  const ThreadStack* FindThread(int64_t tid) const {
    for (const auto& t : threads)
      if (t.tid == tid) return &t;
    return nullptr;
  }
};

struct Dump {
  std::string path;
  std::string file_name;
  int version = 0;
  DumpSummary summary;
  std::shared_ptr<const DumpDetail> detail;  // null until read in full
  std::string detail_problem;                // why the detail is partial or missing
};

}  // namespace analysis
}  // namespace ncclwatch
