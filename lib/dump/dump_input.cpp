#include "dump/dump_input.h"

#include <set>

#include "common/signal_frames.h"
#include "common/thread_id.h"
#include "common/timing.h"
#include "stacks/stacks.h"

namespace ncclwatch {
namespace {

// Ring entries an exit record keeps: the rank's last operations.
constexpr size_t kExitRecordRingTail = 64;

// A thread waiting in our signal handler for this very dump shows our handler on top of the
// signal trampoline: what it was doing is below the trampoline.
std::vector<uintptr_t> WithoutOwnHandler(const std::vector<uintptr_t>& ips) {
  uintptr_t tramp = SignalTrampoline();
  if (!tramp) return ips;
  for (size_t i = 1; i < ips.size(); ++i) {
    if (ips[i] < tramp || ips[i] > tramp + 16) continue;
    bool ours = false;
    for (size_t j = 0; j < i && !ours; ++j) ours = InOurLibrary(ips[j]);
    if (ours) return std::vector<uintptr_t>(ips.begin() + static_cast<long>(i) + 1, ips.end());
  }
  return ips;
}

// A thread's stack as the application's (no ncclwatch frames on top), symbolized. A signalled
// thread's first ip is the instruction it was interrupted at, and so is the ip right below a
// signal trampoline (the faulting frame under a fatal signal's handler): those are looked up
// as they are; every other ip is a return address.
std::vector<trace::NativeFrame> SymbolizedThread(const stacks::ThreadStack& t, bool signalled) {
  const std::vector<uintptr_t>& raw = t.ips;
  const std::vector<uintptr_t> ips = t.own ? raw : stacks::WithoutOwnFrames(WithoutOwnHandler(raw));
  const size_t skipped = raw.size() - ips.size();  // both cut from the top only
  const uintptr_t tramp = SignalTrampoline();
  std::vector<trace::NativeFrame> out;
  out.reserve(ips.size());
  for (size_t i = 0; i < ips.size(); ++i) {
    const size_t r = skipped + i;
    const bool below_trampoline = r > 0 && tramp && raw[r - 1] >= tramp && raw[r - 1] <= tramp + 16;
    out.push_back(stacks::Symbolize(ips[i], (r == 0 && signalled) || below_trampoline));
  }
  return out;
}

}  // namespace

std::vector<trace::NativeFrame> Symbolized(const std::vector<uintptr_t>& ips) {
  std::vector<trace::NativeFrame> out;
  out.reserve(ips.size());
  for (uintptr_t ip : ips) out.push_back(stacks::Symbolize(ip));
  return out;
}

DumpInput AssembleDumpInput(const DumpSources& src, trace::DumpReason reason, const std::string& detail,
                            const std::optional<trace::DumpRequest>& answered, const std::optional<InflightView>& stalled,
                            const DumpExtra& extra) {
  DumpInput in;
  in.reason = reason;
  in.detail = detail;
  in.answered = answered;
  in.identity = *src.identity;
  in.nccl_version = src.nccl_version;
  in.cuda_driver_version = src.cuda_driver_version;
  in.start_mono_ns = src.start_mono_ns;
  in.config = src.config;
  for (CommInfo* c : src.comms->All()) in.comms.push_back(c);
  for (const PendingInit& p : src.watchdog->setups().Pending()) in.initializing.push_back({p.id, p.size, p.rank});
  in.in_nccl = src.threads->InsideNccl();
  in.inflight = src.watchdog->Inflight(timing::Ms(timing::kInflightLockWait));
  in.stalled = stalled;
  in.failed = extra.failed;
  in.exit_status = extra.exit_status;
  in.error_result = extra.error_result;
  in.exception = extra.exception;
  in.recoveries = src.watchdog->Recoveries();
  in.light = extra.light;
  in.ring_capacity = src.ring->capacity();
  in.ring_recorded = src.ring->recorded();
  in.ring_overwritten = src.ring->overwritten();
  if (!extra.light) {
    in.environment = RelevantEnvironment();
    in.exe = ExecutablePath();
    if (src.config->cmdline) in.cmdline = CommandLine();
    in.cwd = WorkingDirectory();
    // The live ring is read one entry at a time, here and while writing: no copy of it.
    in.live_ring = src.ring;
    in.ring_to = src.ring->recorded();
    in.ring_from = in.ring_to > src.ring->capacity() ? in.ring_to - src.ring->capacity() : 0;
    if (extra.exit_record && in.ring_to - in.ring_from > kExitRecordRingTail)  // what it did last is enough
      in.ring_from = in.ring_to - kExitRecordRingTail;
    std::set<int32_t> sites;  // bounded by the call-site table
    OpSnapshot entry;
    for (uint64_t i = in.ring_from; i < in.ring_to; ++i)
      if (src.ring->Read(i, &entry) && entry.callsite >= 0) sites.insert(entry.callsite);
    for (auto& v : in.inflight)
      if (v.op.callsite >= 0) sites.insert(v.op.callsite);
    const int gil_wait = extra.exiting_tid != 0 ? timing::Ms(timing::kBackgroundGilWait) : static_cast<int>(src.config->gil_timeout_ms);
    for (int32_t id : sites) {
      stacks::Callsite cs;
      if (!stacks::GetCallsite(id, &cs, gil_wait)) continue;
      in.callsites.push_back({id, {Symbolized(cs.ips), std::move(cs.python)}, cs.note, cs.driven_from});
    }
    if (extra.exit_record && src.config->stacks) {  // the exiting thread only: no signals to the others
      stacks::Callsite cs;
      // _exit: captured by the exiting thread, written here by the watchdog.
      const bool handed = extra.exiting_tid != 0;
      int32_t id = handed ? extra.exiting_site : stacks::CaptureCallsite(0, stacks::kMaxNativeFrames);
      if (id >= 0 && stacks::GetCallsite(id, &cs, gil_wait)) {
        if (!cs.driven_from.empty()) cs.python.clear();  // a thread's own stack: not its driver's
        in.threads.push_back({handed ? extra.exiting_tid : CurrentTid(), "exiting thread",
                              {Symbolized(cs.ips), std::move(cs.python)}, cs.note});
      }
    } else if (src.config->stacks) {
      std::string note;
      // The stacks a report shows: the main thread's and those of the threads that call NCCL
      // (the one that issued the culprit's last call among them). Others keep their Python
      // stacks, which need no signal; their sleeps and polls are not cut short.
      std::vector<int> sampled = src.threads->Threads();
      sampled.push_back(src.identity->pid);
      for (auto& t : stacks::CaptureAllThreads(timing::Ms(timing::kThreadStackWait), src.config->python,
                                               static_cast<int>(src.config->gil_timeout_ms), &note, &sampled))
        in.threads.push_back({t.tid, t.name, {SymbolizedThread(t, t.tid != CurrentTid()), std::move(t.python)},
                              t.note, t.own});
    }
  }
  return in;
}

}  // namespace ncclwatch
