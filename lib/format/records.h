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

#include "format/boxed.h"
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

// Field lists: each record of the summary, and the plain ones of the detail, is one list
// X(type, member, default, key, how) in the order the dump writes it. The list makes the
// members and Tie() (NCCLWATCH_RECORD_FIELDS), the writer (trace_writer.cpp) and the reader
// (dump_reader.cpp). `key` names a constant of trace::key (records share keys: rank, tid,
// state); `default` is the member's initial value and what the reader gives when the key is
// absent or unreadable; `how` says how the value is written and read:
//   Text          a string                    TextOrNull    a string, null when empty
//   Int           an integer                  Int32         an int
//   Rank          a rank or size in [0, kMaxRank), else `default`
//   Seq           a sequence number or counter, clamped to [0, kMaxSeq]
//   Real          a number                    Flag          a boolean
//   RealIfSet     a number, left out when < 0 (absent)
//   IntIfSet      an integer, left out when < 0 (absent)
//   IntIfNonZero  an integer, left out when 0 (absent)
//   Object        a listed record (std::optional), null when absent
//   ObjectIfSet   a listed record (std::optional), left out when absent
//   Objects       an array of listed records (std::vector)
//   Texts         an array of strings         KeyValues     an object of strings, in order
//   OpKind        Op's kind: its name; a name this reader does not know is kept in op_name
//   OpState       Op's state: its name ("unknown" when not known)
//   Reason        Summary's reason: its name; one this reader does not know is kept
//   Part          a member without a key of its own, written and read with the field of `key`
#define NCCLWATCH_FIELD_MEMBER(type, member, def, key, how) type member = def;
#define NCCLWATCH_FIELD_TIE(type, member, def, key, how) std::tie(member),
// The members of a record, in list order, its Tie() and its equality.
#define NCCLWATCH_RECORD_FIELDS(Type, LIST)                                                   \
  LIST(NCCLWATCH_FIELD_MEMBER)                                                                \
  auto Tie() const { return std::tuple_cat(LIST(NCCLWATCH_FIELD_TIE) std::tuple<>()); } \
  NCCLWATCH_RECORD_EQUALITY(Type)

// OpState plus "not written / not understood".
struct OpStateValue {
  bool known = false;
  OpState value = OpState::Count;
  bool Is(OpState s) const { return known && value == s; }
  static OpStateValue Of(OpState s) { return {true, s}; }
  auto Tie() const { return std::tie(known, value); }
  NCCLWATCH_RECORD_EQUALITY(OpStateValue)
};

// DumpReason as read: a reason this reader does not know (from a newer writer) keeps its name,
// shown and written back as it came; not known with an empty name: absent.
struct DumpReasonValue {
  bool known = false;
  DumpReason value = DumpReason::Count;
  std::string unknown_name;  // as written, when not known
  bool Is(DumpReason r) const { return known && value == r; }
  std::string Name() const { return known ? DumpReasonName(value) : unknown_name; }
  static DumpReasonValue Of(DumpReason r) { return {true, r, {}}; }
  static DumpReasonValue Named(const std::string& name) {
    DumpReasonValue v;
    v.known = ParseDumpReason(name.c_str(), &v.value);
    if (!v.known) v.unknown_name = name;
    return v;
  }
  auto Tie() const { return std::tie(known, value, unknown_name); }
  NCCLWATCH_RECORD_EQUALITY(DumpReasonValue)
};

