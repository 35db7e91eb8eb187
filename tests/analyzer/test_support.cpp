#include "test_support.h"

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


namespace key = trace::key;
namespace fs = std::filesystem;

TempDir::TempDir() {
  const char* tmp = std::getenv("TMPDIR");
  std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/ncclwatch-test-XXXXXX";
  std::vector<char> buf(templ.begin(), templ.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) throw std::runtime_error("mkdtemp failed");
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

std::string TempDir::Write(const std::string& name, const std::string& content) const {
  std::string p = path_ + "/" + name;
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << content;
  return p;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

json Op(const std::string& comm, int64_t seq, const char* op, const char* state, double age_s) {
  return {{key::kComm, comm},      {key::kSeq, seq},         {key::kP2pSeq, 0},
          {key::kOp, op},          {key::kCount, 1024},      {key::kDtype, "float32"},
          {key::kBytes, 4096},     {key::kRedop, "sum"},     {key::kRoot, -1},
          {key::kPeer, -1},        {key::kStream, "0x10"},   {key::kState, state},
          {key::kCallsite, -1},    {key::kAgeS, age_s},      {key::kDeadlineS, 600.0}};
}

json P2pOp(const std::string& comm, const char* op, int peer, int64_t p2p_seq, const char* state) {
  json o = Op(comm, 0, op, state);
  o[key::kPeer] = peer;
  o[key::kP2pSeq] = p2p_seq;
  o[key::kRedop] = nullptr;
  return o;
}

json Comm(const std::string& id, int size, int rank, int64_t enqueued, int64_t reached, int64_t completed) {
  return {{key::kId, id},
          {key::kSize, size},
          {key::kRank, rank},
          {key::kLastEnqueued, enqueued},
          {key::kLastGpuReached, reached},
          {key::kLastCompleted, completed},
          {key::kP2p, json::array()}};
}

json Dump(int rank, int world_size, std::vector<json> comms, std::vector<json> in_flight, const char* reason) {
  json summary = {{key::kRank, rank},
                  {key::kWorldSize, world_size},
                  {key::kHost, "h" + std::to_string(rank / 8)},
                  {key::kPid, 1000 + rank},
                  {key::kDumpSeq, 0},
                  {key::kReason, reason},
                  {key::kTimeUnixNs, 1700000000000000000LL + rank},
                  {key::kTimeMonoNs, 5000000000000LL},
                  {key::kInNccl, json::array()},
                  {key::kComms, comms},
                  {key::kInFlight, in_flight}};
  return {{key::kFormat, trace::kFormatName}, {key::kVersion, trace::kTraceVersion}, {key::kSummary, summary}};
}

std::string DumpFileName(const json& dump) {
  const json& s = dump[key::kSummary];
  char name[128];
  std::snprintf(name, sizeof name, "rank%05d-%s-%lld-%lld-%s.json", s[key::kRank].get<int>(),
                s[key::kHost].get<std::string>().c_str(), s[key::kPid].get<long long>(),
                s[key::kDumpSeq].get<long long>(), s[key::kReason].get<std::string>().c_str());
  return name;
}

analysis::Report Analyze(const TempDir& dir, const std::vector<json>& dumps) {
  for (const auto& d : dumps) dir.Write(DumpFileName(d), d.dump());
  analysis::DumpSet set;
  std::string error;
  if (!set.Load(dir.path(), {}, &error)) throw std::runtime_error(error);
  return analysis::Attribute(set);
}

CommandResult RunCommand(const std::string& args) {
  TempDir io;
  std::string out = io.path() + "/out", err = io.path() + "/err";
  std::string cmd = std::string(NCCLWATCH_BIN) + " " + args + " >" + out + " 2>" + err + " </dev/null";
  int raw = std::system(cmd.c_str());
  CommandResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  return r;
}

}  // namespace testing
}  // namespace ncclwatch
