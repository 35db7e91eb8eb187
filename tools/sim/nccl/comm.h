// Process-local state of the simulated NCCL: communicators, operations, stream batches.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "ncclwatch/cuda_abi.h"
#include "ncclwatch/nccl_abi.h"
#include "ncclwatch/trace_format.h"
#include "shm.h"

using OpKind = ncclwatch::trace::OpKind;

// The communicator behind ncclComm_t. Never freed: a handle stays valid (later calls on a
// destroyed or aborted communicator return an error instead of touching freed memory); the
// shared segment is unmapped when the last operation referencing it has finished.
struct ncclComm {
  int rank = -1;
  int nranks = 0;
  int index = -1;  // creation order in this process (fault injection's comm=I)
  int cudev = 0;
  uint64_t key = 0;  // names the segment; derived for split/shrink children
  std::string session;
  bool blocking = true;
  simnccl::Segment seg;

  std::atomic<int> init_state{ncclInProgress};  // ncclSuccess once every rank attached
  std::atomic<int> async_error{ncclSuccess};    // sticky error (fault "error")
  std::atomic<int> async_jobs{0};               // nonblocking work not yet done
  std::atomic<bool> stop{false};                // aborted or revoked: blocked work returns
  std::atomic<bool> closed{false};              // destroyed, aborted or revoked: no new ops
  std::atomic<bool> owner_released{false};
  std::atomic<int> refs{1};  // the owner + every launched batch op

  // Stream side: one batch at a time per communicator (as NCCL serializes a comm's kernels).
  std::mutex exec_mu;
  uint64_t exec_seq = 0;    // collectives executed (counted on the stream: graphs replay)
  uint64_t coll_round = 0;  // data-plane barrier rounds passed

  // Host side.
  std::atomic<uint64_t> call_seq{0};  // collectives called (ncclwatch's numbering)
  std::mutex host_mu;                 // split/shrink exchanges, user reduction ops
  uint64_t ctl_round = 0;
  uint64_t derive_counter = 0;        // splits and shrinks issued on this communicator
  std::vector<double> premul_scalars; // ncclRedOpCreatePreMulSum, id = 5 + index

  std::mutex life_mu;
  std::condition_variable life_cv;
  int inflight = 0;  // launched, not yet finished (ncclCommFinalize waits for 0)
};

namespace simnccl {

struct Op {
  OpKind kind = OpKind::AllReduce;
  ncclComm* comm = nullptr;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  int dtype = 0;
  int redop = -1;      // as the user passed it (compared across ranks)
  int reduce_code = 0; // what Reduce() computes
  double scalar = 1.0; // premulsum factor
  int root = -1;       // root, or peer for Send/Recv
};

// What one host function runs on one stream: the stream's share of one group (or one call).
struct Batch {
  CUstream stream = nullptr;
  std::vector<Op> ops;
  bool persistent = false;  // captured into a CUDA graph: runs at every replay, never freed
  int kernel_before_ms = 0; // fault "kernel": a slow "kernel" first / last (-1: forever)
  int kernel_after_ms = 0;
  ncclComm* kernel_comm = nullptr;
};

// Enqueues a batch on its stream (takes ownership). ncclUnhandledCudaError if the driver refuses.
ncclResult_t LaunchBatch(Batch* b);

// Wakes every waiter of this communicator in this process (abort, revoke).
void WakeAll(ncclComm* c);
// Blocks until c->stop (used to hang "forever" in an abortable way).
void WaitUntilStopped(ncclComm* c);
// Sleeps ms milliseconds (-1: forever) unless c->stop is set first.
void SleepUnlessStopped(ncclComm* c, int ms);
// Drops one reference; the last one unmaps the segment.
void Unref(ncclComm* c);

int GlobalRank();
bool LogEnabled();
void Log(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace simnccl
