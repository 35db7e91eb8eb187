// Typed records of one ncclwatch dump (docs/trace-format.md), shared by every writer (the
// library, the test generator, the test builders) and every reader (the analyzer). Every field a
// dump may omit has a documented "absent" value, so readers never fail on a missing key.
// Vocabulary fields that a reader may meet with an unknown value (a newer writer) keep the text.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ncclwatch/trace_format.h"

namespace ncclwatch {
namespace trace {

constexpr int kUnknownRank = -1;
// Values beyond these are corrupt input: the reader treats them as absent, so that arithmetic
// on ranks and sequence numbers (rank + 1, seq + 1) cannot overflow.
constexpr int kMaxRank = 1 << 24;
constexpr int64_t kMaxSeq = int64_t{1} << 60;

// Equality over the fields each record lists in Tie() (round-trip tests compare records).
#define NCCLWATCH_RECORD_EQUALITY(Type)                                             \
  friend bool operator==(const Type& a, const Type& b) { return a.Tie() == b.Tie(); } \
  friend bool operator!=(const Type& a, const Type& b) { return !(a == b); }

// OpState plus "not written / not understood".
struct OpStateValue {
  bool known = false;
  OpState value = OpState::Count;
  bool Is(OpState s) const { return known && value == s; }
  static OpStateValue Of(OpState s) { return {true, s}; }
  auto Tie() const { return std::tie(known, value); }
  NCCLWATCH_RECORD_EQUALITY(OpStateValue)
};

// One operation: a ring entry, an in-flight operation (with age_s/deadline_s), the stalled one.
struct Op {
  std::string comm;  // 16 hex digits
  int64_t seq = 0;
  int64_t p2p_seq = 0;
  bool op_known = false;
  OpKind op = OpKind::Count;
  std::string op_name;  // as written, when the kind is unknown
  int64_t count = -1;
  std::string dtype;
  int64_t bytes = -1;
  std::string redop;  // empty: no reduction (null)
  int root = -1;
  int peer = -1;
  std::string stream;  // "0x..."
  int64_t group = 0;
  int64_t tid = 0;
  int64_t enqueue_ns = 0;
  int64_t gpu_reached_ns = 0;
  int64_t completed_ns = 0;
  OpStateValue state;
  int64_t result = 0;
  int64_t callsite = -1;
  double gpu_ms = -1;      // < 0: absent (only with NCCLWATCH_GPU_TIMING=1)
  double age_s = -1;       // < 0: absent (in_flight and stalled only)
  double deadline_s = -1;  // < 0: absent

  void SetKind(OpKind k) {
    op_known = true;
    op = k;
    op_name.clear();
  }
  bool IsP2p() const { return op_known && IsPointToPoint(op); }
  const char* OpName() const { return op_known ? OpKindName(op) : op_name.c_str(); }
  auto Tie() const {
    return std::tie(comm, seq, p2p_seq, op_known, op, op_name, count, dtype, bytes, redop, root, peer, stream,
                    group, tid, enqueue_ns, gpu_reached_ns, completed_ns, state, result, callsite, gpu_ms,
                    age_s, deadline_s);
  }
  NCCLWATCH_RECORD_EQUALITY(Op)
};

struct P2pCounters {
  int peer = -1;
  int64_t send_enqueued = 0;
  int64_t send_completed = 0;
  int64_t recv_enqueued = 0;
  int64_t recv_completed = 0;
  auto Tie() const { return std::tie(peer, send_enqueued, send_completed, recv_enqueued, recv_completed); }
  NCCLWATCH_RECORD_EQUALITY(P2pCounters)
};

// summary.comms[]: a communicator's sequence state.
struct CommSummary {
  std::string id;
  int size = 0;
  int rank = kUnknownRank;  // this process's rank in the communicator
  std::string name;
  std::string state;  // CommStateName(); kept as text
  int64_t last_enqueued = 0;
  int64_t last_gpu_reached = 0;
  int64_t last_completed = 0;
  std::vector<P2pCounters> p2p;

