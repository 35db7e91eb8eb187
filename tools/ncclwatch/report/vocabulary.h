// The analysis report's vocabulary (`ncclwatch analyze --json`, docs/analysis.md): causes,
// culprit states and positions, key names and the report's own version. The dump schema is
// include/ncclwatch/trace_format.h; this is what the command says about dumps, shared by the
// rules that decide, the renderers that word it and ncclwatch-gen's expected verdicts.
#pragma once

#include "ncclwatch/trace_format.h"

namespace ncclwatch {
namespace analysis {

// Analyzer verdict causes (`ncclwatch analyze`, docs/trace-format.md "Analysis output").
#define NCCLWATCH_FOR_EACH_CAUSE(X)            \
  X(RankMissing, "rank_missing")               \
  X(RankExited, "rank_exited")                 \
  X(NcclError, "nccl_error")                   \
  X(InitHang, "init_hang")                     \
  X(GpuNotReached, "gpu_not_reached")          \
  X(StuckInCollective, "stuck_in_collective")  \
  X(Mismatch, "mismatch")                      \
  X(P2pUnmatched, "p2p_unmatched")             \
  X(CrossCommDeadlock, "cross_comm_deadlock")  \
  X(RankDead, "rank_dead")                     \
  X(RankStopped, "rank_stopped")               \
  X(ExtraCall, "extra_call")                   \
  X(JobKilled, "job_killed")                   \
  X(HostLost, "host_lost")                     \
  X(P2pMismatch, "p2p_mismatch")               \
  X(P2pOutOfOrder, "p2p_out_of_order")         \
  X(NoHang, "no_hang")

NCCLWATCH_DEFINE_VOCABULARY(Cause, kCauseNames, CauseName, ParseCause, NCCLWATCH_FOR_EACH_CAUSE)

// Where a culprit is, for machines (analyze --json culprit_stacks[].state), beside its sentence.
#define NCCLWATCH_FOR_EACH_CULPRIT_STATE(X)                                            \
  X(NoDump, "no_dump")                   /* no dump at all: killed, never started */     \
  X(UnreadableDump, "unreadable_dump")   /* its dump exists but cannot be read */        \
  X(Crashed, "crashed")                  /* a fatal signal */                            \
  X(Killed, "killed")                    /* ended without a word (SIGKILL, the OOM killer): \
                                            its black box, or gone before the teardown */  \
  X(Stopped, "stopped")                  /* its host saw it stopped (SIGSTOP, a debugger, \
                                            a frozen cgroup); perhaps killed so since */  \
  X(NcclError, "nccl_error")             /* an NCCL call of its returned an error */     \
  X(Exited, "exited")                    /* it exited */                                 \
  X(OutsideNccl, "outside_nccl")         /* alive, no thread inside NCCL */              \
  X(InsideNccl, "inside_nccl")           /* alive, a thread inside an NCCL call */

NCCLWATCH_DEFINE_VOCABULARY(CulpritState, kCulpritStateNames, CulpritStateName, ParseCulpritState,
                            NCCLWATCH_FOR_EACH_CULPRIT_STATE)

// Where a culprit is on the verdict's communicator (culprit_stacks[].comm_state, with seq).
#define NCCLWATCH_FOR_EACH_COMM_POSITION(X)                                                  \
  X(Unknown, "unknown")                 /* no communicator in the verdict (a crash alone) */ \
  X(NotCreated, "not_created")          /* it has not created the communicator */            \
  X(GpuBehind, "gpu_behind")            /* its GPU has not finished seq, which others did */  \
  X(NotCalled, "not_called")            /* its last call is seq, before the blocked one */    \
  X(GpuNotReached, "gpu_not_reached")   /* it called the blocked op; its GPU is not in it */  \
  X(GpuInside, "gpu_inside")            /* its GPU is inside the blocked op */                \
  X(GpuUnknown, "gpu_unknown")          /* seq was issued after its black box's last update */ \
  X(NotInReplay, "not_in_replay")       /* captured seq: no replay of its graph is under way there */

NCCLWATCH_DEFINE_VOCABULARY(CommPosition, kCommPositionNames, CommPositionName, ParseCommPosition,
                            NCCLWATCH_FOR_EACH_COMM_POSITION)

// Why a culprit's thread is shown (culprit_stacks[].threads[].role), in the order shown.
#define NCCLWATCH_FOR_EACH_THREAD_ROLE(X)                                                       \
  X(IssuedLastCall, "issued_last_call") /* issued its last call on the verdict's communicator */ \
  X(InsideNccl, "inside_nccl")          /* inside an NCCL call now */                            \
  X(Main, "main")                       /* the process's main thread */                           \
  X(Python, "python")                   /* runs Python code */                                    \
  X(Other, "other")                     /* any other application thread */

NCCLWATCH_DEFINE_VOCABULARY(ThreadRole, kThreadRoleNames, ThreadRoleName, ParseThreadRole,
                            NCCLWATCH_FOR_EACH_THREAD_ROLE)

// Key names of the analysis output, documented in docs/analysis.md.
namespace report_key {
constexpr const char* kVerdicts = "verdicts";
constexpr const char* kCause = "cause";
constexpr const char* kComm = "comm";
constexpr const char* kCommName = "comm_name";
constexpr const char* kCommSize = "comm_size";
constexpr const char* kSeq = "seq";
constexpr const char* kOp = "op";
constexpr const char* kBytes = "bytes";
constexpr const char* kP2pSrc = "p2p_src";
constexpr const char* kP2pDst = "p2p_dst";
constexpr const char* kCulpritRanks = "culprit_ranks";
constexpr const char* kCulpritCommRanks = "culprit_comm_ranks";
constexpr const char* kWaitingRanks = "waiting_ranks";
constexpr const char* kEndedByFramework = "ended_by_framework";
constexpr const char* kHow = "how";
constexpr const char* kSignal = "signal";
constexpr const char* kNotYet = "not_yet";
constexpr const char* kDeadlineS = "deadline_s";
constexpr const char* kWaitedS = "waited_s";
constexpr const char* kCulpritStacks = "culprit_stacks";
constexpr const char* kCallsite = "callsite";
constexpr const char* kCallsiteOp = "callsite_op";
constexpr const char* kCallsiteDrivenFrom = "callsite_driven_from";  // whose Python stack `callsite` has
constexpr const char* kIssuedBy = "issued_by";  // the sentence of a native thread's call driven from Python
constexpr const char* kCurrent = "current";
constexpr const char* kThread = "thread";
constexpr const char* kThreads = "threads";
constexpr const char* kIdGroups = "id_groups";
constexpr const char* kTid = "tid";
constexpr const char* kName = "name";
constexpr const char* kRole = "role";
constexpr const char* kIdle = "idle";
constexpr const char* kFrames = "frames";
constexpr const char* kWhere = "where";
constexpr const char* kNote = "note";
constexpr const char* kHost = "host";
constexpr const char* kPid = "pid";
constexpr const char* kDevice = "device";                // a rank of a process that drives several
constexpr const char* kProcessRanks = "process_ranks";  // every rank that process drives
constexpr const char* kLaunch = "launch";            // its launch (1, 2, ...) where launches share a comm
constexpr const char* kLaunchRank = "launch_rank";   // the RANK its launch started it with
constexpr const char* kLaunches = "launches";        // {comm, ranks: [[first, size], ...]}
constexpr const char* kFile = "file";
constexpr const char* kCycle = "cycle";
constexpr const char* kCycleSteps = "cycle_steps";
constexpr const char* kGroups = "groups";
constexpr const char* kRanks = "ranks";
constexpr const char* kCount = "count";
constexpr const char* kDtype = "dtype";
constexpr const char* kRoot = "root";
constexpr const char* kRedop = "redop";
constexpr const char* kTie = "tie";
constexpr const char* kCallCountDivergence = "call_count_divergence";
constexpr const char* kCaptured = "captured";  // the operation was captured into a CUDA graph
constexpr const char* kReplays = "replays";    // with captured: replays seen begin (a lower bound)
constexpr const char* kNcclEnv = "nccl_env";
constexpr const char* kAdvice = "advice";
constexpr const char* kConsequences = "consequences";
constexpr const char* kRanksSeen = "ranks_seen";
constexpr const char* kWorldSize = "world_size";
constexpr const char* kRanksWithoutDump = "ranks_without_dump";
constexpr const char* kEarlierDumps = "earlier_dumps";
constexpr const char* kLater = "later";
constexpr const char* kRank = "rank";
constexpr const char* kReason = "reason";
constexpr const char* kProblems = "problems";
constexpr const char* kProblem = "problem";
constexpr const char* kAttempts = "attempts";
constexpr const char* kAttempt = "attempt";
constexpr const char* kStartUnixNs = "start_unix_ns";
constexpr const char* kJobInstance = "job_instance";
constexpr const char* kFiles = "files";
constexpr const char* kNotes = "notes";
constexpr const char* kFormat = "format";
constexpr const char* kVersion = "version";
constexpr const char* kState = "state";
constexpr const char* kCommState = "comm_state";
constexpr const char* kKind = "kind";
constexpr const char* kFunction = "function";
constexpr const char* kLine = "line";
constexpr const char* kModule = "module";
constexpr const char* kOffset = "offset";
constexpr const char* kIp = "ip";
constexpr const char* kBuildId = "build_id";
constexpr const char* kModuleOffset = "module_offset";
constexpr const char* kLibrary = "library";
constexpr const char* kFindings = "findings";
constexpr const char* kRecoveredStalls = "recovered_stalls";
constexpr const char* kReportedBy = "reported_by";
constexpr const char* kStalledAfterS = "stalled_after_s";
constexpr const char* kRecoveredAfterS = "recovered_after_s";
constexpr const char* kWaitingFor = "waiting_for";
constexpr const char* kCulprit = "culprit";
constexpr const char* kText = "text";
constexpr const char* kCollectives = "collectives";
constexpr const char* kLastIn = "last_in";
constexpr const char* kLatenessMedianMs = "lateness_median_ms";
constexpr const char* kLatenessP90Ms = "lateness_p90_ms";
constexpr const char* kClockSpreadMs = "clock_spread_ms";
constexpr const char* kExitStatus = "exit_status";
constexpr const char* kAbortedFirst = "aborted_first";
constexpr const char* kException = "exception";
constexpr const char* kType = "type";
constexpr const char* kMessage = "message";
constexpr const char* kEndedRanks = "ended_ranks";        // extra_call: the ranks that ended normally
constexpr const char* kEndedAfterSeq = "ended_after_seq";  // extra_call: the last they completed
constexpr const char* kKilledRanks = "killed_ranks";      // job_killed, host_lost
constexpr const char* kKilledWithinMs = "killed_within_ms";
constexpr const char* kKilledHost = "killed_host";        // host_lost
constexpr const char* kP2pCalls = "p2p_calls";      // p2p_mismatch: the Send and the Recv, as each side called it
constexpr const char* kMismatch = "mismatch";       // p2p_mismatch: "size" or "datatype"
constexpr const char* kPeer = "peer";
constexpr const char* kP2pSeq = "p2p_seq";
constexpr const char* kGroup = "group";             // the ncclGroupStart/End group a call was issued in
constexpr const char* kGroupId = "id";
constexpr const char* kShape = "shape";             // "alltoall_like", "ring_exchange", "send_recv", "mixed"
constexpr const char* kPeers = "peers";
constexpr const char* kOps = "ops";
constexpr const char* kP2p = "p2p";
}  // namespace report_key

// The analysis output's own identity and version (analyze --json): bump on a change a reader
// could notice. 2: frames as objects, culprit states, attempts and notes.
constexpr const char* kReportFormatName = "ncclwatch-report";
constexpr int kReportVersion = 2;

}  // namespace analysis
}  // namespace ncclwatch