// One operation: a ring entry, an in-flight operation (with age_s/deadline_s), the stalled one.
// (The ring writes its entries as rows of columns instead: format/ring_columns.h.)
#define NCCLWATCH_FOR_EACH_OP_FIELD(X)                                                           \
  X(std::string, comm, {}, kComm, Text) /* 16 hex digits */                                      \
  X(int64_t, seq, 0, kSeq, Seq)                                                                  \
  X(int64_t, p2p_seq, 0, kP2pSeq, Seq)                                                           \
  X(bool, op_known, false, kOp, Part) /* op_known, op, op_name: one key, read by ReadOpKind */    \
  X(OpKind, op, OpKind::Count, kOp, OpKind)                                                      \
  X(std::string, op_name, {}, kOp, Part) /* as written, when the kind is unknown */              \
  X(int64_t, count, -1, kCount, Int)                                                             \
  X(std::string, dtype, {}, kDtype, Text)                                                        \
  X(int64_t, bytes, -1, kBytes, Int)                                                             \
  X(std::string, redop, {}, kRedop, TextOrNull) /* empty: no reduction (null) */                 \
  X(int, root, -1, kRoot, Int32)                                                                 \
  X(int, peer, -1, kPeer, Int32)                                                                 \
  X(std::string, stream, {}, kStream, Text) /* "0x..." */                                        \
  X(int64_t, group, 0, kGroup, Int)                                                              \
  X(int64_t, tid, 0, kTid, Int)                                                                  \
  X(int64_t, enqueue_ns, 0, kEnqueueNs, Int)                                                     \
  X(int64_t, gpu_reached_ns, 0, kGpuReachedNs, Int)                                              \
  X(int64_t, completed_ns, 0, kCompletedNs, Int)                                                 \
  X(OpStateValue, state, {}, kState, OpState)                                                    \
  X(int64_t, result, 0, kResult, Int)                                                            \
  X(int64_t, callsite, -1, kCallsite, Int)                                                       \
  X(double, gpu_ms, -1, kGpuMs, RealIfSet) /* < 0: absent (only with NCCLWATCH_GPU_TIMING=1) */  \
  X(double, age_s, -1, kAgeS, RealIfSet)   /* < 0: absent (in_flight and stalled only) */        \
  X(double, deadline_s, -1, kDeadlineS, RealIfSet) /* < 0: absent */                            \
  X(int64_t, replays, -1, kReplays, IntIfSet) /* < 0: absent; captured into a CUDA graph and watched (in_flight, stalled) */ \
  /* The writer's rank in `comm`, written where its process drives several ranks (devices): one  \
     communicator id is then issued on as each of them (added within version 3). -1: absent. */ \
  X(int64_t, comm_rank, -1, kCommRank, IntIfSet)

struct Op {
  NCCLWATCH_RECORD_FIELDS(Op, NCCLWATCH_FOR_EACH_OP_FIELD)

  void SetKind(OpKind k) {
    op_known = true;
    op = k;
    op_name.clear();
  }
  bool IsP2p() const { return op_known && IsPointToPoint(op); }
  const char* OpName() const { return op_known ? OpKindName(op) : op_name.c_str(); }
};

#define NCCLWATCH_FOR_EACH_P2P_COUNTERS_FIELD(X)        \
  X(int, peer, -1, kPeer, Rank)                         \
  X(int64_t, send_enqueued, 0, kSendEnqueued, Seq)      \
  X(int64_t, send_completed, 0, kSendCompleted, Seq)    \
  X(int64_t, recv_enqueued, 0, kRecvEnqueued, Seq)      \
  X(int64_t, recv_completed, 0, kRecvCompleted, Seq)

struct P2pCounters {
  NCCLWATCH_RECORD_FIELDS(P2pCounters, NCCLWATCH_FOR_EACH_P2P_COUNTERS_FIELD)
};

// summary.comms[]: a communicator's sequence state. Readers drop one without id (it cannot be
// matched across ranks) and read a rank beyond its size as unknown.
#define NCCLWATCH_FOR_EACH_COMM_SUMMARY_FIELD(X)                                              \
  X(std::string, id, {}, kId, Text)                                                          \
  X(int, size, 0, kSize, Rank)                                                               \
  X(int, rank, kUnknownRank, kRank, Rank) /* this process's rank in the communicator */      \
  X(std::string, name, {}, kName, Text)                                                      \
  X(std::string, state, {}, kState, Text) /* CommStateName(); kept as text */                \
  X(int64_t, last_enqueued, 0, kLastEnqueued, Seq)                                           \
  X(int64_t, last_gpu_reached, 0, kLastGpuReached, Seq)                                      \
  X(int64_t, last_completed, 0, kLastCompleted, Seq)                                         \
  X(std::vector<P2pCounters>, p2p, {}, kP2p, Objects)                                        \
  /* Its CUDA device, written where the process drives several ranks (added within version 3). */ \
  X(int64_t, device, -1, kDevice, IntIfSet)

