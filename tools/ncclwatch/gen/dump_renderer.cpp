#include "dump_renderer.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>

namespace ncclwatch {
namespace gen {

namespace key = trace::key;
using trace::OpKind;
using trace::OpState;

namespace {

constexpr int kRanksPerHost = 8;
constexpr int64_t kPidBase = 200000;  // 6 digits for any rank below 800000: patchable in place
constexpr int64_t kOpSpacingNs = 50 * 1000000LL;
constexpr int64_t kUnixBaseNs = 1732200000LL * 1000000000LL;
constexpr const char* kStream = "0x7f3b5c001000";
constexpr const char* kIdPlaceholder = "0000000000000000";
constexpr const char* kTidPlaceholder = "999999";
constexpr int kNcclVersion = 22809;

// Appends JSON text with comma bookkeeping; keys come from trace_format.h.
class Writer {
 public:
  explicit Writer(std::string* out) : o_(*out) {}
  void BeginObject(const char* k = nullptr) { Open(k, '{'); }
  void BeginArray(const char* k = nullptr) { Open(k, '['); }
  void EndObject() { Close('}'); }
  void EndArray() { Close(']'); }
  void Int(const char* k, int64_t v) {
    Sep(k);
    o_ += std::to_string(v);
  }
  void Num(const char* k, double v) {
    Sep(k);
    char b[48];
    std::snprintf(b, sizeof b, "%.3f", v);
    o_ += b;
  }
  void Str(const char* k, const std::string& v) {
    Sep(k);
    Quote(v);
  }
  void Null(const char* k) {
    Sep(k);
    o_ += "null";
  }
  void Bool(const char* k, bool v) {
    Sep(k);
    o_ += v ? "true" : "false";
  }
  size_t size() const { return o_.size(); }

 private:
  void Open(const char* k, char c) {
    Sep(k);
    o_ += c;
    first_.push_back(true);
  }
  void Close(char c) {
    o_ += c;
    first_.pop_back();
  }
  void Sep(const char* k) {
    if (!first_.empty()) {
      if (!first_.back()) o_ += ',';
      first_.back() = false;
    }
    if (k) {
      Quote(k);
      o_ += ':';
    }
  }
  void Quote(const std::string& s) {
    o_ += '"';
    for (char c : s) {
      if (c == '"' || c == '\\') {
        o_ += '\\';
        o_ += c;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        char b[8];
        std::snprintf(b, sizeof b, "\\u%04x", c);
        o_ += b;
      } else {
        o_ += c;
      }
    }
    o_ += '"';
  }
  std::string& o_;
  std::vector<bool> first_;
};

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
  };
}

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

std::string Hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

void WriteStack(Writer& w, const StackDef& s) {
  w.BeginArray(key::kFrames);
  for (const auto& f : s.native) {
    w.BeginObject();
    uint64_t base = 0x7f0000000000ULL + (Mix(std::hash<std::string>()(f.module)) & 0xffffff000ULL);
    w.Str(key::kIp, Hex(base + (Mix(std::hash<std::string>()(f.symbol)) & 0xffff0ULL) + f.offset));
    w.Str(key::kModule, f.module);
    w.Str(key::kSymbol, f.symbol);
    w.Int(key::kOffset, f.offset);
    w.EndObject();
  }
  w.EndArray();
  w.BeginArray(key::kPython);
  for (const auto& f : s.python) {
    w.BeginObject();
    w.Str(key::kFile, f.file);
    w.Int(key::kLine, f.line);
    w.Str(key::kFunction, f.function);
    w.Bool(key::kLibrary, f.library);
    w.EndObject();
  }
  w.EndArray();
}

// --- operations --------------------------------------------------------------------------------

// Writes one operation object; reports where the comm id and tid values start (for patching).
void WriteOp(Writer& w, const std::string& buf, const OpText& t, const std::vector<int>& callsite_index,
             size_t* comm_at = nullptr, size_t* tid_at = nullptr) {
  const Operation& o = t.op;
  w.BeginObject();
  w.Str(key::kComm, t.comm);
  if (comm_at) *comm_at = buf.size() - 17;
  w.Int(key::kSeq, t.seq);
  w.Int(key::kP2pSeq, t.p2p_seq);
  w.Str(key::kOp, trace::OpKindName(o.op));
  w.Int(key::kCount, o.count);
  w.Str(key::kDtype, trace::DatatypeName(o.dtype));
  w.Int(key::kBytes, static_cast<int64_t>(trace::OperationBytes(o.op, o.count, o.dtype, t.comm_size)));
  if (o.redop >= 0) w.Str(key::kRedop, trace::RedOpName(o.redop));
  else w.Null(key::kRedop);
  w.Int(key::kRoot, o.root);
  w.Int(key::kPeer, o.peer);
  w.Str(key::kStream, kStream);
  w.Int(key::kGroup, 0);
  w.Int(key::kTid, t.tid);
  if (tid_at) *tid_at = buf.size() - 6;
  w.Int(key::kEnqueueNs, t.enqueue_ns);
  w.Int(key::kGpuReachedNs, t.gpu_reached_ns);
  w.Int(key::kCompletedNs, t.completed_ns);
  w.Str(key::kState, trace::OpStateName(t.state));
  w.Int(key::kResult, 0);
  w.Int(key::kCallsite, o.callsite >= 0 && static_cast<size_t>(o.callsite) < callsite_index.size()
                             ? callsite_index[o.callsite]
                             : -1);
  if (t.age_s >= 0) {
    w.Num(key::kAgeS, t.age_s);
    w.Num(key::kDeadlineS, t.deadline_s);
  }
  w.EndObject();
}

int KindIndex(CommKind k) { return static_cast<int>(k); }

}  // namespace

