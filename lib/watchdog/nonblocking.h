// Launches of non-blocking communicators (ncclInProgress) that NCCL has not confirmed yet: their
// operations wait here with their start markers until ncclCommGetAsyncError says they were
// launched (then the end marker goes in and the watchdog follows them) or failed.
#pragma once

#include <mutex>
#include <vector>

#include "gpu/markers.h"
#include "ncclwatch/nccl_abi.h"
#include "record/comm_registry.h"
#include "record/flight_ring.h"
#include "record/op_record.h"
#include "watchdog/watchdog.h"

namespace ncclwatch {

class PendingLaunches {
 public:
  PendingLaunches(FlightRing* ring, GpuMarkers* markers, Watchdog* watchdog)
      : ring_(ring), markers_(markers), watchdog_(watchdog) {}

  // A batch returned ncclInProgress: `marker_of[i]` is the start marker of ops[i] (null: not
  // followed).
  void Defer(const GroupedOp* ops, Marker* const* marker_of, int n);
  // ncclCommGetAsyncError reported `async_state` for `comm`: its waiting launches are ended
  // (ncclSuccess: followed from now on; an error: marked failed). ncclInProgress: still waiting.
  void Settle(const CommInfo* comm, ncclResult_t async_state);

 private:
  struct Launch {
    const CommInfo* comm;
    Marker* marker;
    CUstream stream;
    std::vector<InflightItem> items;
  };
  FlightRing* ring_;
  GpuMarkers* markers_;
  Watchdog* watchdog_;
  std::mutex mu_;
  std::vector<Launch> waiting_;  // under mu_
};

}  // namespace ncclwatch
