// A process that drives several ranks (several devices: nccl-tests -g N, JAX's one process per
// host, ncclCommInitAll): its dump split into one dump per rank, so that everything after the
// dump set sees ranks, never processes. Each rank's share: the communicators on its device, the
// operations it issued on them (an operation's comm_rank), its own sequence numbers; the
// process's threads, call sites and environment are shared by its ranks.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/dump.h"

namespace ncclwatch {
namespace analysis {

// Of a dump whose process drives several ranks: one of them.
struct RankShare {
  int global_rank = -1;
  int64_t device = -1;
  // (communicator id, this rank's rank in it): its communicators.
  std::vector<std::pair<std::string, int>> comms;
  // Every global rank the process drives, ascending (this one among them).
  std::vector<int> process_ranks;
  // The summary's rank as its process wrote it (its launcher's RANK: often the process's index).
  int process_rank = -1;
  bool Holds(const std::string& comm, int64_t comm_rank) const;
  // Whether an operation is this rank's: its communicator and, where written, its rank in it.
  bool Owns(const trace::Op& op) const;
};

// The dump as one dump per rank when its process drives several (its summary holds a
// communicator id as two ranks, with each communicator's device), else {d} as it is. A detail
// already read is cut to each rank's share.
std::vector<Dump> SplitByRank(Dump d);

// A full read of a split dump cut to its rank's share (the same file read again for a detail).
std::shared_ptr<const trace::Detail> ShareOf(const RankShare& share, std::shared_ptr<const trace::Detail> detail);

}  // namespace analysis
}  // namespace ncclwatch
