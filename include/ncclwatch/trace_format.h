// ncclwatch trace format: the one schema shared by the writer (lib/dump) and the readers
// (tools/, tests). Documented field by field in docs/trace-format.md; bump kTraceVersion on
// any change a reader could notice, and keep readers accepting every version they know.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

namespace ncclwatch {
namespace trace {

constexpr const char* kFormatName = "ncclwatch-trace";

// One vocabulary from one X-macro list X(Enumerator, "name"): the enum, its name table, a name
// lookup that never reads out of bounds, and the parse that inverts it (false for an unknown
// name, which readers keep as text). Enumerators here are spelled as the things they name
// (OpKind::AllReduce, from ncclAllReduce and written "AllReduce"); every other enum's are kName.
#define NCCLWATCH_VOCAB_ENUMERATOR(e, s) e,
#define NCCLWATCH_VOCAB_NAME(e, s) s,
#define NCCLWATCH_DEFINE_VOCABULARY(Type, kNames, NameOf, ParseFn, LIST)               \
  enum class Type : uint8_t { LIST(NCCLWATCH_VOCAB_ENUMERATOR) Count };                \
  constexpr const char* kNames[] = {LIST(NCCLWATCH_VOCAB_NAME)};                       \
  inline const char* NameOf(Type v) {                                                  \
    auto i = static_cast<size_t>(v);                                                   \
    return i < static_cast<size_t>(Type::Count) ? kNames[i] : "unknown";               \
  }                                                                                    \
  inline bool ParseFn(const char* s, Type* out) {                                      \
    for (size_t i = 0; s && i < static_cast<size_t>(Type::Count); ++i)                 \
      if (std::strcmp(s, kNames[i]) == 0) {                                            \
        *out = static_cast<Type>(i);                                                   \
        return true;                                                                   \
      }                                                                                \
    return false;                                                                      \
  }
// Bump on any change a reader could notice; readers accept every version they know.
// 2: the ring as columns and delta-encoded rows (docs/trace-format.md, "The ring").
// 3: postmortem dumps say how fresh their black box is (summary.states_as_of_mono_ns, op state
//    `unknown`) and carry call sites symbolized from raw addresses by the host's caretaker.
constexpr int kTraceVersion = 3;
constexpr int kOldestTraceVersion = 1;  // the oldest version this reader still reads

// Version 2's ring (docs/trace-format.md, "The ring"): what repeats from one operation to the
// next (op, communicator, size, type, stream, thread, call site) is a *shape*, defined once by
// an object among the rows; each row is an array of integers in this column order, the most
// often non-zero first, so that trailing zeros can be left out.
#define NCCLWATCH_FOR_EACH_RING_COLUMN(X)                        \
  X(Shape, "shape")                                              \
  X(Seq, "seq")                                                  \
  X(EnqueueNs, "enqueue_ns")                                     \
  X(GpuReachedMinusEnqueueNs, "gpu_reached_minus_enqueue_ns")    \
  X(CompletedMinusEnqueueNs, "completed_minus_enqueue_ns")       \
  X(State, "state")                                              \
  X(P2pSeq, "p2p_seq")                                           \
  X(Group, "group")                                              \
  X(Result, "result")                                            \
  X(GpuMs, "gpu_ms")
// Shapes live in slots: the k-th shape object defines slot k % kRingShapeSlots (bounded memory
// on both sides, however many shapes a ring holds).
constexpr int64_t kRingShapeSlots = 4096;

enum class RingColumn : uint8_t {
#define NCCLWATCH_ENUM_RING_COLUMN(name, text) name,
  NCCLWATCH_FOR_EACH_RING_COLUMN(NCCLWATCH_ENUM_RING_COLUMN)
#undef NCCLWATCH_ENUM_RING_COLUMN
      Count
};
inline constexpr const char* kRingColumnNames[] = {
#define NCCLWATCH_RING_COLUMN_NAME(name, text) text,
    NCCLWATCH_FOR_EACH_RING_COLUMN(NCCLWATCH_RING_COLUMN_NAME)
#undef NCCLWATCH_RING_COLUMN_NAME
};

// Operation kinds. X(kind, bus-bandwidth factor kind). The NCCL function list in
// nccl_abi.h names one of these per wrapped data-moving function.
//   BusAllReduce: busbw = algbw * 2(n-1)/n; BusGather: (n-1)/n; BusOne: 1 (nccl-tests).
#define NCCLWATCH_FOR_EACH_OP_KIND(X) \
  X(AllReduce, BusAllReduce)          \
  X(Broadcast, BusOne)                \
  X(Reduce, BusOne)                   \
  X(AllGather, BusGather)             \
  X(ReduceScatter, BusGather)         \
  X(AlltoAll, BusGather)              \
  X(Gather, BusGather)                \
  X(Scatter, BusGather)               \
  X(Send, BusOne)                     \
  X(Recv, BusOne)

enum class OpKind : uint8_t {
#define NCCLWATCH_ENUM_OP(kind, bus) kind,
  NCCLWATCH_FOR_EACH_OP_KIND(NCCLWATCH_ENUM_OP)
#undef NCCLWATCH_ENUM_OP
      Count
};

constexpr const char* kOpKindNames[] = {
#define NCCLWATCH_NAME_OP(kind, bus) #kind,
    NCCLWATCH_FOR_EACH_OP_KIND(NCCLWATCH_NAME_OP)
#undef NCCLWATCH_NAME_OP
};

enum class BusFactor : uint8_t { BusAllReduce, BusGather, BusOne };
constexpr BusFactor kOpKindBusFactor[] = {
#define NCCLWATCH_BUS_OP(kind, bus) BusFactor::bus,
    NCCLWATCH_FOR_EACH_OP_KIND(NCCLWATCH_BUS_OP)
#undef NCCLWATCH_BUS_OP
};

inline bool IsPointToPoint(OpKind k) { return k == OpKind::Send || k == OpKind::Recv; }

inline const char* OpKindName(OpKind k) {
  auto i = static_cast<size_t>(k);
  return i < static_cast<size_t>(OpKind::Count) ? kOpKindNames[i] : "Unknown";
}

inline bool ParseOpKind(const char* s, OpKind* out) {
  for (size_t i = 0; i < static_cast<size_t>(OpKind::Count); ++i) {
    if (std::strcmp(s, kOpKindNames[i]) == 0) {
      *out = static_cast<OpKind>(i);
      return true;
    }
  }
  return false;
}

// Life of one recorded operation. Forward-only, except that any state may become Error.
//   PendingLaunch: called inside ncclGroupStart/End, not yet launched by the outermost GroupEnd
//   Enqueued:      launched on its stream by the host; the GPU has not reached it yet
//   GpuReached:    all earlier work on its stream is done: the GPU is inside the operation
//   Completed:     the GPU finished it
//   Error:         the NCCL call returned an error
//   Captured:      issued while its stream was being captured into a CUDA graph (not followed)
//   Unmonitored:   no GPU markers (no CUDA driver, or marker resources exhausted)
//   Unknown:       (version 3, postmortem dumps) issued after the last watchdog poll its black
//                  box holds: what its GPU did with it is not known
//   Aborted:       (added within version 3) its communicator was aborted (ncclCommAbort) before
//                  its end marker was seen: the abort ended it, it did not complete. A reader
//                  that does not know it reads it from the ring as `unknown`, never completed
#define NCCLWATCH_FOR_EACH_OP_STATE(X) \
  X(PendingLaunch, "pending_launch")   \
  X(Enqueued, "enqueued")              \
  X(GpuReached, "gpu_reached")         \
  X(Completed, "completed")            \
  X(Error, "error")                    \
  X(Captured, "captured")              \
  X(Unmonitored, "unmonitored")        \
  X(Unknown, "unknown")                \
  X(Aborted, "aborted")

NCCLWATCH_DEFINE_VOCABULARY(OpState, kOpStateNames, OpStateName, ParseOpState, NCCLWATCH_FOR_EACH_OP_STATE)

// Why a dump was written (summary.reason).
#define NCCLWATCH_FOR_EACH_DUMP_REASON(X)                                                  \
  X(Stall, "stall")                   /* an operation passed its deadline */              \
  X(Abort, "abort")                   /* ncclCommAbort was called */                      \
  X(NcclError, "nccl_error")          /* an NCCL call returned an error */                \
  X(AsyncError, "async_error")        /* ncclCommGetAsyncError reported an error */       \
  X(Signal, "signal")                 /* SIGTERM / SIGINT */                              \
  X(FatalSignal, "fatal_signal")      /* SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL */      \
  X(OnDemand, "on_demand")            /* the dump signal (default SIGUSR2) */             \
  X(ExitInFlight, "exit_in_flight")   /* process exit with operations still in flight */  \
  X(PeerRequest, "peer_request")      /* another rank of the job dumped for a hang */     \
  X(Recovery, "recovery")             /* a stalled operation completed after all */      \
  X(Exit, "exit")                     /* normal process exit, nothing in flight */       \
  X(Postmortem, "postmortem")         /* written by another process from the black box of \
                                         one that ended without a word (SIGKILL, OOM) */     \
  X(Stopped, "stopped")               /* written by the host's caretaker from the black box \
                                         of a process that cannot run (summary.stopped) */

NCCLWATCH_DEFINE_VOCABULARY(DumpReason, kDumpReasonNames, DumpReasonName, ParseDumpReason,
                            NCCLWATCH_FOR_EACH_DUMP_REASON)

// How the host saw a process that cannot run (summary.stopped.how), from /proc and its cgroup.
#define NCCLWATCH_FOR_EACH_STOP_KIND(X)                                                   \
  X(Stopped, "stopped") /* /proc state T: SIGSTOP, SIGTSTP (Ctrl-Z), a debugger's stop */ \
  X(Traced, "traced")   /* /proc state t: held by a debugger or tracer (ptrace) */        \
  X(Frozen, "frozen")   /* its cgroup is frozen (cgroup v2 cgroup.freeze, v1 freezer) */

NCCLWATCH_DEFINE_VOCABULARY(StopKind, kStopKindNames, StopKindName, ParseStopKind, NCCLWATCH_FOR_EACH_STOP_KIND)

// How a communicator was created (communicators[].kind).
#define NCCLWATCH_FOR_EACH_COMM_KIND(X)         \
  X(InitRank, "init_rank")                      \
  X(InitRankConfig, "init_rank_config")         \
  X(InitAll, "init_all")                        \
  X(InitScalable, "init_scalable")              \
  X(Split, "split")                             \
  X(Shrink, "shrink")                           \
  X(Unknown, "unknown") /* created before ncclwatch saw it */

NCCLWATCH_DEFINE_VOCABULARY(CommKind, kCommKindNames, CommKindName, ParseCommKind, NCCLWATCH_FOR_EACH_COMM_KIND)

// Where a communicator is in its life (summary.comms[].state, communicators[].state).
#define NCCLWATCH_FOR_EACH_COMM_STATE(X)                                              \
  X(Initializing, "initializing") /* ncclCommInitRank* entered, not returned (setup) */ \
  X(Active, "active")                                                                 \
  X(Destroyed, "destroyed")              \
  X(Finalized, "finalized")              \
  X(Aborted, "aborted")

NCCLWATCH_DEFINE_VOCABULARY(CommState, kCommStateNames, CommStateName, ParseCommState,
                            NCCLWATCH_FOR_EACH_COMM_STATE)

// NCCL datatype and reduction names as written in dumps (index = NCCL enum value).
constexpr const char* kDatatypeNames[] = {"int8",    "uint8",   "int32",    "uint32",
                                          "int64",   "uint64",  "float16",  "float32",
                                          "float64", "bfloat16", "float8e4m3", "float8e5m2"};
constexpr size_t kDatatypeSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
constexpr int kNumDatatypes = 12;
constexpr const char* kRedOpNames[] = {"sum", "prod", "max", "min", "avg"};
constexpr int kNumBuiltinRedOps = 5;

inline const char* DatatypeName(int dt) {
  return dt >= 0 && dt < kNumDatatypes ? kDatatypeNames[dt] : "unknown";
}
inline size_t DatatypeSize(int dt) { return dt >= 0 && dt < kNumDatatypes ? kDatatypeSizes[dt] : 0; }
// -1: the operation has no reduction; >= 5: a user-created op (ncclRedOpCreatePreMulSum).
inline const char* RedOpName(int op) {
  if (op < 0) return nullptr;
  return op < kNumBuiltinRedOps ? kRedOpNames[op] : "premulsum";
}

// Bytes an operation moves, as nccl-tests counts its "size" so that busbw formulas apply:
// AllGather/ReduceScatter/AlltoAll/Gather/Scatter: count * nranks * typesize; else count * typesize.
inline uint64_t OperationBytes(OpKind k, uint64_t count, int dtype, int nranks) {
  uint64_t b = count * DatatypeSize(dtype);
  switch (k) {
    case OpKind::AllGather:
    case OpKind::ReduceScatter:
    case OpKind::AlltoAll:
    case OpKind::Gather:
    case OpKind::Scatter:
      return b * static_cast<uint64_t>(nranks > 0 ? nranks : 1);
    default:
      return b;
  }
}

// Key names. Writer and readers use only these constants.
namespace key {
// top level
constexpr const char* kFormat = "format";
constexpr const char* kVersion = "version";
constexpr const char* kSummary = "summary";
constexpr const char* kProcess = "process";
constexpr const char* kCommunicators = "communicators";
constexpr const char* kRing = "ring";
constexpr const char* kCallsites = "callsites";
constexpr const char* kThreads = "threads";
constexpr const char* kRecoveries = "recoveries";
// summary
constexpr const char* kRank = "rank";
constexpr const char* kLocalRank = "local_rank";
constexpr const char* kWorldSize = "world_size";
constexpr const char* kHost = "host";
constexpr const char* kPid = "pid";
constexpr const char* kDumpSeq = "dump_seq";
constexpr const char* kReason = "reason";
constexpr const char* kDetail = "detail";
constexpr const char* kTrigger = "trigger";
constexpr const char* kRequest = "request";
constexpr const char* kOriginRank = "origin_rank";
constexpr const char* kOriginHost = "origin_host";
constexpr const char* kTimeUnixNs = "time_unix_ns";
constexpr const char* kTimeMonoNs = "time_mono_ns";
constexpr const char* kStartMonoNs = "start_mono_ns";
constexpr const char* kNcclVersion = "nccl_version";
constexpr const char* kInNccl = "in_nccl";
constexpr const char* kFunction = "function";
constexpr const char* kSinceS = "since_s";
constexpr const char* kComms = "comms";
constexpr const char* kInFlight = "in_flight";
constexpr const char* kStalled = "stalled";
constexpr const char* kRingOverwritten = "ring_overwritten";
constexpr const char* kProcessUid = "process_uid";
constexpr const char* kJobInstance = "job_instance";
constexpr const char* kStartUnixNs = "start_unix_ns";
constexpr const char* kExitStatus = "exit_status";
constexpr const char* kFailed = "failed";
constexpr const char* kErrorResult = "error_result";
constexpr const char* kStatesAsOfMonoNs = "states_as_of_mono_ns";  // version 3: postmortem dumps
constexpr const char* kException = "exception";  // {type, message, file, line, function}
// Reasons stopped and postmortem: the host saw the process stopped {how, seen_unix_ns, last_seen_unix_ns}.
constexpr const char* kStopped = "stopped";
constexpr const char* kHow = "how";
constexpr const char* kSeenUnixNs = "seen_unix_ns";
constexpr const char* kLastSeenUnixNs = "last_seen_unix_ns";
constexpr const char* kType = "type";
constexpr const char* kMessage = "message";
// communicator (summary.comms[] and communicators[])
constexpr const char* kId = "id";
constexpr const char* kSize = "size";
constexpr const char* kName = "name";
constexpr const char* kState = "state";
constexpr const char* kLastEnqueued = "last_enqueued";
constexpr const char* kLastGpuReached = "last_gpu_reached";
constexpr const char* kLastCompleted = "last_completed";
constexpr const char* kP2p = "p2p";
constexpr const char* kPeer = "peer";
constexpr const char* kSendEnqueued = "send_enqueued";
constexpr const char* kSendCompleted = "send_completed";
constexpr const char* kRecvEnqueued = "recv_enqueued";
constexpr const char* kRecvCompleted = "recv_completed";
constexpr const char* kDevice = "device";
constexpr const char* kKind = "kind";
constexpr const char* kParent = "parent";
constexpr const char* kColor = "color";
constexpr const char* kKey = "key";
constexpr const char* kBlocking = "blocking";
constexpr const char* kCreatedMonoNs = "created_mono_ns";
constexpr const char* kEndedMonoNs = "ended_mono_ns";
// operation (ring.entries[], summary.in_flight[], summary.stalled)
constexpr const char* kComm = "comm";
constexpr const char* kSeq = "seq";
constexpr const char* kP2pSeq = "p2p_seq";
constexpr const char* kOp = "op";
constexpr const char* kCount = "count";
constexpr const char* kDtype = "dtype";
constexpr const char* kBytes = "bytes";
constexpr const char* kRedop = "redop";
constexpr const char* kRoot = "root";
constexpr const char* kStream = "stream";
constexpr const char* kGroup = "group";
constexpr const char* kTid = "tid";
constexpr const char* kEnqueueNs = "enqueue_ns";
constexpr const char* kGpuReachedNs = "gpu_reached_ns";
constexpr const char* kCompletedNs = "completed_ns";
constexpr const char* kResult = "result";
constexpr const char* kCallsite = "callsite";
constexpr const char* kCommRank = "comm_rank";
constexpr const char* kGpuMs = "gpu_ms";
constexpr const char* kAgeS = "age_s";
constexpr const char* kDeadlineS = "deadline_s";
// Added within version 3: an operation captured into a CUDA graph and watched at each replay,
// in a replay now (in_flight[], stalled): the replays seen begin, this one included.
constexpr const char* kReplays = "replays";
// ring
constexpr const char* kCapacity = "capacity";
constexpr const char* kRecorded = "recorded";
constexpr const char* kOverwritten = "overwritten";
constexpr const char* kEntries = "entries";  // version 1; version 2 readers rebuild it
constexpr const char* kColumns = "columns";
constexpr const char* kRows = "rows";
// stacks
constexpr const char* kFrames = "frames";
constexpr const char* kPython = "python";
constexpr const char* kNote = "note";
constexpr const char* kIp = "ip";
constexpr const char* kModule = "module";
constexpr const char* kSymbol = "symbol";
constexpr const char* kOffset = "offset";
constexpr const char* kBuildId = "build_id";
constexpr const char* kModuleOffset = "module_offset";
constexpr const char* kInterrupted = "interrupted";
constexpr const char* kOwn = "own";
constexpr const char* kPythonDrivenFrom = "python_driven_from";  // callsites[]: within version 2
constexpr const char* kModules = "modules";  // version 2: top level, [{path, build_id}]
constexpr const char* kPath = "path";
constexpr const char* kFile = "file";
constexpr const char* kLine = "line";
constexpr const char* kLibrary = "library";
// process
constexpr const char* kExe = "exe";
constexpr const char* kCmdline = "cmdline";
constexpr const char* kCwd = "cwd";
constexpr const char* kEnv = "env";
constexpr const char* kCudaDriverVersion = "cuda_driver_version";
constexpr const char* kNcclwatchVersion = "ncclwatch_version";
constexpr const char* kConfig = "config";
// recoveries
constexpr const char* kStalledAfterS = "stalled_after_s";
constexpr const char* kRecoveredAfterS = "recovered_after_s";
}  // namespace key

// Dump file names: lib/format/file_name.h.

}  // namespace trace
}  // namespace ncclwatch
