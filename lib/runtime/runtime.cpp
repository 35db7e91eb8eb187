#include "runtime/runtime.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <time.h>

#include "common/clock.h"
#include "common/lock_within.h"
#include "common/log.h"
#include "common/quietly.h"
#include "common/timing.h"
#include "dump/dump_writer.h"
#include "format/display.h"
#include "format/trace_writer.h"
#include "dump/signals.h"
#include "intercept/real_nccl.h"
#include "stacks/stacks.h"

namespace ncclwatch {

alignas(64) std::atomic<int> g_runtime_state{kRuntimeUnstarted};

namespace {

constexpr int kUnstarted = kRuntimeUnstarted, kActive = kRuntimeActive, kDisabled = kRuntimeDisabled;
std::atomic<Runtime*> g_runtime{nullptr};
std::mutex g_start_mu;

int32_t CurrentTid() { return static_cast<int32_t>(syscall(SYS_gettid)); }

void WakeWatchdog(void* arg) { static_cast<Watchdog*>(arg)->Wake(); }

// The black box that new call sites' raw addresses go to (stacks::NewCallsiteHook).
std::atomic<blackbox::BlackBox*> g_sites_box{nullptr};
void RecordBoxCallsite(int32_t id, const uintptr_t* ips, int native_depth, int python_depth) {
  if (blackbox::BlackBox* box = g_sites_box.load(std::memory_order_acquire))
    box->RecordRawCallsite(id, ips, native_depth, python_depth);
}

}  // namespace

Runtime::Runtime() = default;

Runtime* Runtime::IfActive() {
  return g_runtime_state.load(std::memory_order_acquire) == kActive ? g_runtime.load(std::memory_order_acquire) : nullptr;
}

Runtime* Runtime::Acquire() {
  int s = g_runtime_state.load(std::memory_order_acquire);
  if (s == kActive) return g_runtime.load(std::memory_order_acquire);
  if (s == kDisabled) return nullptr;
  std::lock_guard<std::mutex> lock(g_start_mu);
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
    global_rank_.store(identity_.env_rank);
    SetLogRank(identity_.env_rank);
  }
  world_size_.store(identity_.env_world_size);
  // Shared node-local directories (/dev/shm): this user's own subdirectory, or none (one line).
  for (std::string* dir : {&config_.blackbox_dir, &config_.relay_dir}) {
    if (*dir == "none" || dir->empty()) continue;
    std::string why;
    const std::string mine = UserPrivateDir(*dir, &why);
    if (mine.empty())
      LogWarn("%s: %s; going on without it (%s)", dir == &config_.blackbox_dir ? "NCCLWATCH_BLACKBOX_DIR" : "NCCLWATCH_RELAY_DIR",
              why.c_str(), dir == &config_.blackbox_dir ? "no black box" : "each rank reads the dump directory itself");
    *dir = mine.empty() ? "none" : mine;
  }
  if (config_.blackbox_dir != "none") {
    std::string why;
    box_ = blackbox::BlackBox::Create(config_.blackbox_dir, config_.ring, identity_.pid, identity_.process_uid,
                                      DeadlinePolicy::DefaultS(config_.timeout), &why);
    if (!box_)
      LogWarn("NCCLWATCH_BLACKBOX_DIR: %s; a rank that ends without a word (SIGKILL, the OOM killer) leaves no "
              "evidence",
              why.c_str());
  }
  // The ring, the communicators' sequence state and the threads' calls live in the black box.
  ring_ = std::make_unique<FlightRing>(config_.ring, box_ ? box_->ring() : nullptr);
  if (box_) {
    comms_.UseStorage(box_->comms(), box_->comms_capacity());
    threads_.UseStorage(box_->threads());
  }
  if (Real().ncclGetVersion) Real().ncclGetVersion(&nccl_version_);

  std::string why;
  if (driver_.Load(config_.cuda_lib, &why))
    markers_ = std::make_unique<GpuMarkers>(&driver_, config_.gpu_timing);
  else
    LogWarn("%s: operations are recorded but not followed on the GPU", why.c_str());