  const P2pCounters* P2pWith(int peer) const {
    for (const auto& c : p2p)
      if (c.peer == peer) return &c;
    return nullptr;
  }
  auto Tie() const {
    return std::tie(id, size, rank, name, state, last_enqueued, last_gpu_reached, last_completed, p2p);
  }
  NCCLWATCH_RECORD_EQUALITY(CommSummary)
};

struct InNcclThread {
  int64_t tid = 0;
  std::string function;
  double since_s = -1;
  auto Tie() const { return std::tie(tid, function, since_s); }
  NCCLWATCH_RECORD_EQUALITY(InNcclThread)
};

// For reason peer_request: the dump request (DumpRequest, format/request.h) this dump answers,
// as the dump keeps it; the request file's job instance and time only decide whether to answer.
struct AnsweredRequest {
  std::string request;
  int origin_rank = kUnknownRank;
  std::string origin_host;
  std::string reason;
  auto Tie() const { return std::tie(request, origin_rank, origin_host, reason); }
  NCCLWATCH_RECORD_EQUALITY(AnsweredRequest)
};

// The uncaught Python exception a process ended with (reason exit): the interpreter's own last
// exception, read at its exit.
struct UncaughtException {
  std::string type;      // qualified class name ("ValueError", "mypkg.DataError")
  std::string message;   // str() of it, cut to 512 bytes
  std::string file;      // innermost frame of its traceback: where it was raised
  int64_t line = 0;
  std::string function;
  auto Tie() const { return std::tie(type, message, file, line, function); }
  NCCLWATCH_RECORD_EQUALITY(UncaughtException)
};

// A process its host saw stopped (reasons stopped and postmortem): how, since when.
struct StopRecord {
  std::string how;               // StopKindName(); kept as text
  int64_t seen_unix_ns = 0;      // when the host first saw it stopped (this time)
  int64_t last_seen_unix_ns = 0;  // when it last saw it still stopped
  auto Tie() const { return std::tie(how, seen_unix_ns, last_seen_unix_ns); }
  NCCLWATCH_RECORD_EQUALITY(StopRecord)
};

struct Summary {
  int rank = kUnknownRank;
  int local_rank = kUnknownRank;
  int world_size = -1;
  std::string host;
  int64_t pid = 0;
  int64_t dump_seq = 0;
  std::string reason;  // DumpReasonName(); kept as text
  std::string detail;
  std::optional<AnsweredRequest> answered;  // key::kTrigger ("trigger")
  int64_t time_unix_ns = 0;
  int64_t time_mono_ns = 0;
  int64_t start_mono_ns = 0;
  int64_t nccl_version = 0;
  std::vector<InNcclThread> in_nccl;
  std::vector<CommSummary> comms;
  std::vector<Op> in_flight;
  std::optional<Op> stalled;
  int64_t ring_overwritten = 0;
  // Identity of this process in the job: unique even where host and pid are not (containers
  // with their own PID namespaces); empty in dumps that predate it.
  std::string process_uid;
  // The launcher's id of this attempt of the job (restarts and requeues differ), "" unknown.
  std::string job_instance;
  int64_t start_unix_ns = 0;  // wall clock when ncclwatch started in this process
  int64_t exit_status = -1;   // reason exit: the status passed to exit(); -1 unknown
  std::optional<Op> failed;   // reason nccl_error: the call that returned the error
  // Reasons nccl_error, async_error: the ncclResult_t reported, whichever call it came from
  // (a group end, a communicator's creation or split have no `failed` operation); 0 absent.
  int64_t error_result = 0;
  // Postmortem dumps (version 3): when its watchdog last mirrored op states into its black box
  // (0: never); the dump's time is its last sign of life. Ops issued after it are `unknown`,
  // and the communicators' gpu_reached / completed counts are as of then. -1: absent (a dump
  // written by the process itself, whose states are as of its time).
  int64_t states_as_of_mono_ns = -1;
  // Reason exit: the uncaught Python exception the process ended with, if any.
  std::optional<UncaughtException> exception;
  // Reasons stopped and postmortem: its host saw it stopped, and it never ran again after.
  std::optional<StopRecord> stopped;

