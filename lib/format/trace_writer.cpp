#include "format/trace_writer.h"

#include "format/ring_columns.h"

#include <algorithm>

namespace ncclwatch {
namespace trace {

namespace k = key;

namespace {

// `key`: [ {fields(item)}, ... ]
template <typename Items, typename Fields>
void ObjectArray(JsonWriter& w, const char* key, const Items& items, Fields&& fields) {
  w.Key(key).BeginArray();
  for (const auto& item : items) {
    w.BeginObject();
    fields(item);
    w.EndObject();
  }
  w.EndArray();
}

}  // namespace

void WriteOp(JsonWriter& w, const Op& o) {
  w.BeginObject();
  w.Field(k::kComm, o.comm);
  w.Field(k::kSeq, o.seq);
  w.Field(k::kP2pSeq, o.p2p_seq);
  w.Field(k::kOp, o.OpName());
  w.Field(k::kCount, o.count);
  w.Field(k::kDtype, o.dtype);
  w.Field(k::kBytes, o.bytes);
  w.Key(k::kRedop);
  if (o.redop.empty()) w.Null();
  else w.String(o.redop);
  w.Field(k::kRoot, o.root);
  w.Field(k::kPeer, o.peer);
  w.Field(k::kStream, o.stream);
  w.Field(k::kGroup, o.group);
  w.Field(k::kTid, o.tid);
  w.Field(k::kEnqueueNs, o.enqueue_ns);
  w.Field(k::kGpuReachedNs, o.gpu_reached_ns);
  w.Field(k::kCompletedNs, o.completed_ns);
  w.Field(k::kState, o.state.known ? OpStateName(o.state.value) : "unknown");
  w.Field(k::kResult, o.result);
  w.Field(k::kCallsite, o.callsite);
  if (o.gpu_ms >= 0) w.Field(k::kGpuMs, o.gpu_ms);
  if (o.age_s >= 0) w.Field(k::kAgeS, o.age_s);
  if (o.deadline_s >= 0) w.Field(k::kDeadlineS, o.deadline_s);
  w.EndObject();
}

void WriteStack(JsonWriter& w, const Stack& s) { WriteStack(w, s, nullptr); }

void WriteStack(JsonWriter& w, const Stack& s, const ModuleTable* modules) {
  ObjectArray(w, k::kFrames, s.native, [&](const NativeFrame& f) {
    w.Key(k::kIp).Hex(f.ip);
    if (modules) {  // version 2: the module's index in `modules` (path and build id, once)
      w.Field(k::kModule, modules->IndexOf(f.module, f.build_id));
    } else {
      w.Field(k::kModule, f.module);
    }
    w.Field(k::kSymbol, f.symbol);
    w.Field(k::kOffset, f.offset);
    if (!modules) w.Field(k::kBuildId, f.build_id);
    w.Key(k::kModuleOffset).Hex(f.module_offset);
    if (f.interrupted) w.Field(k::kInterrupted, true);
  });
  ObjectArray(w, k::kPython, s.python, [&](const PythonFrame& f) {
    w.Field(k::kFile, f.file);
    w.Field(k::kLine, f.line);
    w.Field(k::kFunction, f.function);
    w.Field(k::kLibrary, f.library);
  });
}

void WriteSummary(JsonWriter& w, const Summary& s) {
  w.BeginObject();
  w.Field(k::kRank, s.rank);
  w.Field(k::kLocalRank, s.local_rank);
  w.Field(k::kWorldSize, s.world_size);
  w.Field(k::kHost, s.host);
  w.Field(k::kPid, s.pid);
  w.Field(k::kDumpSeq, s.dump_seq);
  w.Field(k::kReason, s.reason);
  w.Field(k::kDetail, s.detail);
  w.Key(k::kTrigger);
  if (s.answered) {
    w.BeginObject();
    w.Field(k::kRequest, s.answered->request);
    w.Field(k::kOriginRank, s.answered->origin_rank);
    w.Field(k::kOriginHost, s.answered->origin_host);
    w.Field(k::kReason, s.answered->reason);
    w.EndObject();
  } else {
    w.Null();
  }
  w.Field(k::kTimeUnixNs, s.time_unix_ns);
  w.Field(k::kTimeMonoNs, s.time_mono_ns);
  w.Field(k::kStartMonoNs, s.start_mono_ns);
  w.Field(k::kNcclVersion, s.nccl_version);
  ObjectArray(w, k::kInNccl, s.in_nccl, [&](const InNcclThread& t) {
    w.Field(k::kTid, t.tid);
    w.Field(k::kFunction, t.function);
    w.Field(k::kSinceS, t.since_s);
  });
  ObjectArray(w, k::kComms, s.comms, [&](const CommSummary& c) {
    w.Field(k::kId, c.id);
    w.Field(k::kSize, c.size);
    w.Field(k::kRank, c.rank);
    w.Field(k::kName, c.name);
    w.Field(k::kState, c.state);
    w.Field(k::kLastEnqueued, c.last_enqueued);
    w.Field(k::kLastGpuReached, c.last_gpu_reached);
    w.Field(k::kLastCompleted, c.last_completed);
    ObjectArray(w, k::kP2p, c.p2p, [&](const P2pCounters& p) {
      w.Field(k::kPeer, p.peer);
      w.Field(k::kSendEnqueued, p.send_enqueued);
      w.Field(k::kSendCompleted, p.send_completed);
      w.Field(k::kRecvEnqueued, p.recv_enqueued);
      w.Field(k::kRecvCompleted, p.recv_completed);
    });
  });
  w.Key(k::kInFlight).BeginArray();
  for (const auto& o : s.in_flight) WriteOp(w, o);
  w.EndArray();
  w.Key(k::kStalled);
  if (s.stalled) WriteOp(w, *s.stalled);
  else w.Null();
  w.Field(k::kRingOverwritten, s.ring_overwritten);
  w.Field(k::kProcessUid, s.process_uid);
  w.Field(k::kJobInstance, s.job_instance);
  w.Field(k::kStartUnixNs, s.start_unix_ns);
  w.Field(k::kExitStatus, s.exit_status);
  w.Key(k::kFailed);
  if (s.failed) WriteOp(w, *s.failed);
  else w.Null();
  if (s.error_result != 0) w.Field(k::kErrorResult, s.error_result);
  if (s.states_as_of_mono_ns >= 0) w.Field(k::kStatesAsOfMonoNs, s.states_as_of_mono_ns);
  if (s.exception) {
    w.Key(k::kException).BeginObject();
    w.Field(k::kType, s.exception->type);
    w.Field(k::kMessage, s.exception->message);
    w.Field(k::kFile, s.exception->file);
    w.Field(k::kLine, s.exception->line);
    w.Field(k::kFunction, s.exception->function);
    w.EndObject();
  }
  if (s.stopped) {
    w.Key(k::kStopped).BeginObject();
    w.Field(k::kHow, s.stopped->how);
    w.Field(k::kSeenUnixNs, s.stopped->seen_unix_ns);
    w.Field(k::kLastSeenUnixNs, s.stopped->last_seen_unix_ns);
    w.EndObject();
  }
  w.EndObject();
}

namespace {

void WriteKeyValues(JsonWriter& w, const KeyValues& kvs) {
  w.BeginObject();
  for (const auto& kv : kvs) w.Field(kv.first, kv.second);
  w.EndObject();
}

void WriteProcess(JsonWriter& w, const Process& p) {
  w.BeginObject();
  w.Field(k::kExe, p.exe);
  w.Key(k::kCmdline).BeginArray();
  for (const auto& a : p.cmdline) w.String(a);
  w.EndArray();
  w.Field(k::kCwd, p.cwd);
  w.Key(k::kEnv);
  WriteKeyValues(w, p.env);
  w.Field(k::kCudaDriverVersion, p.cuda_driver_version);
  w.Field(k::kNcclwatchVersion, p.ncclwatch_version);
  w.Key(k::kConfig);
  WriteKeyValues(w, p.config);
  w.EndObject();
}

void WriteCommunicator(JsonWriter& w, const Communicator& c) {
  w.BeginObject();
  w.Field(k::kId, c.id);
  w.Field(k::kSize, c.size);
  w.Field(k::kRank, c.rank);
  w.Field(k::kName, c.name);
  w.Field(k::kState, c.state);
  w.Field(k::kDevice, c.device);
  w.Field(k::kKind, c.kind);
  w.Key(k::kParent);
  if (c.parent.empty()) w.Null();
  else w.String(c.parent);
  w.Field(k::kColor, c.color);
  w.Field(k::kKey, c.key);
  w.Field(k::kBlocking, c.blocking);
  w.Field(k::kCreatedMonoNs, c.created_mono_ns);
  w.Field(k::kEndedMonoNs, c.ended_mono_ns);
  w.EndObject();
}

// `own`: threads only (null for call sites).
void WriteThreadLike(JsonWriter& w, const char* id_key, int64_t id, const std::string* name, const Stack& stack,
                     const std::string& note, const bool* own, const ModuleTable& modules,
                     const std::string& python_driven_from = std::string()) {
  w.BeginObject();
  w.Field(id_key, id);
  if (name) w.Field(k::kName, *name);
  WriteStack(w, stack, &modules);
  w.Field(k::kNote, note);
  if (own) w.Field(k::kOwn, *own);
  if (!python_driven_from.empty()) w.Field(k::kPythonDrivenFrom, python_driven_from);
  w.EndObject();
}

}  // namespace

bool WriteDocument(const Document& doc, const OpSource& ring_entries, const TextSink& sink) {
  std::string out;
  out.reserve(kSinkChunkBytes + 4096);
  bool sink_ok = true;
  // Hands the text over once a piece is full: memory stays one piece whatever the ring holds.
  auto piece_done = [&] {
    if (sink_ok && out.size() >= kSinkChunkBytes) sink_ok = sink(&out);
    return sink_ok;
  };
  const Detail& d = doc.detail;
  JsonWriter w(&out);
  w.BeginObject();
  w.Field(k::kFormat, kFormatName);
  w.Field(k::kVersion, kTraceVersion);
  w.Key(k::kSummary);
  WriteSummary(w, doc.summary);
  if (!d.light) {
    w.Key(k::kProcess);
    WriteProcess(w, d.process);
    w.Key(k::kCommunicators).BeginArray();
    for (const auto& c : d.communicators) {
      WriteCommunicator(w, c);
      if (!piece_done()) return false;
    }
    w.EndArray();
    w.Key(k::kRing).BeginObject();
    w.Field(k::kCapacity, d.ring.capacity);
    w.Field(k::kRecorded, d.ring.recorded);
    w.Field(k::kOverwritten, d.ring.overwritten);
    w.Key(k::kColumns).BeginArray();
    for (const char* c : kRingColumnNames) w.String(c);
    w.EndArray();
    w.Key(k::kRows).BeginArray();
    RingRowWriter rows;
    if (ring_entries) {
      Op op;
      while (ring_entries(&op)) {
        rows.Row(w, op);
        if (!piece_done()) return false;
      }
    } else {
      for (const auto& op : d.ring.entries) {
        rows.Row(w, op);
        if (!piece_done()) return false;
      }
    }
    w.EndArray();
    w.EndObject();
    // Every module the stacks name, once (a module path and build id per frame were half of
    // a stack's bytes).
    ModuleTable modules;
    for (const auto& c : d.callsites)
      for (const auto& f : c.stack.native) modules.Add(f.module, f.build_id);
    for (const auto& t : d.threads)
      for (const auto& f : t.stack.native) modules.Add(f.module, f.build_id);
    w.Key(k::kModules).BeginArray();
    for (const auto& m : modules.list()) {
      w.BeginObject();
      w.Field(k::kPath, m.first);
      w.Field(k::kBuildId, m.second);
      w.EndObject();
    }
    w.EndArray();
    w.Key(k::kCallsites).BeginArray();
    for (const auto& c : d.callsites) {
      WriteThreadLike(w, k::kId, c.id, nullptr, c.stack, c.note, nullptr, modules, c.python_driven_from);
      if (!piece_done()) return false;
    }
    w.EndArray();
    w.Key(k::kThreads).BeginArray();
    for (const auto& t : d.threads) {
      WriteThreadLike(w, k::kTid, t.tid, &t.name, t.stack, t.note, &t.own, modules);
      if (!piece_done()) return false;
    }
    w.EndArray();
  }
  ObjectArray(w, k::kRecoveries, d.recoveries, [&](const Recovery& r) {
    w.Field(k::kComm, r.comm);
    w.Field(k::kSeq, r.seq);
    w.Field(k::kOp, r.op);
    w.Field(k::kStalledAfterS, r.stalled_after_s);
    w.Field(k::kRecoveredAfterS, r.recovered_after_s);
  });
  w.EndObject();
  out += '\n';
  return sink_ok && sink(&out);
}

std::string WriteDocument(const Document& doc, const OpSource& ring_entries) {
  std::string all;
  WriteDocument(doc, ring_entries, [&](std::string* piece) {
    all += *piece;
    piece->clear();
    return true;
  });
  return all;
}

}  // namespace trace
}  // namespace ncclwatch