  // Relative paths are resolved once, here: a job that changes directory later still dumps
  // where it started, all ranks into one directory.
  const std::string start_dir = WorkingDirectory();
  dumps_ = std::make_unique<DumpDirectory>(config_.dir, DefaultDumpDir(identity_), config_.max_dumps, start_dir);
  if (box_) {
    blackbox::BoxIdentity& b = box_identity_;
    b.host = identity_.host;
    b.pid = identity_.pid;
    b.local_rank = identity_.local_rank;
    b.job_id = identity_.job_id;
    b.job_instance = identity_.job_instance;
    b.process_uid = identity_.process_uid;
    b.start_unix_ns = static_cast<int64_t>(identity_.start_unix_ns);
    b.start_mono_ns = static_cast<int64_t>(start_mono_ns_);
    b.start_ticks = blackbox::ReadProcStat(identity_.pid).start_ticks;  // an execve keeps it: see OwnerOf
    b.nccl_version = nccl_version_;
    b.cuda_driver_version = driver_.version;
    b.exe = ExecutablePath();
    b.cwd = start_dir;
    if (config_.cmdline) b.cmdline = CommandLine();
    b.environment = RelevantEnvironment();
    // Absolute: the caretaker that writes its postmortem runs in another directory.
    b.dump_dir = config_.dir.empty() || config_.dir[0] == '/' ? config_.dir : start_dir + "/" + config_.dir;
    b.dump_fallback = DefaultDumpDir(identity_);
    WriteBoxIdentity();
  }
  relay_ = std::make_unique<RequestRelay>(config_.relay_dir, identity_.host);
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
  stacks::PrepareUnwinder();  // libunwind from now on, not before: a process without NCCL maps none
  // Our frames on top of a stack (a dumping thread's) say nothing about the application.
  stacks::SetOwnModule(reinterpret_cast<const void*>(&WakeWatchdog));
  stacks::SetPythonCallsites(config_.python);
  if (box_) {
    // Call sites as raw addresses from their first capture on, and the modules to read them
    // with: a process killed before its watchdog's first poll still has its call sites' frames.
    box_keeper_ = std::make_unique<blackbox::BoxKeeper>(box_.get(), &threads_);
    g_sites_box.store(box_.get(), std::memory_order_release);
    stacks::SetNewCallsiteHook(&RecordBoxCallsite);
  }
  if (config_.callsites || config_.stacks) {
    const std::string problem = stacks::NativeStackProblem();
    if (!problem.empty()) LogWarn("%s", problem.c_str());
  }
  if (config_.callsites && config_.python) {
    const std::string problem = stacks::PythonCallsiteProblem();
    if (!problem.empty()) LogWarn("%s", problem.c_str());
  }
  if (config_.stacks && config_.stack_signal && !stacks::InstallThreadStackSignal(config_.stack_signal))
    LogInfo("signal %s is in use; thread stacks in dumps are limited to the dumping thread",
            SignalName(config_.stack_signal).c_str());