  const CommSummary* Comm(const std::string& id) const {
    for (const auto& c : comms)
      if (c.id == id) return &c;
    return nullptr;
  }
  auto Tie() const {
    return std::tie(rank, local_rank, world_size, host, pid, dump_seq, reason, detail, answered, time_unix_ns,
                    time_mono_ns, start_mono_ns, nccl_version, in_nccl, comms, in_flight, stalled,
                    ring_overwritten, process_uid, job_instance, start_unix_ns, exit_status, failed,
                    error_result, states_as_of_mono_ns, exception, stopped);
  }
  NCCLWATCH_RECORD_EQUALITY(Summary)
};

// One native frame, from capture (lib/stacks) to report: the only frame type there is.
struct NativeFrame {
  uint64_t ip = 0;
  std::string module;  // path of the object file, empty when unknown
  std::string symbol;  // demangled; empty when unknown
  uint64_t offset = 0;  // ip - symbol start when `symbol` is set, else ip - module load base
  std::string build_id;  // the module's NT_GNU_BUILD_ID as hex, empty when unknown
  // ip - the module's load bias: the address in the module's own ELF address space, what
  // `addr2line -e MODULE` takes (less 1 for a return address); 0 when the module is unknown.
  uint64_t module_offset = 0;
  // `ip` is the instruction a signal interrupted (a fault's own instruction), not a return
  // address: it is symbolized as it is, without the - 1 that a return address takes.
  bool interrupted = false;
  auto Tie() const { return std::tie(ip, module, symbol, offset, build_id, module_offset, interrupted); }
  NCCLWATCH_RECORD_EQUALITY(NativeFrame)
};

struct PythonFrame {
  std::string file;
  int64_t line = 0;
  std::string function;
  bool library = false;  // site-packages, the standard library, torch, deepspeed, megatron
  auto Tie() const { return std::tie(file, line, function, library); }
  NCCLWATCH_RECORD_EQUALITY(PythonFrame)
};

struct Stack {
  std::vector<NativeFrame> native;  // innermost first
  std::vector<PythonFrame> python;  // innermost first
  bool Empty() const { return native.empty() && python.empty(); }
  auto Tie() const { return std::tie(native, python); }
  NCCLWATCH_RECORD_EQUALITY(Stack)
};

struct Callsite {
  int64_t id = -1;
  Stack stack;
  std::string note;  // why Python frames are missing
  // Set when the issuing thread ran no Python and stack.python is the Python stack of the
  // thread driving it ("main thread"), read when the call was made.
  std::string python_driven_from;
  auto Tie() const { return std::tie(id, stack, note, python_driven_from); }
  NCCLWATCH_RECORD_EQUALITY(Callsite)
};

struct Thread {
  int64_t tid = 0;
  std::string name;
  Stack stack;
  std::string note;
  bool own = false;  // one of ncclwatch's own threads (its watchdog, its GIL helper), not the application's
  auto Tie() const { return std::tie(tid, name, stack, note, own); }
  NCCLWATCH_RECORD_EQUALITY(Thread)
};

// communicators[]: identity and life cycle.
struct Communicator {
  std::string id;
  int size = 0;
  int rank = kUnknownRank;
  std::string name;
  std::string state;  // CommStateName()
  int64_t device = -1;
  std::string kind;    // CommKindName()
  std::string parent;  // empty: none (null)
  int64_t color = -1;  // -1: not a split
  int64_t key = -1;
  bool blocking = true;
  int64_t created_mono_ns = 0;
  int64_t ended_mono_ns = 0;
  auto Tie() const {
    return std::tie(id, size, rank, name, state, device, kind, parent, color, key, blocking, created_mono_ns,
                    ended_mono_ns);
  }
  NCCLWATCH_RECORD_EQUALITY(Communicator)
};

struct Ring {
  int64_t capacity = 0;
  int64_t recorded = 0;
  int64_t overwritten = 0;
  std::vector<Op> entries;  // oldest first
  auto Tie() const { return std::tie(capacity, recorded, overwritten, entries); }
  NCCLWATCH_RECORD_EQUALITY(Ring)
};

struct Recovery {
  std::string comm;
  int64_t seq = 0;
  std::string op;
  double stalled_after_s = 0;
  double recovered_after_s = 0;
  auto Tie() const { return std::tie(comm, seq, op, stalled_after_s, recovered_after_s); }
  NCCLWATCH_RECORD_EQUALITY(Recovery)
};

using KeyValues = std::vector<std::pair<std::string, std::string>>;

struct Process {
  std::string exe;
  std::vector<std::string> cmdline;
  std::string cwd;
  KeyValues env;  // in the order written
  int64_t cuda_driver_version = 0;
  std::string ncclwatch_version;
  KeyValues config;  // NCCLWATCH_* settings in effect

  const std::string* Env(const std::string& name) const {
    for (const auto& kv : env)
      if (kv.first == name) return &kv.second;
    return nullptr;
  }
  auto Tie() const { return std::tie(exe, cmdline, cwd, env, cuda_driver_version, ncclwatch_version, config); }
  NCCLWATCH_RECORD_EQUALITY(Process)
};

// Everything after `summary`. A light dump (a recovery) has recoveries only.
struct Detail {
  bool light = false;
  Process process;
  std::vector<Communicator> communicators;
  Ring ring;
  std::vector<Callsite> callsites;
  std::vector<Thread> threads;
  std::vector<Recovery> recoveries;

  const Callsite* FindCallsite(int64_t index) const {
    if (index >= 0 && static_cast<size_t>(index) < callsites.size() && callsites[index].id == index)
      return &callsites[index];
    for (const auto& c : callsites)
      if (c.id == index) return &c;
    return nullptr;
  }
  const Thread* FindThread(int64_t tid) const {
    for (const auto& t : threads)
      if (t.tid == tid) return &t;
    return nullptr;
  }
  // A light dump writes and reads recoveries only.
  auto Tie() const {
    return light ? std::make_tuple(light, Process{}, std::vector<Communicator>{}, Ring{}, std::vector<Callsite>{},
                                   std::vector<Thread>{}, recoveries)
                 : std::make_tuple(light, process, communicators, ring, callsites, threads, recoveries);
  }
  NCCLWATCH_RECORD_EQUALITY(Detail)
};

// A whole dump as written.
struct Document {
  Summary summary;
  Detail detail;
  auto Tie() const { return std::tie(summary, detail); }
  NCCLWATCH_RECORD_EQUALITY(Document)
};

// A dump as read: the summary always, the detail when asked for and readable.
struct LoadedDump {
  int version = 0;
  Summary summary;
  std::shared_ptr<const Detail> detail;  // null until read in full
  std::string detail_problem;            // why the detail is partial or missing
};

}  // namespace trace
}  // namespace ncclwatch
