#include <catch2/catch.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "dump/dump_files.h"
#include "dump/dump_writer.h"
#include "format/dump_reader.h"
#include "format/file_name.h"
#include "format/ring_columns.h"
#include "temp_dir.h"

using namespace ncclwatch;
using testing::TempDir;
using nlohmann::json;
namespace k = trace::key;

namespace {

// Returns once the file system's clock has moved on: a request rewritten within the same tick
// (same size, its inode reused) would look unchanged to PollRequest, which is not what these
// tests are about.
void WaitForNextFileTime() {
  TempDir probe_dir;
  const std::string probe = probe_dir.path() + "/probe";
  { std::ofstream(probe) << "x"; }
  auto stamp = [&] {
    struct stat st {};
    REQUIRE(utimensat(AT_FDCWD, probe.c_str(), nullptr, 0) == 0);
    REQUIRE(stat(probe.c_str(), &st) == 0);
    return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  };
  const int64_t first = stamp();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (stamp() == first) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(std::chrono::microseconds(200));  // a poll interval only
  }
}

std::vector<std::string> List(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') out.push_back(e->d_name);
    closedir(d);
  }
  return out;
}

std::string Read(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct Sample {
  Config config;
  CommInfo comm;
  DumpInput in;
  Sample() {
    comm.id = 0xabcdef;
    comm.size = 8;
    comm.rank = 3;
    comm.name = "world";
    comm.peers.reset(new PeerCounters[8]);
    comm.peers[5].send_enqueued = 2;
    comm.peers[5].send_completed = 1;
    comm.live().last_enqueued = 42;
    comm.live().last_gpu_reached = 41;
    comm.live().last_completed = 41;
    in.reason = trace::DumpReason::Stall;
    in.detail = "AllGather seq 42 stuck";
    in.identity.host = "node1";
    in.identity.pid = 1234;
    in.global_rank = 3;
    in.world_size = 8;
    in.config = &config;
    in.comms = {&comm};
    OpSnapshot o;
    o.comm_id = comm.id;
    o.seq = 42;
    o.kind = trace::OpKind::AllGather;
    o.count = 1024;
    o.dtype = 9;
    o.bytes = 1024 * 2 * 8;
    o.state = trace::OpState::GpuReached;
    o.callsite = 0;
    in.ring = {o};
    in.ring_capacity = 4096;
    in.ring_recorded = 1;
    InflightView v;
    v.op = o;
    v.age_s = 12.5;
    v.deadline_s = 10;
    v.stalled = true;
    in.inflight = {v};
    in.stalled = v;
    in.in_nccl = {{99, "ncclAllGather", 0, 0, false}};
    in.callsites = {{0, {{{0x1000, "/lib/libx.so", "train_step", 16, "", 0}}, {{"train.py", 88, "step", false}}}, "", ""}};
    in.threads = {{99, "python", {{{0x2000, "/lib/liby.so", "wait", 4, "", 0}}, {{"train.py", 90, "main", false}}}, ""}};
    in.environment = {{"NCCL_DEBUG", "WARN"}};
    in.recoveries = {{comm.id, 40, trace::OpKind::AllReduce, 10, 14}};
  }
};

}  // namespace

