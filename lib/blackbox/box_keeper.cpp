#include "blackbox/box_keeper.h"

#include "common/clock.h"
#include "common/log.h"
#include "common/memory_room.h"
#include "common/timing.h"
#include "dump/dump_input.h"
#include "format/trace_writer.h"
#include "stacks/stacks.h"

namespace ncclwatch {
namespace blackbox {
namespace {

// A new call site's Python frames may wait for the GIL: tried at this many ticks.
constexpr int kCallsiteRetries = 3;
// How long the thread that interned a new Python call site waits for the GIL to name it (it
// holds the GIL, or released it for its NCCL call: normally no wait at all).
constexpr int kFirstSightGilWaitMs = 20;

// The black box that new call sites' raw addresses go to (stacks::NewCallsiteHook).
std::atomic<BlackBox*> g_sites_box{nullptr};
void RecordBoxCallsite(int32_t id, const uintptr_t* ips, int native_depth, int python_depth) {
  if (BlackBox* box = g_sites_box.load(std::memory_order_acquire))
    box->RecordRawCallsite(id, ips, native_depth, python_depth);
}
// The keeper that names new Python call sites (stacks::NewPythonCallsiteHook).
std::atomic<BoxKeeper*> g_sites_keeper{nullptr};
void NameBoxCallsite(int32_t id) {
  if (BoxKeeper* keeper = g_sites_keeper.load(std::memory_order_acquire)) keeper->NameAtFirstSight(id);
}

}  // namespace

BoxKeeper::BoxKeeper(BlackBox* box, ThreadRegistry* threads, const RequestRelay* relay, BoxIdentity identity)
    : box_(box), threads_(threads), relay_(relay), identity_(std::move(identity)) {
  {
    std::lock_guard<std::mutex> lock(id_mu_);
    WriteIdentity();
  }
  WriteModules();
  g_sites_box.store(box_, std::memory_order_release);
  stacks::SetNewCallsiteHook(&RecordBoxCallsite);
  g_sites_keeper.store(this, std::memory_order_release);
  stacks::SetNewPythonCallsiteHook(&NameBoxCallsite);
}

void BoxKeeper::ForgetInChild() {
  g_sites_box.store(nullptr, std::memory_order_release);
  g_sites_keeper.store(nullptr, std::memory_order_release);
}

void BoxKeeper::NameAtFirstSight(int32_t id) {
  stacks::Callsite cs;
  // Unnamed (the GIL not had in time, the code gone): the watchdog's tick tries again.
  if (!stacks::GetCallsite(id, &cs, kFirstSightGilWaitMs) || !cs.note.empty() || cs.python.empty()) return;
  // Its Python frames alone: the native ones are the box's raw addresses until the watchdog
  // writes the whole call site (the caretaker symbolizes them for a process gone before that).
  trace::Document one;
  one.detail.callsites.push_back({id, {{}, std::move(cs.python)}, std::string(), cs.driven_from});
  const std::string text = trace::WriteDocument(one);
  std::lock_guard<std::mutex> lock(sites_mu_);
  box_->AppendCallsite(text);
}

void BoxKeeper::WriteIdentity() { box_->SetIdentity(IdentityJson(identity_)); }

void BoxKeeper::DumpWritten(const std::string& dir) {
  box_->CountDump();
  std::lock_guard<std::mutex> lock(id_mu_);
  if (dir == identity_.dump_dir) return;
  identity_.dump_dir = dir;
  identity_.dump_anchor = dir;  // it exists now
  WriteIdentity();
}

void BoxKeeper::WriteModules() {
  modules_generation_ = stacks::ModulesGeneration();
  std::vector<BoxModule> modules;
  for (const stacks::LoadedModule& m : stacks::LoadedModules())
    modules.push_back({m.bias, m.lo, m.hi, m.own, m.build_id, m.path});
  box_->SetModules(ModulesText(modules));
}

void BoxKeeper::Tend(uint64_t now, uint64_t poll_ns, uint64_t poll_recorded) {
  box_->Alive(static_cast<int64_t>(UnixNs()), static_cast<int64_t>(now), static_cast<int64_t>(poll_ns), poll_recorded);
  threads_->NameCalls();
  // The caretaker keeps a relay someone watches: the relay this process found goes in.
  if (relay_ && relay_->relay_path() != identity_.relay) {  // identity_.relay: written on this thread only
    std::lock_guard<std::mutex> lock(id_mu_);
    identity_.relay = relay_->relay_path();
    WriteIdentity();
  }
  // dlopen, dlclose: checked every timing::kModulesCheck.
  if (now >= next_modules_check_ns_) {
    next_modules_check_ns_ = now + timing::Ns(timing::kModulesCheck);
    if (stacks::ModulesGeneration() != modules_generation_) WriteModules();
    box_->KeepLocked();  // the application may have closed its descriptor (and so its lock)
  }
  // Call sites interned since the last poll, resolved to text now: after a SIGKILL nobody can.
  // A new one's text is allocated: only with address space to spare (else at a later tick).
  const size_t count = stacks::CallsiteCount();
  if (sites_next_ < count && !AddressSpaceRoom()) return;
  while (sites_next_ < count) {
    const auto id = static_cast<int32_t>(sites_next_);
    stacks::Callsite cs;
    const bool known = stacks::GetCallsite(id, &cs, timing::Ms(timing::kBackgroundGilWait));
    // Not published yet (being interned), or its Python frames wait for the GIL: next poll.
    if ((!known || !cs.note.empty()) && ++site_retries_ < kCallsiteRetries) break;
    site_retries_ = 0;
    ++sites_next_;
    if (!known) continue;  // an id that lost an interning race: never published
    trace::Document one;
    one.detail.callsites.push_back({id, {Symbolized(cs.ips), std::move(cs.python)}, cs.note, cs.driven_from});
    const std::string text = trace::WriteDocument(one);
    std::unique_lock<std::mutex> lock(sites_mu_);
    if (!box_->AppendCallsite(text)) {
      if (!full_logged_) LogInfo("black box: no room for call sites past %d", id);
      full_logged_ = true;
      sites_next_ = count;
    }
  }
}

BoxIdentity DescribeProcess(const ProcessIdentity& id, const Config& config, uint64_t start_mono_ns, int nccl_version,
                            int cuda_driver_version, const std::string& start_dir) {
  BoxIdentity b;
  b.host = id.host;
  b.pid = id.pid;
  b.local_rank = id.local_rank;
  b.job_id = id.job_id;
  b.job_instance = id.job_instance;
  b.process_uid = id.process_uid;
  b.start_unix_ns = static_cast<int64_t>(id.start_unix_ns);
  b.start_mono_ns = static_cast<int64_t>(start_mono_ns);
  b.start_ticks = ReadProcStat(id.pid).start_ticks;  // an execve keeps it: see OwnerOf
  b.nccl_version = nccl_version;
  b.cuda_driver_version = cuda_driver_version;
  b.exe = ExecutablePath();
  b.cwd = start_dir;
  if (config.cmdline) b.cmdline = CommandLine();
  b.environment = RelevantEnvironment();
  // Absolute: the caretaker that writes its postmortem runs in another directory.
  b.dump_dir = config.dir.empty() || config.dir[0] == '/' ? config.dir : start_dir + "/" + config.dir;
  b.dump_fallback = DefaultDumpDir(id);
  return b;
}

}  // namespace blackbox
}  // namespace ncclwatch