struct CommSummary {
  NCCLWATCH_RECORD_FIELDS(CommSummary, NCCLWATCH_FOR_EACH_COMM_SUMMARY_FIELD)

  const P2pCounters* P2pWith(int peer) const {
    for (const auto& c : p2p)
      if (c.peer == peer) return &c;
    return nullptr;
  }
};

#define NCCLWATCH_FOR_EACH_IN_NCCL_FIELD(X) \
  X(int64_t, tid, 0, kTid, Int)             \
  X(std::string, function, {}, kFunction, Text) \
  X(double, since_s, -1, kSinceS, Real)

struct InNcclThread {
  NCCLWATCH_RECORD_FIELDS(InNcclThread, NCCLWATCH_FOR_EACH_IN_NCCL_FIELD)
};

// For reason peer_request: the dump request (DumpRequest, format/request.h) this dump answers,
// as the dump keeps it; the request file's job instance and time only decide whether to answer.
#define NCCLWATCH_FOR_EACH_ANSWERED_REQUEST_FIELD(X)          \
  X(std::string, request, {}, kRequest, Text)                 \
  X(int, origin_rank, kUnknownRank, kOriginRank, Int32)       \
  X(std::string, origin_host, {}, kOriginHost, Text)          \
  X(std::string, reason, {}, kReason, Text) /* DumpRequest::reason, as the request file says it */

struct AnsweredRequest {
  NCCLWATCH_RECORD_FIELDS(AnsweredRequest, NCCLWATCH_FOR_EACH_ANSWERED_REQUEST_FIELD)
};

// The uncaught Python exception a process ended with (reason exit): the interpreter's own last
// report of it (see stacks::WatchPythonExit).
#define NCCLWATCH_FOR_EACH_EXCEPTION_FIELD(X)                                                  \
  X(std::string, type, {}, kType, Text)       /* qualified class name ("ValueError", "mypkg.DataError") */ \
  X(std::string, message, {}, kMessage, Text) /* str() of it (its own __str__: its first argument), cut to 512 bytes */             \
  X(std::string, file, {}, kFile, Text)       /* innermost frame of its traceback: where it was raised */ \
  X(int64_t, line, 0, kLine, Int)                                                             \
  X(std::string, function, {}, kFunction, Text)

struct UncaughtException {
  NCCLWATCH_RECORD_FIELDS(UncaughtException, NCCLWATCH_FOR_EACH_EXCEPTION_FIELD)
};

// A process its host saw stopped (reasons stopped and postmortem): how, since when.
#define NCCLWATCH_FOR_EACH_STOP_FIELD(X)                                                          \
  X(std::string, how, {}, kHow, Text) /* StopKindName(); kept as text */                         \
  X(int64_t, seen_unix_ns, 0, kSeenUnixNs, Int) /* when the host first saw it stopped (this time) */ \
  X(int64_t, last_seen_unix_ns, 0, kLastSeenUnixNs, Int) /* when it last saw it still stopped */

struct StopRecord {
  NCCLWATCH_RECORD_FIELDS(StopRecord, NCCLWATCH_FOR_EACH_STOP_FIELD)
};

