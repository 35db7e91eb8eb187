// All that the interception hooks (lib/intercept) may ask of the running library, as heaptrack's
// preload asks libheaptrack.h: a thread attached, a call's communicator, a batch of operations
// launched (numbered, recorded in the ring, put between GPU markers, handed to the watchdog) or
// failed, a non-blocking launch settled, and a communicator's life. The hooks see nothing else.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "blackbox/black_box.h"
#include "common/config.h"
#include "common/process_info.h"
#include "dump/dump_policy.h"
#include "gpu/markers.h"
#include "ncclwatch/nccl_abi.h"
#include "record/comm_registry.h"
#include "record/flight_ring.h"
#include "record/op_record.h"
#include "record/thread_registry.h"
#include "watchdog/nonblocking.h"
#include "watchdog/watchdog.h"

namespace ncclwatch {

// A non-owning callable: how the wrappers pass "call the real function" down.
class RealCall {
 public:
  template <typename F>
  explicit RealCall(F& f) : obj_(&f), fn_([](void* o) { return (*static_cast<F*>(o))(); }) {}
  ncclResult_t operator()() const { return fn_(obj_); }

 private:
  void* obj_;
  ncclResult_t (*fn_)(void*);
};

class Recorder {
 public:
  // The runtime's pieces, owned by it; `markers` and `box` may be null (off).
  struct Parts {
    const Config* config = nullptr;
    const ProcessIdentity* identity = nullptr;
    ProcessRank* rank = nullptr;
    FlightRing* ring = nullptr;
    GpuMarkers* markers = nullptr;
    Watchdog* watchdog = nullptr;
    CommRegistry* comms = nullptr;
    ThreadRegistry* threads = nullptr;
    DumpPolicy* policy = nullptr;
    PendingLaunches* pending = nullptr;
    blackbox::BlackBox* box = nullptr;
  };
  explicit Recorder(Parts parts) : p_(parts) {}

  // A thread's registry slot, claimed at its first NCCL call and given back when it ends.
  ThreadSlot* AttachThread(int32_t tid) { return p_.threads->Claim(tid); }
  void DetachThread(ThreadSlot* slot) { p_.threads->Release(slot); }
  // How many frames a call site keeps; 0 when call sites are off (NCCLWATCH_CALLSITES=0).
  int callsite_depth() const { return p_.config->callsites ? static_cast<int>(p_.config->callsite_depth) : 0; }

  // The communicator of a call, adopted when it was created behind our back (through
  // pncclCommInitRank, say): its id is then local to this process. Null for a null handle.
  CommInfo* Communicator(const void* handle);
  // The communicator if ncclwatch knows it (null otherwise): for calls that end one.
  CommInfo* Known(const void* handle) { return p_.comms->Lookup(handle); }

  // Operations: one call, or a group's at its outermost ncclGroupEnd (a batch). Numbers them,
  // records them, calls `real` between a start and an end marker per stream, and hands them to
  // the watchdog; a failed call marks them failed and dumps. `now`: a single call's enqueue time.
  ncclResult_t Launch(ThreadSlot* slot, GroupedOp* ops, int n, const char* function, uint64_t now, RealCall real);
  // An operation beyond a group's buffer: numbered and recorded, never followed.
  void RecordUnfollowed(GroupedOp* g);
  // An NCCL call failed outside a launch (a call inside a group, a communicator's creation) or
  // ncclCommGetAsyncError reported an error (`async`).
  void Failed(const char* function, ncclResult_t r, const CommInfo* comm, bool async = false);
  // ncclCommGetAsyncError on a non-blocking communicator: operations that returned
  // ncclInProgress are followed from the moment NCCL reports them launched.
  void Settle(CommInfo* comm, ncclResult_t async_state) { p_.pending->Settle(comm, async_state); }

  // Communicators' life. Registers a created one and, the first time, learns the global rank.
  CommInfo* AddCommunicator(std::unique_ptr<CommInfo> info);
  // ncclCommAbort, before it is forwarded: the communicator is aborted; one dump per burst.
  void Aborted(CommInfo* comm);
  // A communicator being created (ncclCommInitRank*): shown as `initializing` in dumps until
  // EndInit, and a stall when it takes longer than the default deadline (a setup hang).
  uint64_t BeginInit(const char* function, uint64_t id, int size, int rank);
  void EndInit(uint64_t token);

 private:
  Parts p_;
  std::mutex naming_mu_;  // the process's rank from its communicators (AddCommunicator)
  uint64_t named_by_ = 0;  // the communicator that named it
};

}  // namespace ncclwatch