TEST_CASE("dump round trip: the documented keys, in order, with the values written") {
  Sample s;
  std::string text = SerializeDump(s.in);
  auto ordered = nlohmann::ordered_json::parse(text);
  std::vector<std::string> keys;
  for (auto& kv : ordered.items()) keys.push_back(kv.key());
  // The summary comes right after format/version: readers stop there.
  REQUIRE(keys.size() == 10);
  CHECK(keys[0] == k::kFormat);
  CHECK(keys[1] == k::kVersion);
  CHECK(keys[2] == k::kSummary);
  CHECK(keys[3] == k::kProcess);
  json j = json::parse(text);
  CHECK(j[k::kFormat] == trace::kFormatName);
  CHECK(j[k::kVersion] == trace::kTraceVersion);
  const json& sum = j[k::kSummary];
  CHECK(sum[k::kRank] == 3);
  CHECK(sum[k::kReason] == "stall");
  CHECK(sum[k::kTrigger].is_null());
  CHECK(sum[k::kInNccl][0][k::kFunction] == "ncclAllGather");
  const json& c = sum[k::kComms][0];
  CHECK(c[k::kId] == "0000000000abcdef");
  CHECK(c[k::kLastEnqueued] == 42);
  CHECK(c[k::kLastCompleted] == 41);
  REQUIRE(c[k::kP2p].size() == 1);  // only peers with traffic
  CHECK(c[k::kP2p][0][k::kPeer] == 5);
  CHECK(c[k::kP2p][0][k::kSendEnqueued] == 2);
  const json& st = sum[k::kStalled];
  CHECK(st[k::kOp] == "AllGather");
  CHECK(st[k::kDtype] == "bfloat16");
  CHECK(st[k::kRedop].is_null());
  CHECK(st[k::kState] == "gpu_reached");
  CHECK(st[k::kAgeS] == 12.5);
  CHECK(j[k::kRing][k::kRows].size() == 2);  // version 2: the op's shape, then its row
  CHECK(j[k::kRing][k::kColumns].size() == trace::kRingColumnCount);
  CHECK(j[k::kRing][k::kCapacity] == 4096);
  // The reader gives every consumer version 1's shape.
  json decoded = trace::ParseDocumentFromBuffer(text, trace::ReadDepth::kFull).top;
  REQUIRE(decoded[k::kRing][k::kEntries].size() == 1);
  CHECK(decoded[k::kRing][k::kEntries][0][k::kComm] == "0000000000abcdef");
  CHECK_FALSE(decoded[k::kRing].contains(k::kRows));
  CHECK(j[k::kCallsites][0][k::kPython][0][k::kLine] == 88);
  CHECK(j[k::kThreads][0][k::kFrames][0][k::kSymbol] == "wait");
  CHECK(j[k::kThreads][0][k::kFrames][0][k::kModule] == 1);  // version 2: an index into `modules`
  CHECK(j[k::kModules][1][k::kPath] == "/lib/liby.so");
  CHECK(decoded[k::kThreads][0][k::kFrames][0][k::kModule] == "/lib/liby.so");
  CHECK(decoded[k::kThreads][0][k::kFrames][0][k::kBuildId] == "");
  CHECK_FALSE(decoded.contains(k::kModules));
  CHECK(j[k::kProcess][k::kEnv]["NCCL_DEBUG"] == "WARN");
  CHECK(j[k::kProcess][k::kConfig]["NCCLWATCH_RING"] == "4096");
  CHECK(j[k::kRecoveries][0][k::kRecoveredAfterS] == 14);
  CHECK(j[k::kCommunicators][0][k::kName] == "world");
}

TEST_CASE("every key the format document lists is written by the writer") {
  Sample s;
  json j = json::parse(SerializeDump(s.in));
  std::string doc = Read(std::string(NCCLWATCH_SOURCE_DIR) + "/docs/trace-format.md");
  REQUIRE(!doc.empty());
  for (const char* key : {k::kRank, k::kLocalRank, k::kWorldSize, k::kHost, k::kPid, k::kDumpSeq, k::kReason,
                          k::kDetail, k::kTrigger, k::kTimeUnixNs, k::kTimeMonoNs, k::kStartMonoNs,
                          k::kNcclVersion, k::kInNccl, k::kComms, k::kInFlight, k::kStalled, k::kRingOverwritten}) {
    CHECK(j[k::kSummary].contains(key));
    CHECK(doc.find(std::string("`") + key + "`") != std::string::npos);
  }
  json decoded = trace::ParseDocumentFromBuffer(SerializeDump(s.in), trace::ReadDepth::kFull).top;
  for (const char* key : {k::kComm, k::kSeq, k::kP2pSeq, k::kOp, k::kCount, k::kDtype, k::kBytes, k::kRedop,
                          k::kRoot, k::kPeer, k::kStream, k::kGroup, k::kTid, k::kEnqueueNs, k::kGpuReachedNs,
                          k::kCompletedNs, k::kState, k::kResult, k::kCallsite}) {
    CHECK(decoded[k::kRing][k::kEntries][0].contains(key));
    CHECK(doc.find(std::string("`") + key + "`") != std::string::npos);
  }
  for (const char* column : trace::kRingColumnNames) {  // version 2's ring columns
    INFO(column);
    CHECK(doc.find(std::string("`") + column + "`") != std::string::npos);
  }
  for (const char* key : {k::kColumns, k::kRows, k::kModules, k::kPath}) CHECK(doc.find(std::string("`") + key + "`") != std::string::npos);
}