  Watchdog::Callbacks cb;
  cb.on_stall = [this](const InflightView& v, const std::string& d) { OnStall(v, d); };
  cb.on_recovery = [this](const Recovery& r) { OnRecovery(r); };
  cb.on_tick = [this] { OnTick(); };
  watchdog_ = std::make_unique<Watchdog>(config_, ring_.get(), markers_.get(), &threads_, std::move(cb));
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

void Runtime::AtForkChild() {
  // A forked child (a data-loader worker) has no watchdog thread: it becomes a pass-through.
  g_runtime_state.store(kDisabled, std::memory_order_release);
  g_sites_box.store(nullptr, std::memory_order_release);  // the mapping is the parent's box
}

void Runtime::OnSignalEnding(void* arg) {
  // A process that a signal ends must not look alive to the metrics collector, and its black
  // box has nothing to add once the dump of that end is written. Unlinks only: async-signal-safe.
  auto* rt = static_cast<Runtime*>(arg);
  if (rt->metrics_) rt->metrics_->Remove();
  if (rt->box_) rt->box_->RemoveIfFinalDumped();
}

void Runtime::OnExitThunk(int status, void*) {
  if (Runtime* rt = IfActive()) Quietly("the exit record", [&] { rt->AtExit(status); });
}

void Runtime::AtExit(int status) {
  if (identity_.pid != getpid()) return;
  // exit() may be called from a signal handler that interrupted the application inside malloc
  // (or any lock it holds): this thread takes none. The watchdog writes the record, as for
  // _exit, and this thread waits for it, bounded; then the watchdog stops.
  if (watchdog_->running() && !watchdog_->OnWatchdogThread()) {
    OnQuickExit(status);
    if (quick_exit_.load(std::memory_order_acquire) == kQuickExitDone)
      watchdog_->Stop(timing::Ms(timing::kWatchdogStopWait));
    return;
  }
  Finish(status, -1, 0, /*on_watchdog=*/false);
}

void Runtime::OnQuickExit(int status) {
  // A forked or vforked child (posix_spawn's exec failure) shares nothing of the rank's end.
  if (identity_.pid != static_cast<int>(getpid()) || finished_.load(std::memory_order_acquire)) return;
  if (!watchdog_->running() || watchdog_->OnWatchdogThread()) return;  // its black box tells instead
  static std::atomic<bool> claimed{false};
  if (!claimed.exchange(true)) {
    quick_exit_status_.store(status, std::memory_order_relaxed);
    quick_exit_tid_.store(CurrentTid(), std::memory_order_relaxed);
    int32_t site = -1;
    if (config_.stacks) Quietly("the exit record", [&] { site = stacks::CaptureCallsite(0, stacks::kMaxNativeFrames); });
    quick_exit_site_.store(site, std::memory_order_relaxed);
    quick_exit_.store(kQuickExitAsked, std::memory_order_release);
    watchdog_->Wake();
  }
  // Bounded, with async-signal-safe calls only: the exit goes ahead whatever happens.
  const timespec step{0, 2 * 1000 * 1000};
  for (uint64_t waited_ms = 0; waited_ms < config_.signal_wait_ms; waited_ms += 2) {
    if (quick_exit_.load(std::memory_order_acquire) == kQuickExitDone) return;
    nanosleep(&step, nullptr);
  }
}

void Runtime::Finish(int status, int32_t exiting_site, int32_t exiting_tid, bool on_watchdog) {
  if (finished_.exchange(true)) return;
  g_runtime_state.store(kDisabled, std::memory_order_release);  // late NCCL calls pass straight through
  // Operations that finish while the process exits are normal (a script that ends without a
  // final synchronize): give them a moment before calling them "in flight at exit".
  std::vector<InflightView> pending;
  for (int i = 0; i < timing::kExitSettleChecks; ++i) {
    if (on_watchdog) watchdog_->PollOnce(MonoNs());  // nobody else follows them meanwhile
    pending = watchdog_->Inflight(timing::Ms(timing::kExitInflightLockWait));
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [](const InflightView& v) { return v.op.state == trace::OpState::Completed; }),
                  pending.end());
    if (pending.empty()) break;
    usleep(static_cast<useconds_t>(timing::Ms(timing::kExitSettleInterval)) * 1000);
  }
  if (!on_watchdog) watchdog_->Stop(timing::Ms(timing::kWatchdogStopWait));
  LogDebug("job-wide request: %llu checks of the shared dump directory%s",
           static_cast<unsigned long long>(relay_->shared_checks()),
           relay_->watcher() ? " (this host's watcher)" : "");
  // The relay is the watchdog's: left from its own thread, or once it has stopped (one stuck in
  // the driver may still poll it).
  if (on_watchdog || !watchdog_->running()) relay_->Leave();
  if (metrics_) metrics_->Remove();  // a process that left must not look alive to the collector
  DumpExtra extra;
  extra.exit_status = status;
  extra.exiting_site = exiting_site;
  extra.exiting_tid = exiting_tid;
  trace::UncaughtException exception;
  if (stacks::LastUncaughtException(&exception)) extra.exception = std::move(exception);
  if (!pending.empty()) {
    std::string detail = std::to_string(pending.size()) + " operation(s) still in flight at exit, oldest " +
                         trace::OpKindName(pending.front().op.kind) + " seq " +
                         std::to_string(pending.front().op.seq);
    Dump(trace::DumpReason::ExitInFlight, detail, std::nullopt, std::nullopt, extra);
  } else if (config_.exit_record) {
    // Where this rank stopped, for the ranks that may still wait on it (uneven inputs): small
    // and cheap, outside NCCLWATCH_MAX_DUMPS.
    extra.exit_record = true;
    Dump(trace::DumpReason::Exit, "exit status " + std::to_string(status), std::nullopt, std::nullopt, extra);
  }
  // It left its own word: nothing for the host's caretaker to convert.
  if (box_) box_->Remove();
}