#define NCCLWATCH_FOR_EACH_SUMMARY_FIELD(X)                                                            \
  X(int, rank, kUnknownRank, kRank, Rank)                                                              \
  X(int, local_rank, kUnknownRank, kLocalRank, Int32)                                                  \
  X(int, world_size, -1, kWorldSize, Rank)                                                             \
  X(std::string, host, {}, kHost, Text)                                                                \
  X(int64_t, pid, 0, kPid, Int)                                                                        \
  X(int64_t, dump_seq, 0, kDumpSeq, Int)                                                               \
  X(DumpReasonValue, reason, {}, kReason, Reason)                                                      \
  X(std::string, detail, {}, kDetail, Text)                                                            \
  X(Boxed<AnsweredRequest>, answered, {}, kTrigger, Object)                                            \
  X(int64_t, time_unix_ns, 0, kTimeUnixNs, Int)                                                        \
  X(int64_t, time_mono_ns, 0, kTimeMonoNs, Int)                                                        \
  X(int64_t, start_mono_ns, 0, kStartMonoNs, Int)                                                      \
  X(int64_t, nccl_version, 0, kNcclVersion, Int)                                                       \
  X(std::vector<InNcclThread>, in_nccl, {}, kInNccl, Objects)                                          \
  X(std::vector<CommSummary>, comms, {}, kComms, Objects)                                              \
  X(std::vector<Op>, in_flight, {}, kInFlight, Objects)                                                \
  X(Boxed<Op>, stalled, {}, kStalled, Object)                                                          \
  X(int64_t, ring_overwritten, 0, kRingOverwritten, Int)                                               \
  /* Identity of this process in the job: unique even where host and pid are not (containers       \
     with their own PID namespaces); empty in dumps that predate it. */                               \
  X(std::string, process_uid, {}, kProcessUid, Text)                                                   \
  /* The launcher's id of this attempt of the job (restarts and requeues differ), "" unknown. */      \
  X(std::string, job_instance, {}, kJobInstance, Text)                                                 \
  X(int64_t, start_unix_ns, 0, kStartUnixNs, Int) /* wall clock when ncclwatch started in this process */ \
  X(int64_t, exit_status, -1, kExitStatus, Int) /* reason exit: the status passed to exit(); -1 unknown */ \
  X(Boxed<Op>, failed, {}, kFailed, Object) /* reason nccl_error: the call that returned the error */  \
  /* Reasons nccl_error, async_error: the ncclResult_t reported, whichever call it came from       \
     (a group end, a communicator's creation or split have no `failed` operation); 0 absent. */       \
  X(int64_t, error_result, 0, kErrorResult, IntIfNonZero)                                              \
  /* Postmortem dumps (version 3): when its watchdog last mirrored op states into its black box    \
     (0: never); the dump's time is its last sign of life. Ops issued after it are `unknown`,       \
     and the communicators' gpu_reached / completed counts are as of then. -1: absent (a dump       \
     written by the process itself, whose states are as of its time). */                            \
  X(int64_t, states_as_of_mono_ns, -1, kStatesAsOfMonoNs, IntIfSet)                                    \
  /* Reason exit: the uncaught Python exception the process ended with, if any. */                   \
  X(Boxed<UncaughtException>, exception, {}, kException, ObjectIfSet)                                  \
  /* Reasons stopped and postmortem: its host saw it stopped, and it never ran again after. */       \
  X(Boxed<StopRecord>, stopped, {}, kStopped, ObjectIfSet)

struct Summary {
  NCCLWATCH_RECORD_FIELDS(Summary, NCCLWATCH_FOR_EACH_SUMMARY_FIELD)

  const CommSummary* Comm(const std::string& id) const {
    for (const auto& c : comms)
      if (c.id == id) return &c;
    return nullptr;
  }
};

// One native frame, from capture (lib/stacks) to report: the only frame type there is.
// No field list: how a dump writes its module (index or path) depends on the version.
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

#define NCCLWATCH_FOR_EACH_PYTHON_FRAME_FIELD(X) \
  X(std::string, file, {}, kFile, Text)          \
  X(int64_t, line, 0, kLine, Int)                \
  X(std::string, function, {}, kFunction, Text)  \
  X(bool, library, false, kLibrary, Flag) /* site-packages, the standard library, torch, deepspeed, megatron */

struct PythonFrame {
  NCCLWATCH_RECORD_FIELDS(PythonFrame, NCCLWATCH_FOR_EACH_PYTHON_FRAME_FIELD)
};

struct Stack {
  std::vector<NativeFrame> native;  // innermost first
  std::vector<PythonFrame> python;  // innermost first
  bool Empty() const { return native.empty() && python.empty(); }
  auto Tie() const { return std::tie(native, python); }
  NCCLWATCH_RECORD_EQUALITY(Stack)
};

// Callsite and Thread: no field list; written with the dump's module table (WriteThreadLike).
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
#define NCCLWATCH_FOR_EACH_COMMUNICATOR_FIELD(X)                          \
  X(std::string, id, {}, kId, Text)                                       \
  X(int, size, 0, kSize, Int32)                                           \
  X(int, rank, kUnknownRank, kRank, Int32)                                \
  X(std::string, name, {}, kName, Text)                                   \
  X(std::string, state, {}, kState, Text) /* CommStateName() */           \
  X(int64_t, device, -1, kDevice, Int)                                    \
  X(std::string, kind, {}, kKind, Text)  /* CommKindName() */             \
  X(std::string, parent, {}, kParent, TextOrNull) /* empty: none (null) */ \
  X(int64_t, color, -1, kColor, Int) /* -1: not a split */                \
  X(int64_t, key, -1, kKey, Int)                                          \
  X(bool, blocking, true, kBlocking, Flag)                                \
  X(int64_t, created_mono_ns, 0, kCreatedMonoNs, Int)                     \
  X(int64_t, ended_mono_ns, 0, kEndedMonoNs, Int)