TEST_CASE("light dumps hold the summary and recoveries only") {
  Sample s;
  s.in.light = true;
  json j = json::parse(SerializeDump(s.in));
  CHECK(j.contains(k::kSummary));
  CHECK(j.contains(k::kRecoveries));
  CHECK_FALSE(j.contains(k::kRing));
  CHECK_FALSE(j.contains(k::kThreads));
}

TEST_CASE("invalid UTF-8 in a value never breaks a dump") {
  Sample s;
  s.in.environment = {{"NCCL_SOCKET_IFNAME", std::string("eth\xff\xfe")}};
  std::string text = SerializeDump(s.in);
  CHECK_NOTHROW(json::parse(text));
}

TEST_CASE("dump file names follow the format's rule") {
  Sample s;
  s.in.identity.host = "node-1.cluster";
  s.in.identity.pid = 77;
  CHECK(DumpFileStem(s.in) == "rank00003-node_1.cluster-77-0-stall");
  s.in.global_rank = -1;
  s.in.dump_seq = 2;
  s.in.reason = trace::DumpReason::PeerRequest;
  CHECK(DumpFileStem(s.in) == "rankx-node_1.cluster-77-2-peer_request");
}

TEST_CASE("dumps are never overwritten and never more than the bound") {
  TempDir dir_tmp;
  std::string dir = dir_tmp.path();
  DumpDirectory d(dir, dir + "-fallback", 3);
  std::string a = d.Write("rank00000-h-1-0-stall", "{\"a\":1}\n");
  std::string b = d.Write("rank00000-h-1-0-stall", "{\"b\":2}\n");
  REQUIRE(!a.empty());
  REQUIRE(!b.empty());
  CHECK(a != b);
  CHECK(Read(a) == "{\"a\":1}\n");
  CHECK(Read(b) == "{\"b\":2}\n");
  CHECK(!d.Write("x", "{}").empty());
  // At the bound the first dump and the latest stay: the oldest other one makes room.
  std::string y = d.Write("y", "{\"y\":1}\n");
  REQUIRE(!y.empty());
  CHECK(List(dir).size() == 3);  // bounded, and no temp files left behind either
  CHECK(Read(a) == "{\"a\":1}\n");
  CHECK(Read(b).empty());
  CHECK(Read(y) == "{\"y\":1}\n");
  CHECK(WriteFileNoReplace(a, "other") == EEXIST);
  CHECK(Read(a) == "{\"a\":1}\n");
  // The exit record is outside the bound and removes nothing.
  CHECK(!d.Write("exit", "{}", /*counted=*/false).empty());
  CHECK(List(dir).size() == 4);
}

TEST_CASE("with NCCLWATCH_MAX_DUMPS=1 the first dump stays and later ones are refused") {
  TempDir dir_tmp;
  std::string dir = dir_tmp.path();
  DumpDirectory d(dir, dir + "-fallback", 1);
  std::string a = d.Write("first", "{\"a\":1}\n");
  REQUIRE(!a.empty());
  CHECK(d.LimitReached());
  CHECK(d.Write("second", "{}").empty());
  CHECK(List(dir).size() == 1);
  CHECK(Read(a) == "{\"a\":1}\n");
}

