#include "dump/dump_writer.h"

#include <cstdio>

#include "format/file_name.h"
#include "format/hex.h"
#include "format/trace_writer.h"
#include "ncclwatch/version.h"

namespace ncclwatch {

namespace {

// Whether the process drives several ranks (several devices, one communicator id held as
// several ranks): its operations and communicator summaries then say whose they are.
bool SeveralRanks(const DumpInput& in) {
  for (size_t i = 0; i < in.comms.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (in.comms[i]->id == in.comms[j]->id && in.comms[i]->rank != in.comms[j]->rank) return true;
  return false;
}

trace::Op OpRecordFor(const OpSnapshot& o, bool several_ranks) {
  trace::Op r = OpRecordOf(o);
  if (several_ranks) r.comm_rank = o.comm_rank;
  return r;
}

trace::Op InflightRecordFor(const InflightView& v, bool several_ranks) {
  trace::Op r = InflightRecordOf(v);
  if (several_ranks) r.comm_rank = v.op.comm_rank;
  return r;
}

trace::Summary SummaryOf(const DumpInput& in, bool several) {
  trace::Summary s;
  s.rank = in.global_rank;
  s.local_rank = in.identity.local_rank;
  s.world_size = in.world_size;
  s.host = in.identity.host;
  s.pid = in.identity.pid;
  s.dump_seq = static_cast<int64_t>(in.dump_seq);
  s.reason = trace::DumpReasonValue::Of(in.reason);
  s.detail = in.detail;
  if (in.answered)
    s.answered = trace::AnsweredRequest{in.answered->request, in.answered->origin_rank, in.answered->origin_host,
                               in.answered->reason};
  s.time_unix_ns = static_cast<int64_t>(in.time_unix_ns);
  s.time_mono_ns = static_cast<int64_t>(in.time_mono_ns);
  s.start_mono_ns = static_cast<int64_t>(in.start_mono_ns);
  s.nccl_version = in.nccl_version;
  for (auto& c : in.in_nccl) {
    double since = in.time_mono_ns > c.since_ns ? static_cast<double>(in.time_mono_ns - c.since_ns) / 1e9 : 0;
    s.in_nccl.push_back({c.tid, c.function, since});
  }
  for (const CommInfo* c : in.comms) {
    trace::CommSummary cs;
    cs.id = CommIdHex(c->id);
    cs.size = c->size;
    cs.rank = c->rank;
    if (several) cs.device = c->device;
    cs.name = c->name;
    cs.state = CommStateName(c->live().state.load());
    cs.last_enqueued = static_cast<int64_t>(c->live().last_enqueued.load());
    cs.last_gpu_reached = static_cast<int64_t>(c->live().last_gpu_reached.load());
    cs.last_completed = static_cast<int64_t>(c->live().last_completed.load());
    for (int p = 0; c->peers && p < c->size; ++p) {
      const PeerCounters& pc = c->peers[p];
      uint64_t se = pc.send_enqueued.load(), sc = pc.send_completed.load();
      uint64_t re = pc.recv_enqueued.load(), rc = pc.recv_completed.load();
      if (se || re)  // only peers with traffic
        cs.p2p.push_back({p, static_cast<int64_t>(se), static_cast<int64_t>(sc), static_cast<int64_t>(re),
                          static_cast<int64_t>(rc)});
    }
    s.comms.push_back(std::move(cs));
  }
  for (const auto& p : in.initializing) {
    trace::CommSummary cs;
    cs.id = CommIdHex(p.id);
    cs.size = p.size;
    cs.rank = p.rank;
    cs.state = trace::CommStateName(trace::CommState::Initializing);
    s.comms.push_back(std::move(cs));
  }
  for (auto& v : in.inflight) s.in_flight.push_back(InflightRecordFor(v, several));
  if (in.stalled && in.stalled->op.comm_id) s.stalled = InflightRecordFor(*in.stalled, several);
  s.ring_overwritten = static_cast<int64_t>(in.ring_overwritten);
  s.process_uid = in.identity.process_uid;
  s.job_instance = in.identity.job_instance;
  s.start_unix_ns = static_cast<int64_t>(in.identity.start_unix_ns);
  s.exit_status = in.exit_status;
  s.error_result = in.error_result;
  s.states_as_of_mono_ns = in.states_as_of_mono_ns;
  s.exception = in.exception;
  s.stopped = in.stopped;
  if (in.failed) s.failed = OpRecordFor(*in.failed, several);
  return s;
}

trace::Communicator CommunicatorOf(const CommInfo* c) {
  trace::Communicator r;
  r.id = CommIdHex(c->id);
  r.size = c->size;
  r.rank = c->rank;
  r.name = c->name;
  r.state = CommStateName(c->live().state.load());
  r.device = c->device;
  r.kind = CommKindName(c->kind);
  if (c->parent_id) r.parent = CommIdHex(c->parent_id);
  r.color = c->color;
  r.key = c->key;
  r.blocking = c->blocking != 0;
  r.created_mono_ns = static_cast<int64_t>(c->created_ns);
  r.ended_mono_ns = static_cast<int64_t>(c->live().ended_ns.load());
  return r;
}

}  // namespace

trace::Op OpRecordOf(const OpSnapshot& o) {
  trace::Op r;
  r.comm = CommIdHex(o.comm_id);
  r.seq = static_cast<int64_t>(o.seq);
  r.p2p_seq = static_cast<int64_t>(o.p2p_seq);
  r.SetKind(o.kind);
  r.count = static_cast<int64_t>(o.count);
  r.dtype = trace::DatatypeName(o.dtype);
  r.bytes = static_cast<int64_t>(o.bytes);
  if (const char* redop = trace::RedOpName(o.redop)) r.redop = redop;
  r.root = o.root;
  r.peer = o.peer;
  r.stream = trace::HexNumber(o.stream);
  r.group = static_cast<int64_t>(o.group);
  r.tid = o.tid;
  r.enqueue_ns = static_cast<int64_t>(o.enqueue_ns);
  r.gpu_reached_ns = static_cast<int64_t>(o.gpu_reached_ns);
  r.completed_ns = static_cast<int64_t>(o.completed_ns);
  r.state = trace::OpStateValue::Of(o.state);
  r.result = o.result;
  r.callsite = o.callsite;
  r.gpu_ms = o.gpu_ms;
  return r;
}

trace::Op InflightRecordOf(const InflightView& v) {
  trace::Op r = OpRecordOf(v.op);
  r.age_s = v.age_s;
  r.deadline_s = v.deadline_s;
  if (v.captured) r.replays = static_cast<int64_t>(v.replays);
  return r;
}

std::string DumpFileStem(const DumpInput& in) {
  return trace::DumpFileStem(in.global_rank, in.identity.host, in.identity.pid, static_cast<int64_t>(in.dump_seq),
                             trace::DumpReasonName(in.reason));
}

bool StreamDump(const DumpInput& in, const trace::TextSink& sink) {
  trace::Document doc;
  const bool several = SeveralRanks(in);
  doc.summary = SummaryOf(in, several);
  trace::Detail& d = doc.detail;
  d.light = in.light;
  for (auto& r : in.recoveries)
    d.recoveries.push_back({CommIdHex(r.comm_id), static_cast<int64_t>(r.seq), trace::OpKindName(r.kind),
                            r.stalled_after_s, r.recovered_after_s});
  if (in.light) return trace::WriteDocument(doc, nullptr, sink);
  d.process.exe = in.exe;
  d.process.cmdline = in.cmdline;
  d.process.cwd = in.cwd;
  d.process.env = in.environment;
  d.process.cuda_driver_version = in.cuda_driver_version;
  d.process.ncclwatch_version = kNcclwatchVersion;
  if (in.config) d.process.config = DescribeConfig(*in.config);
  for (const CommInfo* c : in.comms) d.communicators.push_back(CommunicatorOf(c));
  d.ring.capacity = static_cast<int64_t>(in.ring_capacity);
  d.ring.recorded = static_cast<int64_t>(in.ring_recorded);
  d.ring.overwritten = static_cast<int64_t>(in.ring_overwritten);
  d.callsites = in.callsites;
  d.threads = in.threads;
  // One entry at a time, from the live ring or the given copy: a big ring never exists twice.
  uint64_t next = in.live_ring ? in.ring_from : 0;
  return trace::WriteDocument(
      doc,
      [&](trace::Op* op) {
        if (in.live_ring) {
          OpSnapshot snap;
          while (next < in.ring_to)
            if (in.live_ring->Read(next++, &snap)) {
              *op = OpRecordFor(snap, several);
              return true;
            }
          return false;
        }
        if (next >= in.ring.size()) return false;
        *op = OpRecordFor(in.ring[next++], several);
        return true;
      },
      sink);
}

std::string SerializeDump(const DumpInput& in) {
  std::string all;
  StreamDump(in, [&](std::string* piece) {
    all += *piece;
    piece->clear();
    return true;
  });
  return all;
}

}  // namespace ncclwatch