CommInfo* Runtime::AddCommunicator(std::unique_ptr<CommInfo> info) {
  int size = info->size, rank = info->rank;
  CommInfo* c = comms_.Register(std::move(info));
  int ws = world_size_.load();
  if (identity_.env_world_size < 0 && size > ws) world_size_.store(size);
  if (global_rank_.load() < 0 && (identity_.env_world_size < 0 || size == identity_.env_world_size)) {
    int expected = -1;
    if (global_rank_.compare_exchange_strong(expected, rank)) SetLogRank(rank);
  }
  if (box_) box_->SetRank(global_rank_.load(), world_size_.load());
  return c;
}

CommInfo* Runtime::AdoptUnknown(const void* handle) {
  auto info = std::make_unique<CommInfo>();
  info->handle = handle;
  info->id = Fnv1a64(&handle, sizeof handle) ^ static_cast<uint64_t>(identity_.pid);
  info->created_ns = MonoNs();
  auto comm = static_cast<ncclComm_t>(const_cast<void*>(handle));
  if (Real().ncclCommCount) Real().ncclCommCount(comm, &info->size);
  if (Real().ncclCommUserRank) Real().ncclCommUserRank(comm, &info->rank);
  LogInfo("operation on a communicator created without ncclwatch; its id is local to this process");
  return comms_.Register(std::move(info));
}

void Runtime::Dump(trace::DumpReason reason, const std::string& detail, const std::optional<trace::DumpRequest>& trigger,
                   const std::optional<InflightView>& stalled, const DumpExtra& extra) {
  if (!LockWithin(dump_mu_, timing::Ms(timing::kDumpLockWait))) return;
  std::lock_guard<std::mutex> lock(dump_mu_, std::adopt_lock);
  if (!extra.exit_record && dumps_->LimitReached()) {  // the event is still said (the bound's own line comes once)
    LogWarn("%s: %s (no dump: NCCLWATCH_MAX_DUMPS reached)", trace::DumpReasonName(reason),
            detail.empty() ? "-" : detail.c_str());
    return;
  }
  DumpSources src;
  src.config = &config_;
  src.identity = &identity_;
  src.start_mono_ns = start_mono_ns_;
  src.nccl_version = nccl_version_;
  src.cuda_driver_version = driver_.version;
  src.comms = &comms_;
  src.threads = &threads_;
  src.ring = ring_.get();
  src.watchdog = watchdog_.get();
  DumpInput in = AssembleDumpInput(src, reason, detail, trigger, stalled, extra);
  in.global_rank = global_rank_.load();
  in.world_size = world_size_.load();
  in.dump_seq = dump_seq_++;
  in.time_unix_ns = UnixNs();
  in.time_mono_ns = MonoNs();
  std::string path = dumps_->Write(
      DumpFileStem(in), [&](const trace::TextSink& sink) { return StreamDump(in, sink); },
      /*counted=*/!extra.exit_record);
  const std::string dir = path.empty() ? std::string() : path.substr(0, path.rfind('/'));
  if (!dir.empty() && !temporaries_swept_) {  // what earlier processes of this host left mid-dump
    temporaries_swept_ = true;
    if (int n = RemoveStaleTemporaries(dir, identity_.host))
      LogInfo("removed %d partial dump file(s) that dead processes of this host left", n);
  }
  if (box_ && !dir.empty()) {
    box_->CountDump();
    if (dir != box_identity_.dump_dir) {  // where its postmortem dump goes too
      box_identity_.dump_dir = dir;
      WriteBoxIdentity();
    }
  }
  // One short line per rank per event (at 512 ranks the launcher's log is where users look):
  // what happened, then where the dump is; `ncclwatch run` / `analyze` tell the story.
  // A normal exit's record is news to nobody: said only at NCCLWATCH_LOG=info.
  auto log = reason == trace::DumpReason::Exit ? &LogInfo : &LogWarn;
  log("%s: %s (%s%s)", trace::DumpReasonName(reason), detail.empty() ? "-" : detail.c_str(),
      path.empty() ? "no dump written" : "dump ", path.substr(path.rfind('/') + 1).c_str());
}