TEST_CASE("an unwritable dump directory falls back, with one line") {
  TempDir fallback_tmp;
  std::string fallback = fallback_tmp.path() + "/fallback";
  DumpDirectory d("/proc/ncclwatch-cannot-write-here", fallback, 5);
  std::string p = d.Write("rank00001-h-1-0-abort", "{}");
  REQUIRE(!p.empty());
  CHECK(p.rfind(fallback, 0) == 0);
}

TEST_CASE("the job-wide dump request is seen once per change") {
  TempDir dir_tmp;
  std::string dir = dir_tmp.path();
  DumpDirectory writer(dir, dir, 5), reader(dir, dir, 5);
  CHECK_FALSE(reader.PollRequest().has_value());
  trace::DumpRequest r{"h-1-0", 2, "h", "stall", "", 0};
  REQUIRE(writer.WriteRequest(r));
  auto got = reader.PollRequest();
  REQUIRE(got.has_value());
  CHECK(got->request == "h-1-0");
  CHECK(got->origin_rank == 2);
  CHECK_FALSE(reader.PollRequest().has_value());
  WaitForNextFileTime();
  REQUIRE(writer.WriteRequest({"h-1-1", 2, "h", "abort", "", 0}));
  got = reader.PollRequest();
  REQUIRE(got.has_value());
  CHECK(got->request == "h-1-1");
}

TEST_CASE("a request left by an earlier attempt or another job is not served") {
  TempDir dir_tmp;
  std::string dir = dir_tmp.path();
  DumpDirectory writer(dir, dir, 5), reader(dir, dir, 5);
  const uint64_t start = 2000;
  REQUIRE(writer.WriteRequest({"old-1", 1, "h", "stall", "torchelastic:x:0", 1000}));  // before we started
  CHECK_FALSE(reader.PollRequest("torchelastic:x:0", start).has_value());
  WaitForNextFileTime();
  REQUIRE(writer.WriteRequest({"other-1", 1, "h", "stall", "torchelastic:y:0", 3000}));  // another job
  CHECK_FALSE(reader.PollRequest("torchelastic:x:0", start).has_value());
  WaitForNextFileTime();
  REQUIRE(writer.WriteRequest({"ours-1", 1, "h", "stall", "torchelastic:x:0", 3000}));
  auto got = reader.PollRequest("torchelastic:x:0", start);
  REQUIRE(got.has_value());
  CHECK(got->request == "ours-1");
  WaitForNextFileTime();
  REQUIRE(writer.WriteRequest({"unknown-1", 1, "h", "stall", "", 0}));  // an older writer: served
  got = reader.PollRequest("torchelastic:x:0", start);
  REQUIRE(got.has_value());
  CHECK(got->request == "unknown-1");
}

TEST_CASE("a link planted under a temporary name is never followed") {
  TempDir dir_tmp;
  std::string dir = dir_tmp.path();
  TempDir victim_tmp;
  std::string victim = victim_tmp.path() + "/victim";
  { std::ofstream(victim) << "precious"; }
  std::string path = dir + "/rank00000-h-1-0-stall.json";
  std::string tmp = dir + "/.tmp-rank00000-h-1-0-stall.json-" + std::to_string(getpid());
  REQUIRE(symlink(victim.c_str(), tmp.c_str()) == 0);
  CHECK(WriteFileNoReplace(path, "{}\n") == 0);
  CHECK(Read(victim) == "precious");
  CHECK(Read(path) == "{}\n");
  // The same for the job-wide request's temporary file.
  std::string req_tmp = dir + "/.tmp-dump-request-" + std::to_string(getpid());
  REQUIRE(symlink(victim.c_str(), req_tmp.c_str()) == 0);
  DumpDirectory d(dir, dir, 5);
  CHECK(d.WriteRequest({"h-1-0", 0, "h", "stall", "", 0}));
  CHECK(Read(victim) == "precious");
}

