// Synthetic jobs for `ncclwatch-gen`: a topology (world, tensor-parallel groups, data-parallel
// groups), a common training history, and per-rank plans for each hang scenario.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ncclwatch/trace_format.h"
#include "report/vocabulary.h"

namespace ncclwatch {
namespace gen {

enum class CommKind { kWorld, kTp, kDp };

// World of `ranks`; with tp > 1 also TP groups of `tp` consecutive ranks and DP groups of the
// ranks with the same position in their TP group (Megatron layout).
struct Topology {
  int ranks = 8;
  int tp = 1;

  bool HasSubComms() const { return tp > 1 && tp < ranks && ranks % tp == 0; }
  int CommSize(CommKind k) const;
  int CommRank(CommKind k, int rank) const;
  int GroupIndex(CommKind k, int rank) const;  // which TP/DP group; 0 for the world
  std::string CommId(CommKind k, int rank) const;  // 16 hex digits, equal on every member
  std::string CommName(CommKind k, int rank) const;
  int GlobalRank(CommKind k, int group, int comm_rank) const;
  std::vector<CommKind> Kinds() const;
};

// Where a rank's operation got to when it dumped.
enum class Stage { kCompleted, kGpuReached, kEnqueued };

// Python + native stacks a rank's main thread shows at dump time.
enum class StackKind {
  kWaitingSync,     // blocked on the GPU after issuing its collectives (the normal waiter)
  kCheckpoint,      // writing model.safetensors on one rank
  kItemSync,        // loss.item(): host waits for a stream stuck on earlier work
  kCrash,           // segfault in a custom extension
  kPipelineSend,    // blocking send in a pipeline schedule
  kGenerateGather,  // ZeRO-3 generation: one more parameter all-gather
  kGenerateSync,    // ZeRO-3 generation: waiting for the all-reduce of "finished" flags
  kIdle,            // between steps
};

struct Operation {
  CommKind comm = CommKind::kWorld;
  trace::OpKind op = trace::OpKind::AllReduce;
  int64_t count = 1;
  int dtype = 7;   // float32
  int redop = -1;  // -1: none
  int root = -1;
  int peer = -1;   // Send/Recv: communicator rank of the peer
  int callsite = 0;
};

struct ExtraOp {
  Operation op;
  Stage stage = Stage::kGpuReached;
  int64_t group = 0;  // the rank's ncclGroupStart/End group it was issued in; 0: none
};

struct RankPlan {
  bool write = true;   // false: the rank leaves no dump (killed)
  bool fatal = false;  // writes a fatal_signal dump
  bool exited = false;      // left normally after the history: writes its exit record
  bool nccl_error = false;  // its last extra operation returned ncclSystemError: nccl_error dump
  bool stopped = false;     // stopped (SIGSTOP): its host's stand-in, a `stopped` dump from its black box
  // SIGKILLed without a word: its black box's `postmortem` dump (written by its host's caretaker),
  // its last sign of life `killed_at_ms` after its last operation's issue.
  bool killed = false;
  int killed_at_ms = 200;
  bool in_setup = false;    // inside ncclCommInitRank of the world: no history, comm initializing
  bool first_to_stall = false;
  StackKind stack = StackKind::kWaitingSync;
  std::vector<ExtraOp> extras;  // after the common history, in issue order
};

// The per-step collectives of the common history.
std::vector<Operation> StepOperations(const Topology& topo);

// What a correct analysis of the scenario says, known from how it was built: a root verdict's
// cause, its culprit ranks (sorted) and the operation it is about, as the communicators whose
// next operation after the common history it may name (p2p: the first send, p2p_seq 1).
struct ExpectedVerdict {
  analysis::Cause cause = analysis::Cause::NoHang;
  std::vector<int> culprits;
  std::vector<CommKind> comms;
  bool p2p = false;
};

// Builds the plans of every rank for a scenario: the cause names of report/vocabulary.h, plus
// "mixed" (two independent root causes blocking the world communicator). False with *error
// when the scenario needs a topology it does not have.
bool BuildScenario(const std::string& name, const Topology& topo, int culprit, bool fatal,
                   std::vector<RankPlan>* plans, std::vector<ExpectedVerdict>* truth, std::string* error);

std::vector<std::string> ScenarioNames();

}  // namespace gen
}  // namespace ncclwatch