void Runtime::AskPeersToDump(trace::DumpReason reason, uint64_t stuck_since_unix_ns) {
  // A request already there answers this episode only when it is this job's, asked for a stall
  // or an abort (a snapshot shows no hang), after the operation got stuck and with no recovery
  // since: every rank's answer to it was taken during this hang. Anything older would leave the
  // ranks' latest dumps from before the hang (thousands of ranks stalling at once still write
  // the file a few times, not thousands).
  const uint64_t now_unix = UnixNs();
  if (std::optional<trace::DumpRequest> there = dumps_->CurrentRequest()) {
    const uint64_t written = static_cast<uint64_t>(std::max<int64_t>(there->time_unix_ns, 0));
    const uint64_t recovered = last_recovery_mono_ns_.load();
    const bool recovered_since = recovered && now_unix > written && MonoNs() - recovered < now_unix - written;
    const bool hang_request = there->reason != trace::DumpReasonName(trace::DumpReason::OnDemand);
    if (there->job_instance == identity_.job_instance && hang_request && written >= stuck_since_unix_ns &&
        now_unix - std::min(now_unix, written) < timing::Ns(timing::kRequestFresh) && !recovered_since)
      return;
  }
  trace::DumpRequest r;
  r.request = identity_.host + "-" + std::to_string(identity_.pid) + "-" + std::to_string(requests_made_.fetch_add(1));
  r.origin_rank = global_rank_.load();
  r.origin_host = identity_.host;
  r.reason = trace::DumpReasonName(reason);
  r.job_instance = identity_.job_instance;
  r.time_unix_ns = static_cast<int64_t>(UnixNs());
  {
    std::lock_guard<std::mutex> lock(request_mu_);
    served_requests_.insert(r.request);
  }
  if (!dumps_->WriteRequest(r)) LogInfo("could not write the job-wide dump request in %s", dumps_->path().c_str());
}

void Runtime::OnStall(const InflightView& v, const std::string& detail) {
  stalls_.fetch_add(1);
  Dump(trace::DumpReason::Stall, detail, std::nullopt, v);
  AskPeersToDump(trace::DumpReason::Stall, UnixNs() - std::min(UnixNs(), static_cast<uint64_t>(v.age_s * 1e9)));
}

void Runtime::OnRecovery(const Recovery& r) {
  char line[256];
  snprintf(line, sizeof line, "%s seq %llu on comm %s completed after %.1f s (reported stalled at %.1f s)",
           trace::OpKindName(r.kind), static_cast<unsigned long long>(r.seq), CommIdHex(r.comm_id).c_str(),
           r.recovered_after_s, r.stalled_after_s);
  DumpExtra extra;
  extra.light = true;
  last_recovery_mono_ns_.store(MonoNs());
  Dump(trace::DumpReason::Recovery, line, std::nullopt, std::nullopt, extra);
}

