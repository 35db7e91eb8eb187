#include "runtime/runtime.h"

#include <pthread.h>
#include <unistd.h>

#include <cstdlib>
#include <mutex>

#include "common/clock.h"
#include "common/fd_room.h"
#include "common/memory_room.h"
#include "common/log.h"
#include "common/quietly.h"
#include "common/real_nccl.h"
#include "common/thread_id.h"
#include "common/timing.h"
#include "process/signals.h"
#include "format/display.h"
#include "stacks/stacks.h"

namespace ncclwatch {

alignas(64) std::atomic<int> g_runtime_state{kRuntimeUnstarted};

namespace {

constexpr int kUnstarted = kRuntimeUnstarted, kActive = kRuntimeActive, kDisabled = kRuntimeDisabled;
std::atomic<Runtime*> g_runtime{nullptr};
std::mutex g_start_mu;

void WakeWatchdog(void* arg) { static_cast<Watchdog*>(arg)->Wake(); }
void PassThrough() { g_runtime_state.store(kDisabled, std::memory_order_release); }

// Shared node-local directories (/dev/shm): this user's own subdirectory, or "none" (one line).
void UsePrivateDir(std::string* dir, const char* setting, const char* without) {
  if (*dir == "none" || dir->empty()) return;
  std::string why;
  const std::string mine = UserPrivateDir(*dir, &why);
  if (mine.empty()) LogWarn("%s: %s; going on without it (%s)", setting, why.c_str(), without);
  *dir = mine.empty() ? "none" : mine;
}

}  // namespace

Runtime* Runtime::IfActive() {
  return g_runtime_state.load(std::memory_order_acquire) == kActive ? g_runtime.load(std::memory_order_acquire) : nullptr;
}

Runtime* Runtime::Acquire() {
  int s = g_runtime_state.load(std::memory_order_acquire);
  if (s == kActive) return g_runtime.load(std::memory_order_acquire);
  if (s == kDisabled) return nullptr;
  std::unique_lock<std::mutex> lock(g_start_mu);
  s = g_runtime_state.load(std::memory_order_acquire);
  if (s != kUnstarted) return s == kActive ? g_runtime.load() : nullptr;
  Runtime* rt = nullptr;  // never deleted: threads and handlers may use it until exit
  bool started = false;
  // Out of memory while starting: the job goes on without ncclwatch (one line says so).
  Quietly("starting ncclwatch", [&] {
    rt = new Runtime;
    started = rt->Start();
  });
  if (!started) {
    g_runtime_state.store(kDisabled, std::memory_order_release);
    return nullptr;
  }
  g_runtime.store(rt, std::memory_order_release);
  g_runtime_state.store(kActive, std::memory_order_release);
  lock.unlock();  // other threads' calls go on meanwhile
  // Python's exit is watched from the first NCCL call on, by the thread that makes it (bounded
  // wait; without the GIL in time, the watchdog tries again each second): an exception raised
  // right after it is still the job's uncaught one.
  if (rt->config_.python && rt->config_.exit_record)
    Quietly("watching Python's exit", [] { stacks::WatchPythonExit(timing::Ms(timing::kBackgroundGilWait)); });
  return rt;
}

bool Runtime::Start() {
  ConfigResult parsed = ParseConfig([](const char* name) -> const char* { return getenv(name); }, environ);
  config_ = parsed.config;
  SetLogLevel(config_.log);
  for (auto& e : parsed.errors) LogWarn("%s", e.c_str());
  if (config_.disable) return false;

  identity_ = ReadProcessIdentity();
  if (!config_.job_instance.empty()) identity_.job_instance = config_.job_instance;
  // `ncclwatch run`'s id: two runs into one directory never answer or read each other's files,
  // and restarts inside one run keep the launcher's instance after it.
  if (!config_.run_id.empty())
    identity_.job_instance = config_.run_id + (identity_.job_instance.empty() ? "" : "/" + identity_.job_instance);
  if (!config_.host.empty()) identity_.host = config_.host;
  start_mono_ns_ = MonoNs();
  if (identity_.env_rank >= 0) {
    rank_.global.store(identity_.env_rank);
    SetLogRank(identity_.env_rank);
  }
  rank_.world_size.store(identity_.env_world_size);
  // A job that set RLIMIT_NOFILE this low counted its descriptors: none is kept (the black
  // box's, the relay's and the caretaker's locks), and the library goes without them.
  if (const int limit = FdLimit(); limit < kKeepFdsMinLimit && (config_.blackbox_dir != "none" || config_.relay_dir != "none")) {
    LogInfo("RLIMIT_NOFILE is %d: no descriptor is kept open, so no black box (a rank that ends without a word "
            "leaves no evidence) and no request relay (this process reads the dump directory itself)",
            limit);
    config_.blackbox_dir = "none";
    config_.relay_dir = "none";
  }
  UsePrivateDir(&config_.blackbox_dir, "NCCLWATCH_BLACKBOX_DIR", "no black box");
  UsePrivateDir(&config_.relay_dir, "NCCLWATCH_RELAY_DIR", "each rank reads the dump directory itself");
  if (config_.blackbox_dir != "none") {
    std::string why;
    box_ = blackbox::BlackBox::Create(config_.blackbox_dir, config_.ring, identity_.pid, identity_.process_uid,
                                      DeadlinePolicy::DefaultS(config_.timeout), &why);
    if (!box_)
      LogWarn("NCCLWATCH_BLACKBOX_DIR: %s; a rank that ends without a word (SIGKILL, the OOM killer) leaves no "
              "evidence",
              why.c_str());
  }
  if (box_) own_box_name_ = box_->path().substr(box_->path().rfind('/') + 1);
  // The ring, the communicators' sequence state and the threads' calls live in the black box.
  ring_ = std::make_unique<FlightRing>(config_.ring, box_ ? box_->ring() : nullptr);
  if (box_) {
    comms_.UseStorage(box_->comms(), box_->comms_capacity());
    threads_.UseStorage(box_->threads());
  }
  if (Real().ncclGetVersion) Real().ncclGetVersion(&nccl_version_);

  std::string why;
  if (driver_.Load(config_.cuda_lib, &why))
    markers_ = std::make_unique<GpuMarkers>(&driver_, config_.gpu_timing, config_.graphs);
  else
    LogWarn("%s: operations are recorded but not followed on the GPU", why.c_str());

  stacks::PrepareUnwinder();  // libunwind from now on, not before: a process without NCCL maps none
  // Our frames on top of a stack (a dumping thread's) say nothing about the application.
  stacks::SetOwnModule(reinterpret_cast<const void*>(&WakeWatchdog));
  stacks::SetPythonCallsites(config_.python);
  // Relative paths are resolved once, here: a job that changes directory later still dumps
  // where it started, all ranks into one directory.
  StartPieces(WorkingDirectory());
  if (config_.callsites || config_.stacks) {
    const std::string problem = stacks::NativeStackProblem();
    if (!problem.empty()) LogWarn("%s", problem.c_str());
    const std::string reads = stacks::MemoryReadProblem();
    if (!reads.empty()) LogInfo("%s", reads.c_str());
  }
  if (config_.callsites && config_.python) {
    const std::string problem = stacks::PythonCallsiteProblem();
    if (!problem.empty()) LogWarn("%s", problem.c_str());
  }
  if (config_.stacks && config_.stack_signal && !stacks::InstallThreadStackSignal(config_.stack_signal))
    LogInfo("signal %s is in use; thread stacks in dumps are limited to the dumping thread",
            SignalName(config_.stack_signal).c_str());

  ScheduleDuties();
  if (!watchdog_->Start()) LogWarn("cannot start the watchdog thread; stalls will not be detected");

  SignalHooks hooks;
  hooks.wake = &WakeWatchdog;
  hooks.arg = watchdog_.get();
  hooks.ending = &Runtime::OnSignalEnding;
  hooks.ending_arg = this;
  InstallSignalHandlers(config_.signals, config_.dump_signal, config_.signal_wait_ms, hooks);
  // on_exit, not atexit: the handler gets the exit status (a return from main included).
  on_exit(&Runtime::OnExitThunk, nullptr);
  pthread_atfork(nullptr, nullptr, &Runtime::AtForkChild);
  LogInfo("started: ring %llu entries (%zu KiB), dumps to %s", static_cast<unsigned long long>(ring_->capacity()),
          ring_->MemoryBytes() / 1024, config_.dir.empty() ? DefaultDumpDir(identity_).c_str() : config_.dir.c_str());
  return true;
}

void Runtime::StartPieces(const std::string& start_dir) {
  dumps_ = std::make_unique<DumpDirectory>(config_.dir, DefaultDumpDir(identity_), config_.max_dumps, start_dir);
  relay_ = std::make_unique<RequestRelay>(config_.relay_dir, identity_.host);
  StoreSettings store = ReadStoreSettings(config_.store, config_.store_addr, config_.store_max_kb, identity_.host);
  if (store.mode == "on" && store.address.empty())
    LogWarn("NCCLWATCH_STORE=on: no store address (NCCLWATCH_STORE_ADDR, or MASTER_ADDR and MASTER_PORT); the "
            "dump directory only");
  if (store.mode != "off" && config_.relay_dir == "none")
    LogDebug("NCCLWATCH_STORE: no request relay (NCCLWATCH_RELAY_DIR=none), so no process of this host links to the "
             "store");
  relay_->UseStore(std::move(store));
  if (box_) {
    // Who this process is, the modules, and call sites' raw frames from their first capture on:
    // a process killed before its watchdog's first poll still has its call sites' frames.
    blackbox::BoxIdentity described =
        blackbox::DescribeProcess(identity_, config_, start_mono_ns_, nccl_version_, driver_.version, start_dir);
    described.dump_anchor = dumps_->start_anchor();  // a tree removed later is not created again
    box_keeper_ = std::make_unique<blackbox::BoxKeeper>(box_.get(), &threads_, relay_.get(), std::move(described));
  }
  // Without a box of its own (it could not be created), a process still converts dead ones.
  if (config_.blackbox_dir != "none") caretaker_ = std::make_unique<blackbox::Caretaker>(config_.blackbox_dir, config_.relay_dir);
  if (!config_.metrics.empty()) {
    // Created like the dump directory (the textfile collector's directory may not exist yet).
    std::string metrics_why;
    if (MakeDirs(config_.metrics, &metrics_why))
      metrics_ = std::make_unique<MetricsWriter>(config_.metrics + "/" + MetricsFileName(identity_.host, identity_.pid));
    else
      LogWarn("NCCLWATCH_METRICS=%s: cannot create or write it (%s); no metrics file: create it writable by this "
              "user (mkdir -p) or pick another directory",
              trace::PrintableCut(config_.metrics).c_str(), metrics_why.c_str());
  }

  Watchdog::Callbacks cb;
  cb.on_stall = [this](const InflightView& v, const std::string& d) { policy_->OnStall(v, d); };
  cb.on_recovery = [this](const Recovery& r) { policy_->OnRecovery(r); };
  cb.on_tick = [this] { OnTick(); };
  watchdog_ = std::make_unique<Watchdog>(config_, ring_.get(), markers_.get(), &threads_, std::move(cb));

  DumpPolicy::Parts dp;
  dp.sources = {&config_, &identity_, start_mono_ns_, nccl_version_, driver_.version, &comms_, &threads_,
                ring_.get(), watchdog_.get()};
  dp.rank = &rank_;
  dp.dumps = dumps_.get();
  dp.relay = relay_.get();
  if (box_keeper_) dp.dump_written = [keeper = box_keeper_.get()](const std::string& dir) { keeper->DumpWritten(dir); };
  policy_ = std::make_unique<DumpPolicy>(std::move(dp));
  ExitPath::Parts ep{&config_, &identity_, watchdog_.get(), relay_.get(), policy_.get(), metrics_.get(), box_.get(),
                     &PassThrough, {}};
  if (caretaker_) ep.tidy_host = [this] { caretaker_->Tend(OwnBoxName(), identity_.job_instance); };
  exit_ = std::make_unique<ExitPath>(std::move(ep));
  pending_ = std::make_unique<PendingLaunches>(ring_.get(), markers_.get(), watchdog_.get());
  recorder_ = std::make_unique<Recorder>(Recorder::Parts{&config_, &identity_, &rank_, ring_.get(), markers_.get(),
                                                         watchdog_.get(), &comms_, &threads_, policy_.get(),
                                                         pending_.get(), box_.get()});
}

// The watchdog thread's duties after each poll, in this order; each says when it is next due.

void Runtime::ScheduleDuties() {
  duties_.Add("a signal's dump", [this](uint64_t now) { return exit_->DumpPendingSignal(now); });
  if (box_keeper_)
    duties_.Add("the black box", [this](uint64_t now) {
      box_keeper_->Tend(now, watchdog_->last_poll_ns(), watchdog_->last_poll_recorded());
      return now;
    });
  if (config_.python && config_.exit_record)
    // Done at the first NCCL call unless the GIL was busy then: retried each second until had.
    duties_.Add("the Python exit hook", [](uint64_t now) {
      return stacks::WatchPythonExit(timing::Ms(timing::kBackgroundGilWait)) ? TickSchedule::kNever
                                                                              : now + timing::Ns(timing::kPythonExitRetry);
    });
  duties_.Add("ended communicators", [this](uint64_t now) {
    return AddressSpaceRoom() ? ForgetEndedComms(comms_, *watchdog_, now) : now + timing::Ns(timing::kEndedCommCheck);
  });
  if (metrics_)
    duties_.Add("the metrics", [this](uint64_t now) {
      // The file is written every few seconds (it allocates): only with room to spare.
      if (!metrics_->Due(now)) return metrics_->Count(*ring_), now;
      if (!FdRoom(1) || !AddressSpaceRoom()) return now;
      return metrics_->Tend(now, *ring_, [&](MetricsInput* in) {
        in->rank = rank_.global.load();
        comms_.All(&in->comms);
        in->ring = ring_.get();
        watchdog_->Inflight(0, now, &in->inflight);
        in->stalls = policy_->stalls();
        in->dumps = policy_->dumps_written();
        in->nccl_version = nccl_version_;
      });
    });
  duties_.Add("setup hangs", [this](uint64_t now) { return policy_->CheckSetups(now); });
  duties_.Add("the job-wide request", [this](uint64_t now) { return policy_->AnswerPeers(now); });
  if (caretaker_)
    duties_.Add("the host's caretaker", [this](uint64_t now) {
      caretaker_->Tend(OwnBoxName(), identity_.job_instance);
      return now + config_.peer_poll_ms * 1000000ull;
    });
}

void Runtime::OnTick() {
  static std::once_flag tid_once;
  std::call_once(tid_once, [] { SetWatchdogTid(CurrentTid()); });
  static thread_local bool marked_own = false;  // per thread: a forked child's watchdog is a new one
  if (!marked_own) {
    stacks::MarkOwnThread();
    marked_own = true;
  }
  exit_->FinishQuickExit();       // an _exit waits for its record
  if (exit_->finished()) return;  // nothing runs after the process's exit record
  duties_.Run(MonoNs());
}

void Runtime::AtForkChild() {
  // A forked child (a data-loader worker) has no watchdog thread: it becomes a pass-through.
  g_runtime_state.store(kDisabled, std::memory_order_release);
  blackbox::BoxKeeper::ForgetInChild();  // the mapping is the parent's box
}

void Runtime::OnSignalEnding(void* arg) { static_cast<Runtime*>(arg)->exit_->OnSignalEnding(); }

void Runtime::OnExitThunk(int status, void*) {
  if (Runtime* rt = IfActive()) Quietly("the exit record", [&] { rt->exit_->AtExit(status); });
}

}  // namespace ncclwatch
