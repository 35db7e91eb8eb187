#include "dump/dump_policy.h"

#include <algorithm>
#include <cstdio>

#include "common/clock.h"
#include "common/fd_room.h"
#include "common/memory_room.h"
#include "common/lock_within.h"
#include "common/log.h"
#include "common/real_nccl.h"
#include "common/timing.h"
#include "dump/dump_writer.h"
#include "format/display.h"
#include "format/trace_writer.h"

namespace ncclwatch {

bool DumpPolicy::Dump(trace::DumpReason reason, const std::string& detail,
                      const std::optional<trace::DumpRequest>& answered, const std::optional<InflightView>& stalled,
                      const DumpExtra& extra) {
  if (!LockWithin(dump_mu_, timing::Ms(timing::kDumpLockWait))) return false;
  std::lock_guard<std::mutex> lock(dump_mu_, std::adopt_lock);
  DumpDirectory& dumps = *p_.dumps;
  if (!extra.exit_record && dumps.LimitReached()) {  // the event is still said (the bound's own line comes once)
    LogWarn("%s: %s (no dump: NCCLWATCH_MAX_DUMPS reached)", trace::DumpReasonName(reason),
            detail.empty() ? "-" : detail.c_str());
    return false;
  }
  // The application's last descriptors stay its own: no dump, its event still said.
  int free = 0;
  if (!FdRoom(kFdsForDump, &free)) {
    LogWarn("%s: %s (no %s: only %d descriptor(s) free under RLIMIT_NOFILE %d, and ncclwatch leaves the last %d to "
            "the application)",
            trace::DumpReasonName(reason), detail.empty() ? "-" : detail.c_str(), extra.exit_record ? "exit record" : "dump",
            free, FdLimit(), kFdReserve);
    return false;
  }
  // Out of address space an allocation may crash (jemalloc): no dump, its event still said.
  if (!AddressSpaceRoom()) {
    LogWarn(
        "%s: %s (no %s: the process is out of address space, and an allocation now could crash it)",
        trace::DumpReasonName(reason), detail.empty() ? "-" : detail.c_str(), extra.exit_record ? "exit record" : "dump");
    return false;
  }
  DumpInput in = AssembleDumpInput(p_.sources, reason, detail, answered, stalled, extra);
  in.global_rank = p_.rank->global.load();
  in.world_size = p_.rank->world_size.load();
  in.dump_seq = dump_seq_++;
  in.time_unix_ns = UnixNs();
  in.time_mono_ns = MonoNs();
  std::string path = dumps.Write(
      DumpFileStem(in), [&](const trace::TextSink& sink) { return StreamDump(in, sink); },
      /*counted=*/!extra.exit_record);
  const std::string dir = path.empty() ? std::string() : path.substr(0, path.rfind('/'));
  if (!dir.empty() && !temporaries_swept_) {  // what earlier processes of this host left mid-dump
    temporaries_swept_ = true;
    if (int n = RemoveStaleTemporaries(dir, p_.sources.identity->host))
      LogInfo("removed %d partial dump file(s) that dead processes of this host left", n);
  }
  if (!dir.empty() && p_.dump_written) p_.dump_written(dir);
  // One short line per rank per event (at 512 ranks the launcher's log is where users look):
  // what happened, then where the dump is; `analyze` tells the story. Under `ncclwatch run`,
  // which says how many ranks dumped and gives the verdict, and for a normal exit's record (news
  // to nobody), the line is said only at NCCLWATCH_LOG=info: thousands of ranks' lines must not
  // bury the verdict.
  const bool run_tells = !p_.sources.config->run_id.empty();
  auto log = reason == trace::DumpReason::Exit || run_tells ? &LogInfo : &LogWarn;
  log("%s: %s (%s%s)", trace::DumpReasonName(reason), detail.empty() ? "-" : detail.c_str(),
      path.empty() ? "no dump written" : "dump ", path.substr(path.rfind('/') + 1).c_str());
  return !path.empty();
}

void DumpPolicy::AskPeersToDump(trace::DumpReason reason, uint64_t stuck_since_unix_ns) {
  // A request already there answers this episode only when it is this job's, asked for a stall
  // or an abort (a snapshot shows no hang), after the operation got stuck and with no recovery
  // since: every rank's answer to it was taken during this hang. Anything older would leave the
  // ranks' latest dumps from before the hang (thousands of ranks stalling at once still write
  // the file a few times, not thousands).
  const ProcessIdentity& identity = *p_.sources.identity;
  const uint64_t now_unix = UnixNs();
  if (std::optional<trace::DumpRequest> there = p_.dumps->CurrentRequest()) {
    const uint64_t written = static_cast<uint64_t>(std::max<int64_t>(there->time_unix_ns, 0));
    const uint64_t recovered = last_recovery_mono_ns_.load();
    const bool recovered_since = recovered && now_unix > written && MonoNs() - recovered < now_unix - written;
    const bool hang_request = there->reason != trace::DumpReasonName(trace::DumpReason::OnDemand);
    if (there->job_instance == identity.job_instance && hang_request && written >= stuck_since_unix_ns &&
        now_unix - std::min(now_unix, written) < timing::Ns(timing::kRequestFresh) && !recovered_since)
      return;
  }
  trace::DumpRequest r;
  r.request = identity.host + "-" + std::to_string(identity.pid) + "-" + std::to_string(requests_made_.fetch_add(1));
  r.origin_rank = p_.rank->global.load();
  r.origin_host = identity.host;
  r.reason = trace::DumpReasonName(reason);
  r.job_instance = identity.job_instance;
  r.time_unix_ns = static_cast<int64_t>(UnixNs());
  {
    std::lock_guard<std::mutex> lock(request_mu_);
    served_requests_.insert(r.request);
  }
  if (!p_.dumps->WriteRequest(r)) LogInfo("could not write the job-wide dump request in %s", p_.dumps->path().c_str());
}

void DumpPolicy::OnStall(const InflightView& v, const std::string& detail) {
  stalls_.fetch_add(1);
  Dump(trace::DumpReason::Stall, detail, std::nullopt, v);
  AskPeersToDump(trace::DumpReason::Stall, UnixNs() - std::min(UnixNs(), static_cast<uint64_t>(v.age_s * 1e9)));
}

void DumpPolicy::OnRecovery(const Recovery& r) {
  char line[256];
  snprintf(line, sizeof line, "%s seq %llu on comm %s completed after %.1f s (reported stalled at %.1f s)",
           trace::OpKindName(r.kind), static_cast<unsigned long long>(r.seq), CommIdHex(r.comm_id).c_str(),
           r.recovered_after_s, r.stalled_after_s);
  DumpExtra extra;
  extra.light = true;
  last_recovery_mono_ns_.store(MonoNs());
  Dump(trace::DumpReason::Recovery, line, std::nullopt, std::nullopt, extra);
}

void DumpPolicy::OnNcclError(const char* function, int result, const CommInfo* comm, bool async,
                             const OpSnapshot* failed) {
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

void DumpPolicy::OnAbort(const CommInfo* comm) {
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

// A creation call past the default deadline is a setup hang: one stall dump per call, and the
// job-wide request (the ranks that never joined may be alive elsewhere and dump too).
uint64_t DumpPolicy::CheckSetups(uint64_t now) {
  if (std::optional<SetupHang> hang = p_.sources.watchdog->CheckSetups(now)) {
    stalls_.fetch_add(1);
    Dump(trace::DumpReason::Stall, hang->detail);
    AskPeersToDump(trace::DumpReason::Stall,
                   UnixNs() - std::min(UnixNs(), static_cast<uint64_t>(hang->stuck_s * 1e9)));
  }
  return now;  // every tick
}

uint64_t DumpPolicy::AnswerPeers(uint64_t now) {
  const uint64_t next = now + p_.sources.config->peer_poll_ms * 1000000ull;
  const ProcessIdentity& identity = *p_.sources.identity;
  std::optional<trace::DumpRequest> req = p_.relay->Poll(p_.dumps, identity.job_instance, identity.start_unix_ns);
  if (!req) return next;
  // Every new request is answered (within NCCLWATCH_MAX_DUMPS, which keeps the first dump and
  // the latest): a rank that dumped for an earlier stall must not answer the next one with that.
  {
    std::lock_guard<std::mutex> lock(request_mu_);
    if (!served_requests_.insert(req->request).second) return next;
  }
  // `ncclwatch dump` writes origin rank -1 with reason on_demand; a rank that has no rank yet
  // (inside its first ncclCommInitRank) writes -1 with its own reason.
  const bool command = trace::AskedByCommand(req->origin_rank, req->reason);
  Dump(trace::DumpReason::PeerRequest,
       command ? "asked by ncclwatch dump on " + req->origin_host
               : (req->origin_rank >= 0 ? "rank " + std::to_string(req->origin_rank) : std::string("a rank")) +
                     " on " + req->origin_host + " dumped (" + req->reason + ")",
       req);
  return next;
}

}  // namespace ncclwatch