void Runtime::OnNcclError(const char* function, int result, CommInfo* comm, bool async, const OpSnapshot* failed) {
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    if (!error_dumped_comms_.insert(comm ? comm->id : 0).second) return;
  }
  const char* text = Real().ncclGetErrorString ? Real().ncclGetErrorString(static_cast<ncclResult_t>(result)) : "";
  std::string detail = std::string(function) + (async ? " reported asynchronous error " : " returned ") +
                       std::to_string(result) + " (" + (text ? text : "") + ")" +
                       (comm ? " on comm " + CommIdHex(comm->id) : std::string());
  DumpExtra extra;
  extra.error_result = result;
  if (failed) {
    extra.failed = *failed;
    extra.failed->state = trace::OpState::Error;
    extra.failed->result = result;
  }
  Dump(async ? trace::DumpReason::AsyncError : trace::DumpReason::NcclError, detail, std::nullopt, std::nullopt,
       extra);
}

void Runtime::OnAbort(CommInfo* comm) {
  if (comm) {
    comm->live().state.store(CommState::Aborted);
    comm->live().ended_ns.store(MonoNs());
  }
  // Frameworks abort every communicator in a row: one dump for the lot.
  uint64_t now = MonoNs(), last = last_abort_dump_ns_.load();
  if (last && now - last < timing::Ns(timing::kAbortBurst)) return;
  last_abort_dump_ns_.store(now);
  Dump(trace::DumpReason::Abort,
       "ncclCommAbort called" + (comm ? " on comm " + CommIdHex(comm->id) : std::string()));
  // The operations it aborts got stuck within the framework's timeout: a request of the last
  // kRequestFresh covers it.
  AskPeersToDump(trace::DumpReason::Abort, UnixNs() - std::min(UnixNs(), timing::Ns(timing::kRequestFresh)));
}

void Runtime::WriteMetrics(uint64_t now) {
  metrics_->Count(*ring_);
  if (now < next_metrics_ns_) return;
  next_metrics_ns_ = now + timing::Ns(timing::kMetricsInterval);
  MetricsInput in;
  in.rank = global_rank_.load();
  for (CommInfo* c : comms_.All()) in.comms.push_back(c);
  in.ring = ring_.get();
  in.inflight = watchdog_->Inflight(0, now);
  in.stalls = stalls_.load();
  in.dumps = dumps_->written();
  in.nccl_version = nccl_version_;
  if (!metrics_->Write(in, now, UnixNs()) && !metrics_warned_) {
    metrics_warned_ = true;
    LogWarn("cannot write %s: %s; metrics are retried every %d s", metrics_->file().c_str(), strerror(errno),
            timing::Ms(timing::kMetricsInterval) / 1000);
  }
}

uint64_t Runtime::BeginInit(const char* function, uint64_t id, int size, int rank) {
  return watchdog_->setups().Begin(function, id, size, rank, MonoNs());
}

void Runtime::EndInit(uint64_t token) { watchdog_->setups().End(token); }

// A creation call past the default deadline is a setup hang: one stall dump per call, and the
// job-wide request (the ranks that never joined may be alive elsewhere and dump too).
void Runtime::CheckSetups(uint64_t now) {
  std::optional<SetupHang> hang = watchdog_->CheckSetups(now);
  if (!hang) return;
  stalls_.fetch_add(1);
  Dump(trace::DumpReason::Stall, hang->detail);
  AskPeersToDump(trace::DumpReason::Stall, UnixNs() - std::min(UnixNs(), static_cast<uint64_t>(hang->stuck_s * 1e9)));
}