// Clocks of one dump: the host's monotonic "now", wall clock, and when the history ended.
struct DumpRenderer::Timing {
  int64_t history_end_ns;
  int64_t mono_now_ns;
  int64_t unix_now_ns;
};

DumpRenderer::DumpRenderer(const Topology& topo, int ring_capacity, uint64_t seed,
                           const std::vector<int>& callsites, bool lean)
    : topo_(topo), capacity_(std::max(1, ring_capacity)), seed_(seed), step_(StepOperations(topo)), lean_(lean) {
  auto stacks = CallsiteStacks();
  callsite_index_.assign(stacks.size(), -1);
  std::vector<int> used;
  for (int c : callsites)
    if (c >= 0 && static_cast<size_t>(c) < stacks.size() && callsite_index_[c] < 0) {
      callsite_index_[c] = static_cast<int>(used.size());
      used.push_back(c);
    }
  // Enough whole steps that the ring is full and has overflowed.
  int64_t steps = (capacity_ + 8) / static_cast<int64_t>(step_.size()) + 2;
  history_ops_ = steps * static_cast<int64_t>(step_.size());
  base_seq_.assign(3, 0);
  for (const auto& op : step_) base_seq_[KindIndex(op.comm)] += steps;
  BuildTemplate();
  std::string cs;
  Writer w(&cs);
  w.BeginArray();
  for (size_t i = 0; i < used.size(); ++i) {
    w.BeginObject();
    w.Int(key::kId, static_cast<int64_t>(i));
    WriteStack(w, stacks[used[i]]);
    w.EndObject();
  }
  w.EndArray();
  callsites_json_ = std::move(cs);
}

void DumpRenderer::BuildTemplate() {
  int64_t first = std::max<int64_t>(0, history_ops_ - capacity_);
  std::vector<int64_t> seq(3, 0);
  // Sequence numbers of the ops before the template window.
  int64_t per_step = static_cast<int64_t>(step_.size());
  for (int64_t i = 0; i < first; ++i) ++seq[KindIndex(step_[i % per_step].comm)];
  ring_template_.reserve(static_cast<size_t>(capacity_) * 420);
  for (int64_t i = first; i < history_ops_; ++i) {
    const Operation& op = step_[i % per_step];
    OpText t;
    t.op = op;
    t.seq = ++seq[KindIndex(op.comm)];
    t.comm = op.comm == CommKind::kWorld ? topo_.CommId(CommKind::kWorld, 0) : kIdPlaceholder;
    t.comm_size = topo_.CommSize(op.comm);
    t.tid = std::stoll(kTidPlaceholder);
    t.enqueue_ns = kMonoBaseNs + i * kOpSpacingNs;
    t.gpu_reached_ns = t.enqueue_ns + 1000000;
    t.completed_ns = t.enqueue_ns + 20000000;
    t.state = OpState::Completed;
    if (i > first) ring_template_ += ',';
    entry_start_.push_back(ring_template_.size());
    Writer w(&ring_template_);
    size_t comm_at = 0, tid_at = 0;
    WriteOp(w, ring_template_, t, callsite_index_, &comm_at, &tid_at);
    if (op.comm == CommKind::kTp) tp_id_at_.push_back(comm_at);
    if (op.comm == CommKind::kDp) dp_id_at_.push_back(comm_at);
    tid_at_.push_back(tid_at);
  }
  entry_start_.push_back(ring_template_.size());
}