struct Communicator {
  NCCLWATCH_RECORD_FIELDS(Communicator, NCCLWATCH_FOR_EACH_COMMUNICATOR_FIELD)
};

// No field list: version 2 writes its entries as rows of columns (format/ring_columns.h).
struct Ring {
  int64_t capacity = 0;
  int64_t recorded = 0;
  int64_t overwritten = 0;
  std::vector<Op> entries;  // oldest first
  auto Tie() const { return std::tie(capacity, recorded, overwritten, entries); }
  NCCLWATCH_RECORD_EQUALITY(Ring)
};

#define NCCLWATCH_FOR_EACH_RECOVERY_FIELD(X)                \
  X(std::string, comm, {}, kComm, Text)                     \
  X(int64_t, seq, 0, kSeq, Seq)                             \
  X(std::string, op, {}, kOp, Text)                         \
  X(double, stalled_after_s, 0, kStalledAfterS, Real)       \
  X(double, recovered_after_s, 0, kRecoveredAfterS, Real)

struct Recovery {
  NCCLWATCH_RECORD_FIELDS(Recovery, NCCLWATCH_FOR_EACH_RECOVERY_FIELD)
};

using KeyValues = std::vector<std::pair<std::string, std::string>>;

#define NCCLWATCH_FOR_EACH_PROCESS_FIELD(X)                                  \
  X(std::string, exe, {}, kExe, Text)                                        \
  X(std::vector<std::string>, cmdline, {}, kCmdline, Texts)                  \
  X(std::string, cwd, {}, kCwd, Text)                                        \
  X(KeyValues, env, {}, kEnv, KeyValues) /* in the order written */          \
  X(int64_t, cuda_driver_version, 0, kCudaDriverVersion, Int)                \
  X(std::string, ncclwatch_version, {}, kNcclwatchVersion, Text)             \
  X(KeyValues, config, {}, kConfig, KeyValues) /* NCCLWATCH_* settings in effect */

struct Process {
  NCCLWATCH_RECORD_FIELDS(Process, NCCLWATCH_FOR_EACH_PROCESS_FIELD)

  const std::string* Env(const std::string& name) const {
    for (const auto& kv : env)
      if (kv.first == name) return &kv.second;
    return nullptr;
  }
};

// Every record with a field list, each after those it holds (for the writer and the reader).
#define NCCLWATCH_FOR_EACH_LISTED_RECORD(R)                    \
  R(Op, NCCLWATCH_FOR_EACH_OP_FIELD)                           \
  R(P2pCounters, NCCLWATCH_FOR_EACH_P2P_COUNTERS_FIELD)        \
  R(CommSummary, NCCLWATCH_FOR_EACH_COMM_SUMMARY_FIELD)        \
  R(InNcclThread, NCCLWATCH_FOR_EACH_IN_NCCL_FIELD)            \
  R(AnsweredRequest, NCCLWATCH_FOR_EACH_ANSWERED_REQUEST_FIELD) \
  R(UncaughtException, NCCLWATCH_FOR_EACH_EXCEPTION_FIELD)     \
  R(StopRecord, NCCLWATCH_FOR_EACH_STOP_FIELD)                 \
  R(Summary, NCCLWATCH_FOR_EACH_SUMMARY_FIELD)                 \
  R(PythonFrame, NCCLWATCH_FOR_EACH_PYTHON_FRAME_FIELD)        \
  R(Communicator, NCCLWATCH_FOR_EACH_COMMUNICATOR_FIELD)       \
  R(Recovery, NCCLWATCH_FOR_EACH_RECOVERY_FIELD)               \
  R(Process, NCCLWATCH_FOR_EACH_PROCESS_FIELD)

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