void Runtime::OnTick() {
  static std::once_flag tid_once;
  std::call_once(tid_once, [] { SetWatchdogTid(CurrentTid()); });
  static thread_local bool marked_own = false;  // per thread: a forked child's watchdog is a new one
  if (!marked_own) {
    stacks::MarkOwnThread();
    marked_own = true;
  }
  if (quick_exit_.load(std::memory_order_acquire) == kQuickExitAsked) {  // _exit: its thread waits
    Quietly("the exit record", [&] {
      Finish(quick_exit_status_.load(), quick_exit_site_.load(), quick_exit_tid_.load(), /*on_watchdog=*/true);
    });
    quick_exit_.store(kQuickExitDone, std::memory_order_release);
    return;
  }
  if (finished_.load(std::memory_order_acquire)) return;
  trace::DumpReason reason;
  if (int sig = TakePendingSignal(&reason)) {
    Quietly("a signal's dump", [&] {
      Dump(reason, "signal " + SignalName(sig) + " (" + std::string(sigdescr_np(sig) ? sigdescr_np(sig) : "") + ")");
      // Its own end, dumped: the black box has nothing to add if the process dies now.
      if (box_ && reason != trace::DumpReason::OnDemand) box_->FinalDumpWritten(static_cast<int64_t>(MonoNs()));
    });
    DoneSignalDump();  // the handler waits no longer, dump or not
  }
  uint64_t now = MonoNs();
  if (box_keeper_) box_keeper_->Tend(now, watchdog_->last_poll_ns(), watchdog_->last_poll_recorded());
  if (!python_exit_watched_ && config_.python && config_.exit_record && now >= next_python_exit_try_ns_) {
    // From here, not the first NCCL call: the GIL may be busy; retried each second until had.
    python_exit_watched_ = stacks::WatchPythonExit(kBackgroundGilWaitMs);
    next_python_exit_try_ns_ = now + 1000000000ull;
  }
  ForgetEndedComms(now);
  if (metrics_) WriteMetrics(now);
  CheckSetups(now);
  if (now - last_peer_poll_ns_ < config_.peer_poll_ms * 1000000ull) return;
  last_peer_poll_ns_ = now;
  std::optional<trace::DumpRequest> req = relay_->Poll(dumps_.get(), identity_.job_instance, identity_.start_unix_ns);
  // The caretaker keeps a relay someone watches. Its identity is written under the dump lock.
  if (box_ && relay_->relay_path() != box_identity_.relay && LockWithin(dump_mu_, timing::Ms(timing::kDumpLockWait))) {
    std::lock_guard<std::mutex> lock(dump_mu_, std::adopt_lock);
    box_identity_.relay = relay_->relay_path();
    WriteBoxIdentity();
  }
  if (caretaker_) caretaker_->Tend(box_ ? box_->path().substr(box_->path().rfind('/') + 1) : std::string(),
                                   identity_.job_instance);
  if (!req) return;
  // Every new request is answered (within NCCLWATCH_MAX_DUMPS, which keeps the first dump and
  // the latest): a rank that dumped for an earlier stall must not answer the next one with that.
  {
    std::lock_guard<std::mutex> lock(request_mu_);
    if (!served_requests_.insert(req->request).second) return;
  }
  // `ncclwatch dump` writes origin rank -1 with reason on_demand; a rank that has no rank yet
  // (inside its first ncclCommInitRank) writes -1 with its own reason.
  const bool command = req->origin_rank < 0 && req->reason == trace::DumpReasonName(trace::DumpReason::OnDemand);
  Dump(trace::DumpReason::PeerRequest,
       command ? "asked by ncclwatch dump on " + req->origin_host
               : (req->origin_rank >= 0 ? "rank " + std::to_string(req->origin_rank) : std::string("a rank")) +
                     " on " + req->origin_host + " dumped (" + req->reason + ")",
       req);
}

}  // namespace ncclwatch

namespace ncclwatch {

void Runtime::WriteBoxIdentity() { box_->SetIdentity(blackbox::IdentityJson(box_identity_)); }

void Runtime::ForgetEndedComms(uint64_t now) {
  if (now < next_forget_check_ns_) return;
  next_forget_check_ns_ = now + timing::Ns(timing::kEndedCommCheck);
  if (comms_.EndedCount() <= timing::kEndedCommsKept) return;
  std::vector<const CommInfo*> in_use;
  if (!watchdog_->CommsInUse(timing::Ms(timing::kInflightLockWait), &in_use)) return;
  const uint64_t forget = timing::Ns(timing::kEndedCommForget);
  if (size_t n = comms_.ForgetEnded(timing::kEndedCommsKept, now > forget ? now - forget : 0, in_use))
    LogDebug("forgot %zu ended communicators (the newest %zu are kept)", n, timing::kEndedCommsKept);
}

}  // namespace ncclwatch
