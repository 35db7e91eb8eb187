// Fault injection: NCCLWATCH_SIM_FAULT="<kind>:rank=R,seq=N[,comm=I][,ms=M][,signal=KILL|SEGV]"
// (several separated by ';'). See docs/simulator.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace simnccl {

enum class FaultKind { kStall, kDelay, kKernel, kCrash, kAbort, kError };

struct Fault {
  FaultKind kind = FaultKind::kStall;
  int rank = -1;      // global rank (RANK, else the rank in the process's first communicator)
  uint64_t seq = 0;   // collective sequence number on the communicator, from 1
  int comm = -1;      // creation index of the communicator in that process; -1: any
  int ms = -1;        // delay/kernel duration; -1: forever
  int signal = 9;     // crash: SIGKILL or SIGSEGV
};

// Parses a specification. False with `err` (one line) on any syntax error.
bool ParseFaults(const char* spec, std::vector<Fault>* out, std::string* err);

// The faults of this process, parsed once from the environment. On invalid syntax one line
// goes to stderr and no fault is active.
const std::vector<Fault>& ActiveFaults();

// The first active fault of `kind` for this rank, communicator index and sequence number.
const Fault* FindFault(FaultKind kind, int global_rank, int comm_index, uint64_t seq);

}  // namespace simnccl
