#include "fixtures.h"

#include "format/file_name.h"
#include "format/trace_writer.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace ncclwatch {
namespace testing {

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

trace::Op Op(const std::string& comm, int64_t seq, const char* op, const char* state, double age_s) {
  trace::Op o;
  o.comm = comm;
  o.seq = seq;
  trace::OpKind kind;
  if (trace::ParseOpKind(op, &kind)) o.SetKind(kind);
  else o.op_name = op;
  o.count = 1024;
  o.dtype = "float32";
  o.bytes = 4096;
  o.redop = "sum";
  o.stream = "0x10";
  trace::OpState st;
  if (trace::ParseOpState(state, &st)) o.state = trace::OpStateValue::Of(st);
  o.age_s = age_s;
  o.deadline_s = 600.0;
  return o;
}

trace::Op P2pOp(const std::string& comm, const char* op, int peer, int64_t p2p_seq, const char* state) {
  trace::Op o = Op(comm, 0, op, state);
  o.peer = peer;
  o.p2p_seq = p2p_seq;
  o.redop.clear();
  return o;
}

trace::CommSummary Comm(const std::string& id, int size, int rank, int64_t enqueued, int64_t reached,
                        int64_t completed) {
  trace::CommSummary c;
  c.id = id;
  c.size = size;
  c.rank = rank;
  c.state = trace::CommStateName(trace::CommState::Active);
  c.last_enqueued = enqueued;
  c.last_gpu_reached = reached;
  c.last_completed = completed;
  return c;
}

Document Dump(int rank, int world_size, std::vector<trace::CommSummary> comms, std::vector<trace::Op> in_flight,
              const char* reason) {
  Document d;
  trace::Summary& s = d.summary;
  s.rank = rank;
  s.world_size = world_size;
  s.host = "h" + std::to_string(rank / 8);
  s.pid = 1000 + rank;
  s.reason = trace::DumpReasonValue::Named(reason);
  s.time_unix_ns = 1700000000000000000LL + rank;
  s.time_mono_ns = 5000000000000LL;
  s.comms = std::move(comms);
  s.in_flight = std::move(in_flight);
  // A peer_request dump answers another rank's stall: the job shows a hang.
  if (s.reason.Is(trace::DumpReason::PeerRequest))
    s.answered = trace::AnsweredRequest{"h0-1000-0", 0, "h0", trace::DumpReasonName(trace::DumpReason::Stall)};
  return d;
}

std::string Text(const Document& dump) { return trace::WriteDocument(dump); }

json AsJson(const Document& dump) { return json::parse(Text(dump)); }

std::string DumpFileName(const Document& dump) {
  const trace::Summary& s = dump.summary;
  return trace::DumpFileName(s.rank, s.host, s.pid, s.dump_seq, s.reason.Name());
}

analysis::Report Analyze(const TempDir& dir, const std::vector<Document>& dumps,
                         const analysis::LoadOptions& options) {
  for (const auto& d : dumps) dir.Write(DumpFileName(d), Text(d));
  analysis::DumpSet set;
  std::string error;
  if (!set.Load(dir.path(), options, &error)) throw std::runtime_error(error);
  return analysis::Attribute(set);
}

CommandResult RunCommand(const std::string& args, long memory_kib) {
  TempDir io;
  std::string out = io.path() + "/out", err = io.path() + "/err";
  std::string cmd = std::string(NCCLWATCH_BIN) + " " + args + " >" + out + " 2>" + err + " </dev/null";
  if (memory_kib > 0) cmd = "ulimit -v " + std::to_string(memory_kib) + " && exec " + cmd;
  int raw = std::system(cmd.c_str());
  CommandResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  return r;
}

}  // namespace testing
}  // namespace ncclwatch
