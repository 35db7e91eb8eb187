#include "dump_renderer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

#include "common/config.h"
#include "format/display.h"
#include "format/file_name.h"
#include "format/trace_writer.h"
#include "ncclwatch/version.h"

namespace ncclwatch {
namespace gen {

using trace::OpKind;
using trace::OpState;

namespace {

constexpr int kRanksPerHost = 8;
constexpr int64_t kPidBase = 200000;
constexpr int64_t kOpSpacingNs = 50 * 1000000LL;
constexpr int64_t kUnixBaseNs = 1732200000LL * 1000000000LL;
constexpr const char* kStream = "0x7f3b5c001000";
constexpr int kNcclVersion = 22809;

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// --- stacks ------------------------------------------------------------------------------------

struct Py {
  const char* file;
  int line;
  const char* function;
  bool library;
};
struct Native {
  const char* module;
  const char* symbol;
  int offset;
};
struct StackDef {
  std::vector<Py> python;  // innermost first
  std::vector<Native> native;
};

const char* const kPython = "/usr/bin/python3.11";
const char* const kLibc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
const char* const kTorchCuda = "/opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so";
const char* const kTorchPython = "/opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_python.so";
const char* const kCudart = "/usr/local/cuda/lib64/libcudart.so.12";
const char* const kCuda = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";
const char* const kWatch = "/opt/ncclwatch/lib/libncclwatch.so";

const std::vector<Native> kInterpreterTail = {
    {kPython, "_PyEval_EvalFrameDefault", 0x2b1c},
    {kPython, "PyEval_EvalCode", 0x97},
    {kPython, "Py_RunMain", 0x1a4},
    {kLibc, "__libc_start_call_main", 0x7a},
};

const std::vector<Py> kTrainMain = {
    {"/workspace/job/train.py", 241, "train", false},
    {"/workspace/job/train.py", 302, "main", false},
    {"/workspace/job/train.py", 310, "<module>", false},
};

const std::vector<Py> kGenerateMain = {
    {"/workspace/job/generate.py", 97, "generate", false},
    {"/usr/lib/python3.11/contextlib.py", 81, "inner", true},
    {"/workspace/job/generate.py", 140, "main", false},
    {"/workspace/job/generate.py", 151, "<module>", false},
};

StackDef Join(std::vector<Py> inner, const std::vector<Py>& outer, std::vector<Native> native) {
  inner.insert(inner.end(), outer.begin(), outer.end());
  native.insert(native.end(), kInterpreterTail.begin(), kInterpreterTail.end());
  return {inner, native};
}

StackDef MainThreadStack(StackKind k) {
  switch (k) {
    case StackKind::kCheckpoint:
      return Join({{"/opt/venv/lib/python3.11/site-packages/safetensors/torch.py", 286, "save_file", false},
                   {"/workspace/job/checkpoint.py", 57, "save_checkpoint", false},
                   {"/workspace/job/train.py", 231, "train", false}},
                  {kTrainMain.begin() + 1, kTrainMain.end()},
                  {{kLibc, "__write", 0x4f},
                   {"/opt/venv/lib/python3.11/site-packages/safetensors/_safetensors_rust.abi3.so",
                    "safetensors_rust::serialize_to_file", 0x2e1}});
    case StackKind::kItemSync:
      return Join({{"/workspace/job/train.py", 192, "train_step", false}}, kTrainMain,
                  {{kCuda, "cuStreamSynchronize", 0x1d3},
                   {kCudart, "cudaMemcpyAsync", 0x16a},
                   {kTorchCuda, "at::native::_local_scalar_dense_cuda", 0x2f0},
                   {kTorchPython, "THPVariable_item", 0x8c}});
    case StackKind::kCrash:
      return Join({{"/workspace/job/kernels/fused_attention.py", 88, "forward", false},
                   {"/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", 1562, "_call_impl", true},
                   {"/workspace/job/model.py", 141, "forward", false},
                   {"/workspace/job/train.py", 180, "train_step", false}},
                  kTrainMain,
                  {{kWatch, "ncclwatch::OnFatalSignal", 0x61},
                   {kLibc, "__restore_rt", 0x0},
                   {"/workspace/job/kernels/libfused_attention.so", "fused_attention_fwd_launch", 0x144}});
    case StackKind::kPipelineSend:
      return Join({{"/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2012, "send", true},
                   {"/workspace/job/pipeline.py", 77, "send_forward", false},
                   {"/workspace/job/pipeline.py", 140, "forward_backward_step", false},
                   {"/workspace/job/train.py", 185, "train_step", false}},
                  kTrainMain,
                  {{kCuda, "cuStreamSynchronize", 0x1d3},
                   {kTorchCuda, "c10d::ProcessGroupNCCL::WorkNCCL::synchronizeStream", 0x7e},
                   {kTorchCuda, "c10d::ProcessGroupNCCL::WorkNCCL::wait", 0x31}});
    case StackKind::kGenerateGather:
      return Join({{"/opt/venv/lib/python3.11/site-packages/deepspeed/runtime/zero/partition_parameters.py", 1180, "_all_gather", true},
                   {"/opt/venv/lib/python3.11/site-packages/deepspeed/runtime/zero/parameter_offload.py", 300, "pre_sub_module_forward_function", true},
                   {"/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", 1562, "_call_impl", true},
                   {"/workspace/job/generate.py", 64, "generate_step", false}},
                  kGenerateMain,
                  {{kCuda, "cuStreamSynchronize", 0x1d3}, {kTorchCuda, "c10d::ProcessGroupNCCL::WorkNCCL::wait", 0x31}});
    case StackKind::kGenerateSync:
      return Join({{"/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", 2501, "all_reduce", true},
                   {"/workspace/job/generate.py", 71, "all_finished", false}},
                  kGenerateMain,
                  {{kCuda, "cuStreamSynchronize", 0x1d3}, {kTorchCuda, "c10d::ProcessGroupNCCL::WorkNCCL::wait", 0x31}});
    case StackKind::kIdle:
      return Join({{"/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", 1295, "_next_data", true},
                   {"/workspace/job/train.py", 176, "train", false}},
                  {kTrainMain.begin() + 1, kTrainMain.end()},
                  {{kLibc, "__futex_abstimed_wait_common", 0x3c}, {kLibc, "sem_timedwait", 0x2a}});
    case StackKind::kWaitingSync:
    default:
      return Join({{"/opt/venv/lib/python3.11/site-packages/torch/cuda/__init__.py", 954, "synchronize", true},
                   {"/workspace/job/train.py", 188, "train_step", false}},
                  kTrainMain,
                  {{kCuda, "cuCtxSynchronize", 0x112},
                   {kCudart, "cudaDeviceSynchronize", 0x5b},
                   {kTorchCuda, "c10::cuda::device_synchronize", 0x2c},
                   {kTorchPython, "THCPModule_cudaSynchronize", 0x3d}});
  }
}

struct ThreadDef {
  int tid_offset;
  const char* name;
  StackDef stack;
};

const std::vector<ThreadDef>& HelperThreads() {
  static const std::vector<ThreadDef> threads = {
      {1, "pt_nccl_watchdg",
       {{},
        {{kLibc, "clock_nanosleep", 0x6b},
         {kTorchCuda, "c10d::ProcessGroupNCCL::watchdogHandler", 0x9a1},
         {kTorchCuda, "c10d::ProcessGroupNCCL::ncclCommWatchdog", 0x5f},
         {kLibc, "start_thread", 0x2f3}}}},
      {2, "ncclwatch",
       {{},
        {{kLibc, "__poll", 0x4e},
         {kWatch, "ncclwatch::Watchdog::Run", 0x21c},
         {kLibc, "start_thread", 0x2f3}}}},
      {3, "pt_autograd_0",
       {{},
        {{kLibc, "pthread_cond_wait", 0x20c},
         {"/opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so", "torch::autograd::Engine::thread_main", 0x1b0},
         {kLibc, "start_thread", 0x2f3}}}},
      {4, "python3",
       {{{"/usr/lib/python3.11/threading.py", 327, "wait", true},
         {"/usr/lib/python3.11/queue.py", 180, "get", true},
         {"/opt/venv/lib/python3.11/site-packages/torch/utils/data/_utils/pin_memory.py", 52, "_pin_memory_loop", true},
         {"/usr/lib/python3.11/threading.py", 982, "run", true}},
        {{kLibc, "__futex_abstimed_wait_common", 0x3c}, {kLibc, "sem_timedwait", 0x2a}, {kLibc, "start_thread", 0x2f3}}}},
  };
  return threads;
}

// Call sites, indexed as scenario.cpp's Callsite enum.
std::vector<StackDef> CallsiteStacks() {
  const char* c10d = "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py";
  auto native = [](const char* nccl_fn, const char* torch_fn) {
    return std::vector<Native>{{kWatch, nccl_fn, 0x3c}, {kTorchCuda, torch_fn, 0x2a1}};
  };
  return {
      Join({{c10d, 3355, "all_gather_into_tensor", true},
            {"/workspace/job/megatron/tensor_parallel/mappings.py", 214, "_gather_along_first_dim", false},
            {"/workspace/job/model.py", 120, "forward", false},
            {"/workspace/job/train.py", 182, "train_step", false}},
           kTrainMain, native("ncclAllGather", "c10d::ProcessGroupNCCL::_allgather_base")),
      Join({{c10d, 3822, "reduce_scatter_tensor", true},
            {"/workspace/job/megatron/tensor_parallel/mappings.py", 236, "_reduce_scatter_along_first_dim", false},
            {"/workspace/job/model.py", 126, "forward", false},
            {"/workspace/job/train.py", 182, "train_step", false}},
           kTrainMain, native("ncclReduceScatter", "c10d::ProcessGroupNCCL::_reduce_scatter_base")),
      Join({{"/opt/venv/lib/python3.11/site-packages/torch/nn/parallel/distributed.py", 1472, "_sync_buffers", true},
            {"/workspace/job/train.py", 186, "train_step", false}},
           kTrainMain, native("ncclAllReduce", "c10d::ProcessGroupNCCL::allreduce")),
      Join({{c10d, 2501, "all_reduce", true}, {"/workspace/job/train.py", 196, "log_metrics", false},
            {"/workspace/job/train.py", 238, "train", false}},
           {kTrainMain.begin() + 1, kTrainMain.end()}, native("ncclAllReduce", "c10d::ProcessGroupNCCL::allreduce")),
      Join({{c10d, 2012, "send", true}, {"/workspace/job/pipeline.py", 77, "send_forward", false},
            {"/workspace/job/pipeline.py", 140, "forward_backward_step", false}},
           kTrainMain, native("ncclSend", "c10d::ProcessGroupNCCL::send")),
      Join({{c10d, 3355, "all_gather_into_tensor", true},
            {"/opt/venv/lib/python3.11/site-packages/deepspeed/runtime/zero/partition_parameters.py", 1180, "_all_gather", true},
            {"/workspace/job/generate.py", 64, "generate_step", false}},
           kGenerateMain, native("ncclAllGather", "c10d::ProcessGroupNCCL::_allgather_base")),
      Join({{c10d, 2501, "all_reduce", true}, {"/workspace/job/generate.py", 71, "all_finished", false}},
           kGenerateMain, native("ncclAllReduce", "c10d::ProcessGroupNCCL::allreduce")),
      Join({{c10d, 2501, "all_reduce", true}, {"/workspace/job/train.py", 251, "report_final_metrics", false},
            {"/workspace/job/train.py", 262, "main", false}},
           {kTrainMain.begin() + 1, kTrainMain.end()}, native("ncclAllReduce", "c10d::ProcessGroupNCCL::allreduce")),
  };
}


std::string HostOf(int rank) {
  char b[32];
  std::snprintf(b, sizeof b, "node%04d", rank / kRanksPerHost);
  return b;
}

// Addresses that look like a process's: one base and one build id (20 bytes, as GNU ld's
// sha1) per module, one offset per symbol.
trace::Stack ToStack(const StackDef& s) {
  trace::Stack out;
  for (const auto& f : s.native) {
    const uint64_t module_hash = Mix(std::hash<std::string>()(f.module));
    uint64_t base = 0x7f0000000000ULL + (module_hash & 0xffffff000ULL);
    uint64_t ip = base + (Mix(std::hash<std::string>()(f.symbol)) & 0xffff0ULL) + static_cast<uint64_t>(f.offset);
    char build_id[41];
    std::snprintf(build_id, sizeof build_id, "%016llx%016llx%08x", static_cast<unsigned long long>(module_hash),
                  static_cast<unsigned long long>(Mix(module_hash)), static_cast<unsigned>(Mix(module_hash + 1)));
    out.native.push_back({ip, f.module, f.symbol, static_cast<uint64_t>(f.offset), build_id, ip - base});
  }
  for (const auto& f : s.python) out.python.push_back({f.file, f.line, f.function, f.library});
  return out;
}

// A thread's stack as the library captures it: a signalled thread's first frame is the
// instruction it was interrupted at (the dumping thread, ncclwatch's own, is not signalled).
trace::Stack SignalledThreadStack(const StackDef& s) {
  trace::Stack out = ToStack(s);
  if (!out.native.empty()) out.native.front().interrupted = true;
  return out;
}

trace::Op OpOf(const Operation& o, const std::string& comm, int comm_size) {
  trace::Op r;
  r.comm = comm;
  r.SetKind(o.op);
  r.count = o.count;
  r.dtype = trace::DatatypeName(o.dtype);
  r.bytes = static_cast<int64_t>(trace::OperationBytes(o.op, static_cast<uint64_t>(o.count), o.dtype, comm_size));
  if (const char* redop = trace::RedOpName(o.redop)) r.redop = redop;
  r.root = o.root;
  r.peer = o.peer;
  r.stream = kStream;
  r.result = 0;
  return r;
}

// The settings a job run with NCCLWATCH_RING=<ring> and NCCLWATCH_TIMEOUT=600 writes: the
// library's own description of its configuration, so names and values match real dumps.
thread_local std::string t_ring_text;  // ParseConfig takes a plain function

trace::KeyValues ConfigOf(int ring) {
  t_ring_text = std::to_string(ring);
  ConfigResult parsed = ParseConfig([](const char* name) -> const char* {
    if (std::strcmp(name, "NCCLWATCH_RING") == 0) return t_ring_text.c_str();
    if (std::strcmp(name, "NCCLWATCH_TIMEOUT") == 0) return "600";
    return nullptr;
  });
  return DescribeConfig(parsed.config);
}

int KindIndex(CommKind k) { return static_cast<int>(k); }

struct CommCounters {
  int64_t enqueued = 0, reached = 0, completed = 0;
  std::map<int, std::array<int64_t, 4>> p2p;  // peer -> send enq/done, recv enq/done
};

}  // namespace

DumpRenderer::DumpRenderer(const Topology& topo, int ring_capacity, uint64_t seed,
                           const std::vector<int>& callsites, bool lean)
    : topo_(topo), capacity_(std::max(1, ring_capacity)), seed_(seed), step_(StepOperations(topo)), lean_(lean) {
  auto stacks = CallsiteStacks();
  callsite_index_.assign(stacks.size(), -1);
  for (int c : callsites)
    if (c >= 0 && static_cast<size_t>(c) < stacks.size() && callsite_index_[c] < 0) {
      callsite_index_[c] = static_cast<int>(callsites_.size());
      callsites_.push_back({static_cast<int64_t>(callsites_.size()), ToStack(stacks[c]), "", ""});
    }
  // Enough whole steps that the ring is full and has overflowed.
  int64_t steps = (capacity_ + 8) / static_cast<int64_t>(step_.size()) + 2;
  history_ops_ = steps * static_cast<int64_t>(step_.size());
  base_seq_.assign(3, 0);
  for (const auto& op : step_) base_seq_[KindIndex(op.comm)] += steps;
  BuildHistory();
}

void DumpRenderer::BuildHistory() {
  int64_t first = std::max<int64_t>(0, history_ops_ - capacity_);
  std::vector<int64_t> seq(3, 0);
  int64_t per_step = static_cast<int64_t>(step_.size());
  for (int64_t i = 0; i < first; ++i) ++seq[KindIndex(step_[i % per_step].comm)];
  history_.reserve(static_cast<size_t>(history_ops_ - first));
  for (int64_t i = first; i < history_ops_; ++i) {
    const Operation& op = step_[i % per_step];
    trace::Op t = OpOf(op, topo_.CommId(CommKind::kWorld, 0), topo_.CommSize(op.comm));
    t.seq = ++seq[KindIndex(op.comm)];
    t.callsite = op.callsite >= 0 && static_cast<size_t>(op.callsite) < callsite_index_.size()
                     ? callsite_index_[op.callsite]
                     : -1;
    t.enqueue_ns = kMonoBaseNs + i * kOpSpacingNs;
    t.gpu_reached_ns = t.enqueue_ns + 1000000;
    t.completed_ns = t.enqueue_ns + 20000000;
    t.state = trace::OpStateValue::Of(OpState::Completed);
    history_.push_back(std::move(t));
    history_comm_.push_back(op.comm);
  }
}

void DumpRenderer::PatchHistory(int rank) {
  if (patched_rank_ == rank) return;
  patched_rank_ = rank;
  std::string ids[3];
  for (auto k : topo_.Kinds()) ids[KindIndex(k)] = topo_.CommId(k, rank);
  for (size_t i = 0; i < history_.size(); ++i) {
    history_[i].comm = ids[KindIndex(history_comm_[i])];
    history_[i].tid = kPidBase + rank;
  }
}

trace::Document DumpRenderer::Render(int rank, const RankPlan& plan, const DumpOptions& options,
                                     RingWindow* window) {
  const auto& extras = options.earlier ? std::vector<ExtraOp>{} : plan.extras;
  const int64_t pid = kPidBase + rank;
  const int64_t history_end_ns = kMonoBaseNs + history_ops_ * kOpSpacingNs;
  int64_t mono_now_ns;
  if (options.earlier) {
    mono_now_ns = history_end_ns + 50000000LL;  // right after the history, before the hang
  } else if (plan.killed) {  // its last sign of life: killed soon after its last issue
    mono_now_ns = history_end_ns + static_cast<int64_t>(extras.size()) * 100000000LL +
                  static_cast<int64_t>(plan.killed_at_ms) * 1000000LL;
  } else {
    // The first waiter dumps when its deadline passes; the others follow seconds later.
    int64_t jitter_ms = plan.first_to_stall ? 0 : static_cast<int64_t>(Mix(seed_ ^ (rank + 1)) % 4000);
    mono_now_ns = history_end_ns + 100000000LL + static_cast<int64_t>(kDeadlineS * 1e9) + 1000000LL +
                  jitter_ms * 1000000LL;
  }
  // Wall clocks differ between hosts by up to +-3 s.
  int64_t host_skew_ms = static_cast<int64_t>(Mix(seed_ * 31 + rank / kRanksPerHost) % 6001) - 3000;

  // Sequence state and the extra ops with their numbers.
  std::vector<CommCounters> counters(3);
  for (auto k : topo_.Kinds()) {
    auto& c = counters[KindIndex(k)];
    c.enqueued = c.reached = c.completed = base_seq_[KindIndex(k)];
  }
  std::vector<trace::Op> extra_ops;
  for (size_t j = 0; j < extras.size(); ++j) {
    const ExtraOp& e = extras[j];
    auto& c = counters[KindIndex(e.op.comm)];
    trace::Op x = OpOf(e.op, topo_.CommId(e.op.comm, rank), topo_.CommSize(e.op.comm));
    x.callsite = e.op.callsite >= 0 && static_cast<size_t>(e.op.callsite) < callsite_index_.size()
                     ? callsite_index_[e.op.callsite]
                     : -1;
    x.tid = pid;
    x.group = e.group;
    x.enqueue_ns = history_end_ns + static_cast<int64_t>(j + 1) * 100000000LL;
    bool reached = e.stage != Stage::kEnqueued, done = e.stage == Stage::kCompleted;
    x.gpu_reached_ns = reached ? x.enqueue_ns + 1000000 : 0;
    x.completed_ns = done ? x.enqueue_ns + 20000000 : 0;
    x.state = trace::OpStateValue::Of(done ? OpState::Completed : reached ? OpState::GpuReached : OpState::Enqueued);
    if (plan.nccl_error && j + 1 == extras.size()) {  // the call that returned the error
      x.state = trace::OpStateValue::Of(OpState::Error);
      x.result = 2;  // ncclSystemError
    }
    if (trace::IsPointToPoint(e.op.op)) {
      auto& p = c.p2p[e.op.peer];
      int dir = e.op.op == OpKind::Send ? 0 : 2;
      x.p2p_seq = ++p[dir];
      if (done) ++p[dir + 1];
    } else {
      x.seq = ++c.enqueued;
      if (reached) ++c.reached;
      if (done) ++c.completed;
    }
    extra_ops.push_back(std::move(x));
  }

  trace::Document doc;
  trace::Summary& s = doc.summary;
  s.rank = rank;
  s.local_rank = rank % kRanksPerHost;
  s.world_size = topo_.ranks;
  s.host = HostOf(rank);
  s.pid = pid;
  s.dump_seq = options.dump_seq;
  const int origin = options.origin_rank;
  using R = trace::DumpReason;
  R reason = options.earlier ? R::OnDemand
             : plan.fatal    ? R::FatalSignal
             : plan.stopped  ? R::Stopped
             : plan.killed   ? R::Postmortem
             : plan.exited   ? R::Exit
             : plan.nccl_error ? R::NcclError
             : plan.first_to_stall ? R::Stall
             : origin >= 0         ? R::PeerRequest
                                   : R::OnDemand;
  s.reason = trace::DumpReasonValue::Of(reason);
  for (const auto& x : extra_ops) {
    if (x.state.Is(OpState::Completed) || x.state.Is(OpState::Error)) continue;
    trace::Op in_flight = x;
    in_flight.age_s = static_cast<double>(mono_now_ns - x.enqueue_ns) / 1e9;
    in_flight.deadline_s = kDeadlineS;
    s.in_flight.push_back(std::move(in_flight));
  }
  const trace::Op* oldest = s.in_flight.empty() ? nullptr : &s.in_flight.front();
  if (reason == R::Stall && plan.in_setup) {
    s.detail = "ncclCommInitRank blocked for " + std::to_string(static_cast<int>(kDeadlineS)) + ".0 s on comm " +
               topo_.CommId(CommKind::kWorld, rank) + " (rank " + std::to_string(rank) + " of " +
               std::to_string(topo_.ranks) + ")";
  } else if (reason == R::Stall && oldest) {
    char b[160];
    std::snprintf(b, sizeof b, "%s seq %lld on comm %s passed its %.1f s deadline", oldest->OpName(),
                  static_cast<long long>(oldest->seq), oldest->comm.c_str(), kDeadlineS);
    s.detail = b;
    s.stalled = *oldest;
  } else if (reason == R::FatalSignal) {
    s.detail = "signal SIGSEGV (Segmentation fault)";
  } else if (reason == R::Stopped) {  // as of its last sign of life, before its host saw it stopped
    s.detail = trace::StopKindText(trace::StopKind::Stopped) + ", seen by its host; what its black box held at its last sign of life";
    const int64_t seen = kUnixBaseNs + host_skew_ms * 1000000LL + (mono_now_ns - kMonoBaseNs) + 1000000000LL;
    s.stopped = trace::StopRecord{trace::StopKindName(trace::StopKind::Stopped), seen, seen + 3000000000LL};
  } else if (reason == R::Postmortem) {  // its black box, read by its host's caretaker
    s.detail = "ended without a word: SIGKILL or the OOM killer";
    s.states_as_of_mono_ns = mono_now_ns - 40000000LL;  // the watchdog's last poll
  } else if (reason == R::Exit) {
    s.detail = "exit status 0";
    s.exit_status = 0;
  } else if (reason == R::NcclError && !extra_ops.empty()) {
    const trace::Op& f = extra_ops.back();
    s.failed = f;
    s.error_result = 2;
    s.detail = std::string("nccl") + f.OpName() + " returned 2 (unhandled system error) on comm " + f.comm;
  } else if (reason == R::PeerRequest) {
    s.detail = "rank " + std::to_string(origin) + " on " + HostOf(origin) + " dumped (stall)";
    s.answered = trace::AnsweredRequest{HostOf(origin) + "-" + std::to_string(kPidBase + origin) + "-0", origin,
                               HostOf(origin), trace::DumpReasonName(R::Stall)};
  } else {
    s.detail = "signal SIGUSR2 (User defined signal 2)";
  }
  s.time_mono_ns = mono_now_ns;
  s.time_unix_ns = kUnixBaseNs + host_skew_ms * 1000000LL + (mono_now_ns - kMonoBaseNs);
  s.start_mono_ns = kMonoBaseNs - 5000000000LL;
  s.start_unix_ns = kUnixBaseNs + host_skew_ms * 1000000LL - 5000000000LL;
  s.nccl_version = kNcclVersion;
  char uid[24];
  std::snprintf(uid, sizeof uid, "%016llx", static_cast<unsigned long long>(Mix(seed_ * 1000003 + rank)));
  s.process_uid = uid;
  s.job_instance = "torchelastic:gen-" + std::to_string(seed_) + ":0";
  // In setup only the world exists, still being created: nothing issued yet.
  const std::vector<CommKind> kinds = plan.in_setup ? std::vector<CommKind>{CommKind::kWorld} : topo_.Kinds();
  const trace::CommState state = plan.in_setup ? trace::CommState::Initializing : trace::CommState::Active;
  if (plan.in_setup) s.in_nccl.push_back({pid, "ncclCommInitRank", kDeadlineS + static_cast<double>(rank % 7) / 10});
  for (auto k : kinds) {
    const auto& c = counters[KindIndex(k)];
    trace::CommSummary cs;
    cs.id = topo_.CommId(k, rank);
    cs.size = topo_.CommSize(k);
    cs.rank = topo_.CommRank(k, rank);
    cs.name = topo_.CommName(k, rank);
    cs.state = trace::CommStateName(state);
    cs.last_enqueued = plan.in_setup ? 0 : c.enqueued;
    cs.last_gpu_reached = plan.in_setup ? 0 : c.reached;
    cs.last_completed = plan.in_setup ? 0 : c.completed;
    for (const auto& [peer, n] : c.p2p) cs.p2p.push_back({peer, n[0], n[1], n[2], n[3]});
    s.comms.push_back(std::move(cs));
  }
  int64_t recorded = plan.in_setup ? 0 : history_ops_ + static_cast<int64_t>(extra_ops.size());
  int64_t kept = std::min<int64_t>(recorded, capacity_);
  s.ring_overwritten = recorded - kept;

  trace::Detail& d = doc.detail;
  d.process.exe = kPython;
  d.process.cmdline = {"python3", "-u", "train.py", "--config", "configs/70b.yaml"};
  d.process.cwd = "/workspace/job";
  d.process.env = {{"CUDA_VISIBLE_DEVICES", std::to_string(rank % kRanksPerHost)},
                   {"LOCAL_RANK", std::to_string(rank % kRanksPerHost)},
                   {"LOCAL_WORLD_SIZE", std::to_string(kRanksPerHost)},
                   {"MASTER_ADDR", "node0000"},
                   {"MASTER_PORT", "29500"},
                   {"NCCL_DEBUG", "WARN"},
                   {"NCCL_IB_HCA", "mlx5_0,mlx5_1,mlx5_2,mlx5_3"},
                   {"NCCL_IB_TIMEOUT", "22"},
                   {"NCCL_NVLS_ENABLE", "1"},
                   {"NCCL_SOCKET_IFNAME", "eth0"},
                   {"RANK", std::to_string(rank)},
                   {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "3"},
                   {"WORLD_SIZE", std::to_string(topo_.ranks)}};
  d.process.cuda_driver_version = 12040;
  d.process.ncclwatch_version = kNcclwatchVersion;
  d.process.config = ConfigOf(capacity_);
  for (auto k : kinds) {
    trace::Communicator c;
    c.id = topo_.CommId(k, rank);
    c.size = topo_.CommSize(k);
    c.rank = topo_.CommRank(k, rank);
    c.name = topo_.CommName(k, rank);
    c.state = trace::CommStateName(state);
    c.device = rank % kRanksPerHost;
    bool split = k != CommKind::kWorld;
    c.kind = trace::CommKindName(split ? trace::CommKind::Split : trace::CommKind::InitRankConfig);
    if (split) c.parent = topo_.CommId(CommKind::kWorld, rank);
    c.color = split ? topo_.GroupIndex(k, rank) : -1;
    c.key = split ? topo_.CommRank(k, rank) : -1;
    c.blocking = true;
    c.created_mono_ns = kMonoBaseNs - 2000000000LL;
    d.communicators.push_back(std::move(c));
  }
  d.ring.capacity = capacity_;
  d.ring.recorded = recorded;
  d.ring.overwritten = recorded - kept;
  // The ring keeps the last `capacity_` operations: the end of the history, then the extras.
  PatchHistory(rank);
  size_t from_extras = std::min(extra_ops.size(), static_cast<size_t>(capacity_));
  size_t from_history = plan.in_setup ? 0 : std::min(history_.size(), static_cast<size_t>(capacity_) - from_extras);
  if (window) {  // the caller streams them (Write): no copy of the history per rank
    window->history_from = history_.size() - from_history;
    window->extras.assign(extra_ops.end() - static_cast<long>(from_extras), extra_ops.end());
  } else {
    d.ring.entries.assign(history_.end() - static_cast<long>(from_history), history_.end());
    d.ring.entries.insert(d.ring.entries.end(), extra_ops.end() - static_cast<long>(from_extras), extra_ops.end());
  }
  d.callsites = callsites_;
  if (plan.killed) return doc;  // nothing of the process runs any more: no threads
  d.threads.push_back({pid, "python3", SignalledThreadStack(MainThreadStack(plan.stack)), ""});
  for (const auto& th : HelperThreads()) {
    if (lean_ && std::strcmp(th.name, "ncclwatch") != 0) continue;
    const bool dumping = std::strcmp(th.name, "ncclwatch") == 0;
    d.threads.push_back({pid + th.tid_offset, th.name, dumping ? ToStack(th.stack) : SignalledThreadStack(th.stack), ""});
  }
  return doc;
}

std::string DumpRenderer::Write(const std::string& dir, int rank, const RankPlan& plan,
                                const DumpOptions& options, std::string* error) {
  RingWindow window;
  trace::Document doc = Render(rank, plan, options, &window);
  size_t next = window.history_from, extra = 0;
  std::string text = trace::WriteDocument(doc, [&](trace::Op* op) {
    if (next < history_.size()) {
      *op = history_[next++];
      return true;
    }
    if (extra >= window.extras.size()) return false;
    *op = window.extras[extra++];
    return true;
  });
  // The first top-level key after the summary: it cannot occur inside a string (quotes are escaped).
  size_t end = text.find(std::string(",\"") + trace::key::kProcess + "\":");
  last_summary_end_ = end == std::string::npos ? 0 : end;
  const trace::Summary& s = doc.summary;
  std::string name = trace::DumpFileName(s.rank, s.host, s.pid, s.dump_seq, s.reason.Name());
  std::string path = dir + "/" + name;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = path + ": " + std::strerror(errno);
    return "";
  }
  for (size_t done = 0; done < text.size();) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *error = path + ": " + std::strerror(errno);
      ::close(fd);
      return "";
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return name;
}

}  // namespace gen
}  // namespace ncclwatch