void DumpRenderer::PatchTemplate(int rank) {
  if (patched_rank_ == rank) return;
  patched_rank_ = rank;
  if (topo_.HasSubComms()) {
    std::string tp = topo_.CommId(CommKind::kTp, rank), dp = topo_.CommId(CommKind::kDp, rank);
    for (size_t at : tp_id_at_) std::memcpy(&ring_template_[at], tp.data(), 16);
    for (size_t at : dp_id_at_) std::memcpy(&ring_template_[at], dp.data(), 16);
  }
  std::string pid = std::to_string(kPidBase + rank);
  for (size_t at : tid_at_) std::memcpy(&ring_template_[at], pid.data(), 6);
}

namespace {

struct CommCounters {
  int64_t enqueued = 0, reached = 0, completed = 0;
  std::map<int, std::array<int64_t, 4>> p2p;  // peer -> send enq/done, recv enq/done
};

}  // namespace

std::string DumpRenderer::RenderHead(int rank, const RankPlan& plan, const DumpOptions& options,
                                     const Timing& t, size_t* summary_end,
                                     std::vector<OpText>* extras_out, trace::DumpReason* reason_out) {
  const auto& extras = options.earlier ? std::vector<ExtraOp>{} : plan.extras;
  const int64_t pid = kPidBase + rank;
  const std::string host = [&] {
    char b[32];
    std::snprintf(b, sizeof b, "node%04d", rank / kRanksPerHost);
    return std::string(b);
  }();

  // Sequence state and the extra ops with their numbers.
  std::vector<CommCounters> counters(3);
  for (auto k : topo_.Kinds()) {
    auto& c = counters[KindIndex(k)];
    c.enqueued = c.reached = c.completed = base_seq_[KindIndex(k)];
  }
  std::vector<OpText> extra_text;
  for (size_t j = 0; j < extras.size(); ++j) {
    const ExtraOp& e = extras[j];
    auto& c = counters[KindIndex(e.op.comm)];
    OpText x;
    x.op = e.op;
    x.comm = topo_.CommId(e.op.comm, rank);
    x.comm_size = topo_.CommSize(e.op.comm);
    x.tid = pid;
    x.enqueue_ns = t.history_end_ns + static_cast<int64_t>(j + 1) * 100000000LL;
    bool reached = e.stage != Stage::kEnqueued, done = e.stage == Stage::kCompleted;
    x.gpu_reached_ns = reached ? x.enqueue_ns + 1000000 : 0;
    x.completed_ns = done ? x.enqueue_ns + 20000000 : 0;
    x.state = done ? OpState::Completed : reached ? OpState::GpuReached : OpState::Enqueued;
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
    if (!done) {
      x.age_s = static_cast<double>(t.mono_now_ns - x.enqueue_ns) / 1e9;
      x.deadline_s = kDeadlineS;
    }
    extra_text.push_back(std::move(x));
  }
  const OpText* oldest_in_flight = nullptr;
  for (const auto& x : extra_text)
    if (x.age_s >= 0 && !oldest_in_flight) oldest_in_flight = &x;

  std::string out;
  out.reserve(8192);
  Writer w(&out);
  w.BeginObject();
  w.Str(key::kFormat, trace::kFormatName);
  w.Int(key::kVersion, trace::kTraceVersion);
  w.BeginObject(key::kSummary);
  w.Int(key::kRank, rank);
  w.Int(key::kLocalRank, rank % kRanksPerHost);
  w.Int(key::kWorldSize, topo_.ranks);
  w.Str(key::kHost, host);
  w.Int(key::kPid, pid);
  w.Int(key::kDumpSeq, options.dump_seq);
  const int origin = options.origin_rank;
  using R = trace::DumpReason;
  R reason = options.earlier              ? R::OnDemand
             : plan.fatal                 ? R::FatalSignal
             : plan.first_to_stall        ? R::Stall
             : origin >= 0                ? R::PeerRequest
                                          : R::OnDemand;
  if (reason == R::PeerRequest && origin < 0) reason = R::OnDemand;
  *reason_out = reason;
  w.Str(key::kReason, trace::DumpReasonName(reason));
  std::string detail;
  if (reason == R::Stall && oldest_in_flight) {
    char b[160];
    std::snprintf(b, sizeof b, "%s seq %lld on comm %s passed its %.1f s deadline",
                  trace::OpKindName(oldest_in_flight->op.op), static_cast<long long>(oldest_in_flight->seq),
                  oldest_in_flight->comm.c_str(), kDeadlineS);
    detail = b;
  } else if (reason == R::FatalSignal) {
    detail = "SIGSEGV (address 0x18) in fused_attention_fwd_launch";
  } else if (reason == R::PeerRequest) {
    detail = "dump requested by rank " + std::to_string(origin) + " (stall)";
  } else {
    detail = "dump signal (SIGUSR2)";
  }
  w.Str(key::kDetail, detail);
  if (reason == R::PeerRequest) {
    char oh[32];
    std::snprintf(oh, sizeof oh, "node%04d", origin / kRanksPerHost);
    w.BeginObject(key::kTrigger);
    w.Str(key::kRequest, std::string(oh) + "-" + std::to_string(kPidBase + origin) + "-0");
    w.Int(key::kOriginRank, origin);
    w.Str(key::kOriginHost, oh);
    w.Str(key::kReason, trace::DumpReasonName(R::Stall));
    w.EndObject();
  } else {
    w.Null(key::kTrigger);
  }
  w.Int(key::kTimeUnixNs, t.unix_now_ns);
  w.Int(key::kTimeMonoNs, t.mono_now_ns);
  w.Int(key::kStartMonoNs, kMonoBaseNs - 5000000000LL);
  w.Int(key::kNcclVersion, kNcclVersion);
  w.BeginArray(key::kInNccl);
  w.EndArray();
  w.BeginArray(key::kComms);
  for (auto k : topo_.Kinds()) {
    const auto& c = counters[KindIndex(k)];
    w.BeginObject();
    w.Str(key::kId, topo_.CommId(k, rank));
    w.Int(key::kSize, topo_.CommSize(k));
    w.Int(key::kRank, topo_.CommRank(k, rank));
    w.Str(key::kName, topo_.CommName(k, rank));
    w.Str(key::kState, "active");
    w.Int(key::kLastEnqueued, c.enqueued);
    w.Int(key::kLastGpuReached, c.reached);
    w.Int(key::kLastCompleted, c.completed);
    w.BeginArray(key::kP2p);
    for (const auto& [peer, n] : c.p2p) {
      w.BeginObject();
      w.Int(key::kPeer, peer);
      w.Int(key::kSendEnqueued, n[0]);
      w.Int(key::kSendCompleted, n[1]);
      w.Int(key::kRecvEnqueued, n[2]);
      w.Int(key::kRecvCompleted, n[3]);
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
  w.BeginArray(key::kInFlight);
  for (const auto& x : extra_text)
    if (x.age_s >= 0) WriteOp(w, out, x, callsite_index_);
  w.EndArray();
  if (reason == R::Stall && oldest_in_flight) {
    // WriteOp writes a value; give it the key first.
    out += ",\"";
    out += key::kStalled;
    out += "\":";
    Writer sw(&out);
    WriteOp(sw, out, *oldest_in_flight, callsite_index_);
  } else {
    w.Null(key::kStalled);
  }
  int64_t recorded = history_ops_ + static_cast<int64_t>(extra_text.size());
  int64_t kept = std::min<int64_t>(recorded, capacity_);
  w.Int(key::kRingOverwritten, recorded - kept);
  w.EndObject();
  *summary_end = out.size();

  w.BeginObject(key::kProcess);
  w.Str(key::kExe, kPython);
  w.BeginArray(key::kCmdline);
  for (const char* a : {"python3", "-u", "train.py", "--config", "configs/70b.yaml"}) w.Str(nullptr, a);
  w.EndArray();
  w.Str(key::kCwd, "/workspace/job");
  w.BeginObject(key::kEnv);
  w.Str("CUDA_VISIBLE_DEVICES", std::to_string(rank % kRanksPerHost));
  w.Str("LOCAL_RANK", std::to_string(rank % kRanksPerHost));
  w.Str("LOCAL_WORLD_SIZE", std::to_string(kRanksPerHost));
  w.Str("MASTER_ADDR", "node0000");
  w.Str("MASTER_PORT", "29500");
  w.Str("NCCL_DEBUG", "WARN");
  w.Str("NCCL_IB_HCA", "mlx5_0,mlx5_1,mlx5_2,mlx5_3");
  w.Str("NCCL_IB_TIMEOUT", "22");
  w.Str("NCCL_NVLS_ENABLE", "1");
  w.Str("NCCL_SOCKET_IFNAME", "eth0");
  w.Str("RANK", std::to_string(rank));
  w.Str("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3");
  w.Str("WORLD_SIZE", std::to_string(topo_.ranks));
  w.EndObject();
  w.Int(key::kCudaDriverVersion, 12040);
  w.Str(key::kNcclwatchVersion, "0.1.0");
  w.BeginObject(key::kConfig);
  w.Str("NCCLWATCH_RING", std::to_string(capacity_));
  w.Str("NCCLWATCH_TIMEOUT_S", "600");
  w.EndObject();
  w.EndObject();

  w.BeginArray(key::kCommunicators);
  for (auto k : topo_.Kinds()) {
    w.BeginObject();
    w.Str(key::kId, topo_.CommId(k, rank));
    w.Int(key::kSize, topo_.CommSize(k));
    w.Int(key::kRank, topo_.CommRank(k, rank));
    w.Int(key::kDevice, rank % kRanksPerHost);
    w.Str(key::kName, topo_.CommName(k, rank));
    bool split = k != CommKind::kWorld;
    w.Str(key::kKind, split ? "split" : "init_rank_config");
    if (split) w.Str(key::kParent, topo_.CommId(CommKind::kWorld, rank));
    else w.Null(key::kParent);
    w.Int(key::kColor, split ? topo_.GroupIndex(k, rank) : -1);
    w.Int(key::kKey, split ? topo_.CommRank(k, rank) : -1);
    w.Bool(key::kBlocking, true);
    w.Str(key::kState, "active");
    w.Int(key::kCreatedMonoNs, kMonoBaseNs - 2000000000LL);
    w.Int(key::kEndedMonoNs, 0);
    w.EndObject();
  }
  w.EndArray();
  w.BeginObject(key::kRing);
  w.Int(key::kCapacity, capacity_);
  w.Int(key::kRecorded, recorded);
  w.Int(key::kOverwritten, recorded - kept);
  w.BeginArray(key::kEntries);
  // The entries follow: template slice, then the extras (RenderTail).
  *extras_out = std::move(extra_text);
  return out;
}

std::string DumpRenderer::RenderTail(int rank, const RankPlan& plan, const std::vector<OpText>& extras,
                                     bool after_template) {
  std::string out;
  out.reserve(16384);
  size_t first = extras.size() > static_cast<size_t>(capacity_) ? extras.size() - capacity_ : 0;
  for (size_t j = first; j < extras.size(); ++j) {
    if (after_template || j > first) out += ',';
    OpText entry = extras[j];
    entry.age_s = entry.deadline_s = -1;  // ages belong to in_flight, not to the ring
    Writer w(&out);
    WriteOp(w, out, entry, callsite_index_);
  }
  out += "]},\"";
  out += key::kCallsites;
  out += "\":";
  out += callsites_json_;
  const int64_t pid = kPidBase + rank;
  out += ",\"";
  out += key::kThreads;
  out += "\":";
  Writer tw(&out);
  tw.BeginArray();
  tw.BeginObject();
  tw.Int(key::kTid, pid);
  tw.Str(key::kName, "python3");
  WriteStack(tw, MainThreadStack(plan.stack));
  tw.Str(key::kNote, "");
  tw.EndObject();
  for (const auto& th : HelperThreads()) {
    if (lean_ && std::strcmp(th.name, "ncclwatch") != 0) continue;
    tw.BeginObject();
    tw.Int(key::kTid, pid + th.tid_offset);
    tw.Str(key::kName, th.name);
    WriteStack(tw, th.stack);
    tw.Str(key::kNote, "");
    tw.EndObject();
  }
  tw.EndArray();
  out += ",\"";
  out += key::kRecoveries;
  out += "\":[]}";
  return out;
}

std::string DumpRenderer::Write(const std::string& dir, int rank, const RankPlan& plan,
                                const DumpOptions& options, std::string* error) {
  Timing t;
  t.history_end_ns = kMonoBaseNs + history_ops_ * kOpSpacingNs;
  if (options.earlier) {
    t.mono_now_ns = t.history_end_ns + 50000000LL;  // right after the history, before the hang
  } else {
    // The first waiter dumps when its deadline passes; the others follow seconds later.
    int64_t jitter_ms = plan.first_to_stall ? 0 : static_cast<int64_t>(Mix(seed_ ^ (rank + 1)) % 4000);
    t.mono_now_ns = t.history_end_ns + 100000000LL + static_cast<int64_t>(kDeadlineS * 1e9) + 1000000LL +
                    jitter_ms * 1000000LL;
  }
  // Wall clocks differ between hosts by up to +-3 s.
  int64_t host_skew_ms = static_cast<int64_t>(Mix(seed_ * 31 + rank / kRanksPerHost) % 6001) - 3000;
  t.unix_now_ns = kUnixBaseNs + host_skew_ms * 1000000LL + (t.mono_now_ns - kMonoBaseNs);

  size_t summary_end = 0;
  std::vector<OpText> extras;
  trace::DumpReason reason;
  std::string head = RenderHead(rank, plan, options, t, &summary_end, &extras, &reason);
  PatchTemplate(rank);
  size_t template_entries = entry_start_.size() - 1;
  size_t in_ring = std::min(extras.size(), static_cast<size_t>(capacity_));
  size_t skip = std::min(in_ring, template_entries);
  const char* slice = ring_template_.data() + entry_start_[skip];
  size_t slice_len = ring_template_.size() - entry_start_[skip];
  std::string tail = RenderTail(rank, plan, extras, slice_len > 0);

  char name[160];
  std::snprintf(name, sizeof name, "rank%05d-node%04d-%lld-%d-%s.json", rank, rank / kRanksPerHost,
                static_cast<long long>(kPidBase + rank), options.dump_seq, trace::DumpReasonName(reason));
  std::string path = dir + "/" + name;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    *error = path + ": " + std::strerror(errno);
    return "";
  }
  struct iovec iov[3] = {{head.data(), head.size()},
                         {const_cast<char*>(slice), slice_len},
                         {tail.data(), tail.size()}};
  size_t total = head.size() + slice_len + tail.size(), written = 0;
  int first_iov = 0;
  while (written < total) {
    ssize_t n = ::writev(fd, iov + first_iov, 3 - first_iov);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *error = path + ": " + std::strerror(errno);
      ::close(fd);
      return "";
    }
    written += static_cast<size_t>(n);
    for (size_t left = static_cast<size_t>(n); first_iov < 3 && left > 0;) {
      size_t take = std::min(left, iov[first_iov].iov_len);
      iov[first_iov].iov_base = static_cast<char*>(iov[first_iov].iov_base) + take;
      iov[first_iov].iov_len -= take;
      left -= take;
      if (iov[first_iov].iov_len == 0) ++first_iov;
    }
    while (first_iov < 3 && iov[first_iov].iov_len == 0) ++first_iov;
  }
  ::close(fd);
  last_summary_end_ = summary_end;
  return name;
}

}  // namespace gen
}  // namespace ncclwatch