TEST_CASE("the predictable /tmp fallback is refused when it is not this user's own directory") {
  std::string name = "ncclwatch-test-planted-" + std::to_string(getpid());
  std::string shared = "/tmp/" + name + "-" + std::to_string(getuid());
  TempDir elsewhere_tmp;
  std::string elsewhere = elsewhere_tmp.path();
  REQUIRE(symlink(elsewhere.c_str(), shared.c_str()) == 0);
  char cwd[4096];
  REQUIRE(getcwd(cwd, sizeof cwd));
  REQUIRE(chdir("/proc") == 0);  // the relative fallback is not writable either
  DumpDirectory d("/proc/ncclwatch-cannot-write-here", name, 5);
  std::string p = d.Write("rank00000-h-1-0-stall", "{}");
  REQUIRE(chdir(cwd) == 0);
  CHECK(p.empty());
  CHECK(List(elsewhere).empty());
  unlink(shared.c_str());
}

TEST_CASE("dump directories are never writable by others, whatever the umask") {
  TempDir base_tmp;
  std::string base = base_tmp.path();
  mode_t old = umask(0);
  DumpDirectory d(base + "/a/b", base + "/fallback", 5);
  std::string p = d.Write("rank00000-h-1-0-stall", "{}");
  umask(old);
  REQUIRE(!p.empty());
  struct stat st {};
  REQUIRE(stat((base + "/a").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0755);
  REQUIRE(stat((base + "/a/b").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0755);
}

namespace {
// Runs `fn` with stderr sent to a pipe (a log collector's way: our lines go to a pipe put in
// stderr's place, never to a regular file that is not the process's own stderr); returns what
// was written there (a few lines: the pipe's buffer holds them).
template <typename Fn>
std::string CaptureStderr(Fn fn) {
  int p[2];
  REQUIRE(pipe(p) == 0);
  int saved = dup(2);
  dup2(p[1], 2);
  close(p[1]);
  fn();
  dup2(saved, 2);
  close(saved);
  std::string text;
  char buf[4096];
  ssize_t n;
  while ((n = read(p[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  close(p[0]);
  return text;
}
}  // namespace

TEST_CASE("a full disk hands the dump to the fallback directory, with one line naming both") {
  TempDir dir_tmp;
  std::string dir = dir_tmp.path();
  TempDir fallback_tmp;
  std::string fallback = fallback_tmp.path() + "/fallback";
  DumpDirectory d(dir, fallback, 5);
  REQUIRE(!d.Write("before", "{}").empty());  // the directory was fine until now
  FailWritesForTest(dir + "/", ENOSPC);
  std::string p;
  std::string err = CaptureStderr([&] { p = d.Write("rank00000-h-1-0-stall", "{\"x\":1}\n"); });
  FailWritesForTest("", 0);
  REQUIRE(!p.empty());
  CHECK(p.rfind(fallback + "/", 0) == 0);
  CHECK(Read(p) == "{\"x\":1}\n");
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  CHECK(err.find(dir + "/rank00000-h-1-0-stall.json") != std::string::npos);
  CHECK(err.find("No space left on device") != std::string::npos);
  CHECK(err.find(fallback) != std::string::npos);
  // Later dumps go on to the fallback without a line each.
  err = CaptureStderr([&] { p = d.Write("later", "{}"); });
  CHECK(p.rfind(fallback + "/", 0) == 0);
  CHECK(err.empty());
}

TEST_CASE("when every directory is full the dump is lost with a line, and the next dump tries again") {
  std::string token = "full-" + std::to_string(getpid());
  TempDir dir_tmp;
  std::string dir = dir_tmp.path() + "/" + token;
  std::string fallback_name = "ncclwatch-test-" + token;  // ./ and /tmp/...-uid: both contain the token
  DumpDirectory d(dir, fallback_name, 5);
  FailWritesForTest(token, EDQUOT);
  std::string p;
  std::string err = CaptureStderr([&] { p = d.Write("rank00000-h-1-0-stall", "{}"); });
  FailWritesForTest("", 0);
  CHECK(p.empty());
  CHECK(err.find("Disk quota exceeded") != std::string::npos);
  CHECK(err.find("no dump written") != std::string::npos);
  CHECK(std::count(err.begin(), err.end(), '\n') == 1);
  p = d.Write("rank00000-h-1-1-stall", "{}");  // space is back
  CHECK(p.rfind(dir + "/", 0) == 0);
  rmdir(fallback_name.c_str());
  rmdir(("/tmp/" + fallback_name + "-" + std::to_string(getuid())).c_str());
}

TEST_CASE("a regular file as the dump directory is reported as not a directory") {
  TempDir file_tmp;
  std::string file = file_tmp.path() + "/plain-file";
  { std::ofstream(file) << "x"; }
  TempDir fallback_tmp;
  std::string fallback = fallback_tmp.path() + "/fallback";
  DumpDirectory d(file, fallback, 5);
  std::string p;
  std::string err = CaptureStderr([&] { p = d.Write("rank00000-h-1-0-stall", "{}"); });
  CHECK(p.rfind(fallback + "/", 0) == 0);
  CHECK(err.find("Not a directory") != std::string::npos);
  CHECK(err.find("Permission denied") == std::string::npos);
}

TEST_CASE("partial dump files of dead processes of this host are removed, nothing else") {
  TempDir dir;
  pid_t dead = fork();
  if (dead == 0) _exit(0);
  REQUIRE(waitpid(dead, nullptr, 0) == dead);
  auto tmp = [&](const std::string& host, pid_t pid, int age_s, int seq = 0) {
    const std::string base = trace::DumpFileName(1, host, pid, seq, "stall");
    const std::string path = dir.Write(".tmp-" + base + "-" + std::to_string(pid), std::string(100, 'x'));
    struct timespec times[2];
    times[0].tv_sec = times[1].tv_sec = time(nullptr) - age_s;
    times[0].tv_nsec = times[1].tv_nsec = 0;
    REQUIRE(utimensat(AT_FDCWD, path.c_str(), times, 0) == 0);
    return path.substr(path.rfind('/') + 1);
  };
  const std::string stale = tmp("node-a", dead, 60);
  const std::string live = tmp("node-a", getpid(), 60);      // its writer lives
  const std::string other = tmp("node-b", dead, 60);         // another host's pid says nothing here
  const std::string fresh = tmp("node-a", dead, 0, 1);       // too new to be sure
  const std::string dump = dir.Write(trace::DumpFileName(1, "node-a", dead, 0, "stall"), "{}");
  CHECK(RemoveStaleTemporaries(dir.path(), "node-a") == 1);
  std::set<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) left.insert(e.path().filename().string());
  CHECK(left.count(stale) == 0);
  CHECK(left.count(live) == 1);
  CHECK(left.count(other) == 1);
  CHECK(left.count(fresh) == 1);
  CHECK(left.size() == 4);
}

TEST_CASE("a mkdir -p that fails leaves no directory behind") {
  TempDir dir_tmp;
  std::string deep = dir_tmp.path();
  for (int i = 0; i < 460; ++i) deep += "/dddddddddddddddddddd";  // beyond PATH_MAX
  std::string why;
  CHECK_FALSE(MakeDirs(deep, &why));
  CHECK(why == std::strerror(ENAMETOOLONG));
  struct stat st;
  CHECK(stat((dir_tmp.path() + "/dddddddddddddddddddd").c_str(), &st) != 0);
  CHECK(MakeDirs(dir_tmp.path() + "/a/b", &why));  // directories it made for a success stay
  CHECK(stat((dir_tmp.path() + "/a/b").c_str(), &st) == 0);
}
