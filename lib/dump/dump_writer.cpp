#include "dump/dump_writer.h"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "ncclwatch/version.h"

namespace ncclwatch {
namespace {

using Json = nlohmann::ordered_json;
namespace k = trace::key;

std::string Hex(uint64_t v) {
  char buf[24];
  snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

Json OpJson(const OpSnapshot& o) {
  Json j;
  j[k::kComm] = CommIdHex(o.comm_id);
  j[k::kSeq] = o.seq;
  j[k::kP2pSeq] = o.p2p_seq;
  j[k::kOp] = trace::OpKindName(o.kind);
  j[k::kCount] = o.count;
  j[k::kDtype] = trace::DatatypeName(o.dtype);
  j[k::kBytes] = o.bytes;
  const char* redop = trace::RedOpName(o.redop);
  j[k::kRedop] = redop ? Json(redop) : Json(nullptr);
  j[k::kRoot] = o.root;
  j[k::kPeer] = o.peer;
  j[k::kStream] = Hex(o.stream);
  j[k::kGroup] = o.group;
  j[k::kTid] = o.tid;
  j[k::kEnqueueNs] = o.enqueue_ns;
  j[k::kGpuReachedNs] = o.gpu_reached_ns;
  j[k::kCompletedNs] = o.completed_ns;
  j[k::kState] = trace::OpStateName(o.state);
  j[k::kResult] = o.result;
  j[k::kCallsite] = o.callsite;
  if (o.gpu_ms >= 0) j[k::kGpuMs] = o.gpu_ms;
  return j;
}

Json InflightJson(const InflightView& v) {
  Json j = OpJson(v.op);
  j[k::kAgeS] = v.age_s;
  j[k::kDeadlineS] = v.deadline_s;
  return j;
}

Json FramesJson(const std::vector<FrameOut>& frames) {
  Json a = Json::array();
  for (auto& f : frames)
    a.push_back({{k::kIp, Hex(f.ip)}, {k::kModule, f.module}, {k::kSymbol, f.symbol}, {k::kOffset, f.offset}});
  return a;
}

Json PythonJson(const std::vector<PyFrameOut>& frames) {
  Json a = Json::array();
  for (auto& f : frames)
    a.push_back({{k::kFile, f.file}, {k::kLine, f.line}, {k::kFunction, f.function}, {k::kLibrary, f.library}});
  return a;
}

// What both communicator lists start with.
Json CommIdentityJson(const CommInfo* c) {
  Json j;
  j[k::kId] = CommIdHex(c->id);
  j[k::kSize] = c->size;
  j[k::kRank] = c->rank;
  j[k::kName] = c->name;
  j[k::kState] = CommStateName(c->state.load());
  return j;
}

Json SummaryJson(const DumpInput& in) {
  Json s;
  s[k::kRank] = in.global_rank;
  s[k::kLocalRank] = in.identity.local_rank;
  s[k::kWorldSize] = in.world_size;
  s[k::kHost] = in.identity.host;
  s[k::kPid] = in.identity.pid;
  s[k::kDumpSeq] = in.dump_seq;
  s[k::kReason] = trace::DumpReasonName(in.reason);
  s[k::kDetail] = in.detail;
  if (in.trigger) {
    s[k::kTrigger] = {{k::kRequest, in.trigger->request},
                      {k::kOriginRank, in.trigger->origin_rank},
                      {k::kOriginHost, in.trigger->origin_host},
                      {k::kReason, in.trigger->reason}};
  } else {
    s[k::kTrigger] = nullptr;
  }
  s[k::kTimeUnixNs] = in.time_unix_ns;
  s[k::kTimeMonoNs] = in.time_mono_ns;
  s[k::kStartMonoNs] = in.start_mono_ns;
  s[k::kNcclVersion] = in.nccl_version;
  Json calls = Json::array();
  for (auto& c : in.in_nccl) {
    double since = in.time_mono_ns > c.since_ns ? static_cast<double>(in.time_mono_ns - c.since_ns) / 1e9 : 0;
    calls.push_back({{k::kTid, c.tid}, {k::kFunction, c.function}, {k::kSinceS, since}});
  }
  s[k::kInNccl] = calls;
  Json comms = Json::array();
  for (const CommInfo* c : in.comms) {
    Json cj = CommIdentityJson(c);
    cj[k::kLastEnqueued] = c->last_enqueued.load();
    cj[k::kLastGpuReached] = c->last_gpu_reached.load();
    cj[k::kLastCompleted] = c->last_completed.load();
    Json p2p = Json::array();
    for (int p = 0; c->peers && p < c->size; ++p) {
      const PeerCounters& pc = c->peers[p];
      uint64_t se = pc.send_enqueued.load(), sc = pc.send_completed.load();
      uint64_t re = pc.recv_enqueued.load(), rc = pc.recv_completed.load();
      if (se || re)
        p2p.push_back({{k::kPeer, p}, {k::kSendEnqueued, se}, {k::kSendCompleted, sc},
                       {k::kRecvEnqueued, re}, {k::kRecvCompleted, rc}});
    }
    cj[k::kP2p] = p2p;
    comms.push_back(cj);
  }
  s[k::kComms] = comms;
  Json inflight = Json::array();
  for (auto& v : in.inflight) inflight.push_back(InflightJson(v));
  s[k::kInFlight] = inflight;
  s[k::kStalled] = in.stalled && in.stalled->op.comm_id ? InflightJson(*in.stalled) : Json(nullptr);
  s[k::kRingOverwritten] = in.ring_overwritten;
  return s;
}

}  // namespace

std::string DumpFileStem(int global_rank, const std::string& host, int pid, uint64_t dump_seq,
                         trace::DumpReason reason) {
  std::string safe_host;
  for (char c : host) safe_host += (isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_') ? c : '_';
  char rank[16];
  if (global_rank >= 0)
    snprintf(rank, sizeof rank, "%05d", global_rank);
  else
    snprintf(rank, sizeof rank, "x");
  return std::string(trace::kDumpFilePrefix) + rank + "-" + safe_host + "-" + std::to_string(pid) + "-" +
         std::to_string(dump_seq) + "-" + trace::DumpReasonName(reason);
}

std::string SerializeDump(const DumpInput& in) {
  Json root;
  root[k::kFormat] = trace::kFormatName;
  root[k::kVersion] = trace::kTraceVersion;
  root[k::kSummary] = SummaryJson(in);
  if (!in.light) {
    Json proc;
    proc[k::kExe] = in.exe;
    proc[k::kCmdline] = in.cmdline;
    proc[k::kCwd] = in.cwd;
    Json env = Json::object();
    for (auto& kv : in.environment) env[kv.first] = kv.second;
    proc[k::kEnv] = env;
    proc[k::kCudaDriverVersion] = in.cuda_driver_version;
    proc[k::kNcclwatchVersion] = kNcclwatchVersion;
    Json cfg = Json::object();
    if (in.config)
      for (auto& kv : DescribeConfig(*in.config)) cfg[kv.first] = kv.second;
    proc[k::kConfig] = cfg;
    root[k::kProcess] = proc;

    Json comms = Json::array();
    for (const CommInfo* c : in.comms) {
      Json cj = CommIdentityJson(c);
      cj[k::kDevice] = c->device;
      cj[k::kKind] = CommKindName(c->kind);
      cj[k::kParent] = c->parent_id ? Json(CommIdHex(c->parent_id)) : Json(nullptr);
      cj[k::kColor] = c->color;
      cj[k::kKey] = c->key;
      cj[k::kBlocking] = c->blocking;
      cj[k::kCreatedMonoNs] = c->created_ns;
      cj[k::kEndedMonoNs] = c->ended_ns.load();
      comms.push_back(cj);
    }
    root[k::kCommunicators] = comms;

    Json ring;
    ring[k::kCapacity] = in.ring_capacity;
    ring[k::kRecorded] = in.ring_recorded;
    ring[k::kOverwritten] = in.ring_overwritten;
    Json entries = Json::array();
    for (auto& o : in.ring) entries.push_back(OpJson(o));
    ring[k::kEntries] = std::move(entries);
    root[k::kRing] = std::move(ring);

    Json callsites = Json::array();
    for (auto& c : in.callsites)
      callsites.push_back({{k::kId, c.id},
                           {k::kFrames, FramesJson(c.frames)},
                           {k::kPython, PythonJson(c.python)},
                           {k::kNote, c.note}});
    root[k::kCallsites] = std::move(callsites);

    Json threads = Json::array();
    for (auto& t : in.threads) {
      Json tj;
      tj[k::kTid] = t.tid;
      tj[k::kName] = t.name;
      tj[k::kFrames] = FramesJson(t.frames);
      tj[k::kPython] = PythonJson(t.python);
      tj[k::kNote] = t.note;
      threads.push_back(std::move(tj));
    }
    root[k::kThreads] = std::move(threads);
  }
  Json rec = Json::array();
  for (auto& r : in.recoveries)
    rec.push_back({{k::kComm, CommIdHex(r.comm_id)},
                   {k::kSeq, r.seq},
                   {k::kOp, trace::OpKindName(r.kind)},
                   {k::kStalledAfterS, r.stalled_after_s},
                   {k::kRecoveredAfterS, r.recovered_after_s}});
  root[k::kRecoveries] = rec;
  // Invalid UTF-8 (a stray byte in an environment value or a symbol) is replaced, never fatal.
  return root.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

}  // namespace ncclwatch
