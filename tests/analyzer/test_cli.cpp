// The command line: exit statuses 0/1/2, help and version, show, and problems on stderr.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <catch2/catch.hpp>

#include "fixtures.h"

using namespace ncclwatch::testing;
using Json = nlohmann::json;  // the report type, keys sorted
namespace fs = std::filesystem;
namespace rk = ncclwatch::analysis::report_key;

namespace {

std::string Golden(const char* set) { return (fs::path(GOLDEN_DIR) / set).string(); }

std::string FirstDump(const char* set) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(Golden(set)))
    if (e.path().filename().string().rfind("rank0", 0) == 0) names.push_back(e.path().string());
  std::sort(names.begin(), names.end());
  return names.at(0);
}

bool Has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("analyze exits 0 when nothing hangs, 1 on a hang, 2 on unusable input", "[cli]") {
  CHECK(RunCommand("analyze " + Golden("no_hang")).status == 0);
  CHECK(RunCommand("analyze " + Golden("rank_missing")).status == 1);
  CHECK(RunCommand("analyze " + Golden("rank_missing") + " --json --no-color").status == 1);

  auto missing = RunCommand("analyze /nonexistent/ncclwatch-dir");
  CHECK(missing.status == 2);
  CHECK(Has(missing.err, "/nonexistent/ncclwatch-dir"));

  TempDir empty;
  auto none = RunCommand("analyze " + empty.path());
  CHECK(none.status == 2);
  CHECK(Has(none.err, "no readable dump"));

  TempDir junk;
  junk.Write("rank00000-h-1-0-stall.json", "garbage");
  auto bad = RunCommand("analyze " + junk.path());
  CHECK(bad.status == 2);
  CHECK(Has(bad.err, "ncclwatch: rank00000-h-1-0-stall.json: invalid JSON at byte 1"));

  CHECK(RunCommand("analyze").status == 2);
  CHECK(RunCommand("analyze a b").status == 2);
  CHECK(RunCommand("analyze --bogus " + Golden("no_hang")).status == 2);
}

TEST_CASE("bad files are named on stderr and the rest is analyzed", "[cli]") {
  auto r = RunCommand("analyze " + Golden("corrupt_files") + " --json");
  CHECK(r.status == 1);
  CHECK(Has(r.err, "ncclwatch: rankx-foreign-1-0-stall.json: not an ncclwatch dump"));
  CHECK(Has(r.err, "ncclwatch: rankx-future-1-0-stall.json: trace version 99, written by a newer ncclwatch: upgrade"));
  CHECK(Has(r.err, "ncclwatch: rankx-empty-1-0-stall.json: empty file; skipped"));
  CHECK(Has(r.err, "ncclwatch: rankx-cut-1-0-stall.json: truncated JSON at byte"));
  Json j = Json::parse(r.out);
  CHECK(j[rk::kProblems].size() >= 4);
  CHECK(j[rk::kVerdicts][0][rk::kCause] == "rank_missing");
}

TEST_CASE("text output has no colour when not on a terminal", "[cli]") {
  auto r = RunCommand("analyze " + Golden("rank_missing"));
  CHECK(r.out.find('\033') == std::string::npos);
  CHECK(Has(r.out, "rank_missing"));
  CHECK(Has(r.out, "save_checkpoint (/workspace/job/checkpoint.py:57)"));
}

TEST_CASE("show prints one dump's tables, or its JSON with a cut ring", "[cli]") {
  std::string file = FirstDump("rank_missing");
  auto r = RunCommand("show " + file + " --ring 3");
  REQUIRE(r.status == 0);
  for (const char* part : {"communicators", "in flight", "ring", "threads", "callsites", "reason"})
    CHECK(Has(r.out, part));
  // Python frames come before native ones in a thread's stack.
  size_t py = r.out.find("save_file ("), native = r.out.find("__write+0x");
  CHECK(py != std::string::npos);
  CHECK(native != std::string::npos);
  CHECK(py < native);

  auto j = RunCommand("show " + file + " --ring 3 --json");
  REQUIRE(j.status == 0);
  Json doc = Json::parse(j.out);
  CHECK(doc["ring"]["entries"].size() == 3);
  CHECK(doc["summary"]["rank"] == 0);

  CHECK(RunCommand("show /nonexistent.json").status == 2);
  CHECK(RunCommand("show " + file + " --ring").status == 2);
  CHECK(RunCommand("show").status == 2);
}

TEST_CASE("help, version and unknown subcommands", "[cli]") {
  auto top = RunCommand("--help");
  CHECK(top.status == 0);
  CHECK(Has(top.out, "analyze"));
  CHECK(Has(top.out, "show"));
  CHECK(RunCommand("help").status == 0);
  auto ah = RunCommand("analyze --help");
  CHECK(ah.status == 0);
  CHECK(Has(ah.out, "usage: ncclwatch analyze DIR"));
  CHECK(Has(RunCommand("help show").out, "usage: ncclwatch show FILE"));
  CHECK(Has(RunCommand("show --help").out, "--ring N"));
  auto v = RunCommand("--version");
  CHECK(v.status == 0);
  CHECK(Has(v.out, "ncclwatch "));
  CHECK(RunCommand("frobnicate").status == 2);
  CHECK(RunCommand("").status == 2);
}

TEST_CASE("control characters in names and files are printed escaped, one line each", "[cli]") {
  TempDir dir;
  const std::string c = "00000000000000cc";
  std::vector<Document> dumps;
  for (int r = 0; r < 2; ++r) {
    Document d = r == 0 ? Dump(0, 2, {Comm(c, 2, 0, 4, 4, 4)}, {}, "peer_request")
                        : Dump(1, 2, {Comm(c, 2, 1, 5, 5, 4)}, {Op(c, 5, "AllReduce", "gpu_reached", 700)}, "stall");
    d.summary.host = "evil\x1b[2Jhost";
    dumps.push_back(d);
  }
  for (const auto& d : dumps) dir.Write(DumpFileName(d), Text(d));
  dir.Write("rank00009-bad\nname-1-0-stall.json", "garbage");
  auto r = RunCommand("analyze " + dir.path() + " --no-color");
  CHECK(r.status == 1);
  CHECK(r.out.find('\x1b') == std::string::npos);
  CHECK(Has(r.out, "evil\\x1b[2Jhost"));
  CHECK(r.err.find('\x1b') == std::string::npos);
  CHECK(Has(r.err, "rank00009-bad\\x0aname-1-0-stall.json: invalid JSON"));
}

TEST_CASE("show prints every string from a dump escaped", "[cli]") {
  TempDir dir;
  const std::string c = "00000000000000cc";
  const std::string evil = "\x1b]0;pwned\x07\x1b[2J";
  Document d = Dump(1, 2, {Comm(c, 2, 1, 5, 5, 4)}, {Op(c, 5, "AllReduce", "gpu_reached", 700)}, "stall");
  d.summary.host = "host" + evil;
  d.summary.detail = "detail" + evil;
  d.summary.comms[0].name = "comm" + evil;
  d.summary.answered = ncclwatch::trace::AnsweredRequest{"req" + evil, 0, "origin" + evil, "stall"};
  ncclwatch::trace::Thread t;
  t.tid = 42;
  t.name = "thread" + evil;
  t.note = "note" + evil;
  d.detail.threads.push_back(t);
  dir.Write(DumpFileName(d), Text(d));
  auto r = RunCommand("show " + dir.path() + "/" + DumpFileName(d) + " --no-color");
  REQUIRE(r.status == 0);
  CHECK(r.out.find('\x1b') == std::string::npos);
  CHECK(r.out.find('\x07') == std::string::npos);
  for (const char* what : {"host", "detail", "comm", "req", "origin", "thread", "note"})
    CHECK(Has(r.out, std::string(what) + "\\x1b]0;pwned\\x07\\x1b[2J"));
}

TEST_CASE("under a memory cap a dump too big for it gives one line naming it, never an abort", "[cli]") {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // A sanitizer reserves terabytes of address space for its shadow memory: under a cap on
  // virtual memory the command cannot even start. The main build runs this test.
  WARN("skipped under a sanitizer");
  return;
#endif
  // 16 MB of small numbers (8 M values, about 200 MB as JSON values) in a dump's detail.
  TempDir dir;
  const std::string c = "00000000000000cc";  // a stalled rank: analyze reads its detail
  Document d = Dump(0, 1, {Comm(c, 1, 0, 5, 5, 4)}, {Op(c, 5, "AllReduce", "gpu_reached", 700)}, "stall");
  std::string text = Text(d);
  std::string numbers = ",\"callsites\":[";
  for (int a = 0; a < 40; ++a) {
    numbers += a ? ",[1" : "[1";
    for (int i = 1; i < 200000; ++i) numbers += ",1";
    numbers += "]";
  }
  text.insert(text.rfind('}'), numbers + "]");
  const std::string name = DumpFileName(d);
  dir.Write(name, text);
  for (const std::string& args : {"show " + dir.path() + "/" + name + " --json", "show " + dir.path() + "/" + name,
                                 "analyze " + dir.path() + " --no-color"}) {
    INFO(args);
    auto r = RunCommand(args, 150 * 1024);
    CHECK((r.status == 0 || r.status == 1 || r.status == 2));  // not killed by SIGABRT
    CHECK(Has(r.err, name));
    CHECK_FALSE(Has(r.err, "bad_alloc"));
  }
}

TEST_CASE("analyze --json: a versioned report, frames as objects, culprit states for machines", "[cli]") {
  auto r = RunCommand("analyze " + Golden("rank_missing") + " --json");
  REQUIRE(r.status == 1);
  Json j = Json::parse(r.out);
  CHECK(j["format"] == ncclwatch::analysis::kReportFormatName);
  CHECK(j["version"] == ncclwatch::analysis::kReportVersion);
  const Json& s = j["verdicts"][0]["culprit_stacks"]["0"];
  CHECK(s["state"] == "outside_nccl");
  CHECK(s["comm_state"] == "not_called");
  CHECK(s["seq"] == 6);
  const Json& top = s["current"][0];
  CHECK(top["kind"] == "python");
  CHECK(top["function"] == "save_file");
  CHECK(top["line"] == 286);
  CHECK(top["file"].get<std::string>().find("safetensors") != std::string::npos);
  bool native = false;
  for (const auto& f : s["callsite"])
    if (f["kind"] == "native") {
      native = true;
      CHECK(f["module"].is_string());
      CHECK(f["offset"].is_number_integer());
      CHECK(f["ip"].get<std::string>().rfind("0x", 0) == 0);
    }
  CHECK(native);
}

TEST_CASE("a file for a directory, a directory for a file, a missing path: one line with the path and what to do", "[cli]") {
  const std::string file = FirstDump("rank_missing");
  auto analyze_file = RunCommand("analyze " + file);
  CHECK(analyze_file.status == 2);
  CHECK(std::count(analyze_file.err.begin(), analyze_file.err.end(), '\n') == 1);
  CHECK(Has(analyze_file.err, file + ": a file, not a directory of dumps"));
  CHECK(Has(analyze_file.err, "ncclwatch show " + file));

  auto show_dir = RunCommand("show " + Golden("rank_missing"));
  CHECK(show_dir.status == 2);
  CHECK(std::count(show_dir.err.begin(), show_dir.err.end(), '\n') == 1);
  CHECK(Has(show_dir.err, Golden("rank_missing") + ": a directory"));
  CHECK(Has(show_dir.err, "ncclwatch analyze " + Golden("rank_missing")));

  TempDir dir;
  const std::string nope = dir.path() + "/nope.json";
  auto show_missing = RunCommand("show " + nope);
  CHECK(show_missing.status == 2);
  CHECK(std::count(show_missing.err.begin(), show_missing.err.end(), '\n') == 1);
  CHECK(Has(show_missing.err, "ncclwatch: " + nope + ": "));  // the path given, not its base name
  CHECK(Has(show_missing.err, "give the path of a dump"));

  auto analyze_missing = RunCommand("analyze " + dir.path() + "/none");
  CHECK(analyze_missing.status == 2);
  CHECK(std::count(analyze_missing.err.begin(), analyze_missing.err.end(), '\n') == 1);
  CHECK(Has(analyze_missing.err, "give the job's dump directory"));
}

TEST_CASE("show says who asked for a dump and what a rank with operations in flight may be doing", "[cli]") {
  TempDir dir;
  const std::string world = "000000000000000a";
  Document d = Dump(1, 2, {Comm(world, 2, 1, 8, 8, 7)}, {Op(world, 8, "AllReduce", "gpu_reached", 30)});
  d.summary.answered = ncclwatch::trace::AnsweredRequest{"cli-vm-1-2", -1, "vm", "on_demand"};
  dir.Write(DumpFileName(d), Text(d));
  auto r = RunCommand("show " + dir.path() + "/" + DumpFileName(d));
  REQUIRE(r.status == 0);
  CHECK(Has(r.out, "asked by `ncclwatch dump` on vm"));
  CHECK_FALSE(Has(r.out, "rank -1"));
  CHECK(Has(r.out, "in NCCL: no thread inside an NCCL call; 1 operation in flight"));
  // What is known is said, without a hedge: the oldest operation's place on the GPU.
  CHECK(Has(r.out, "the oldest AllReduce #8 (its GPU is inside it)"));
  CHECK_FALSE(Has(r.out, "busy elsewhere meanwhile"));
}

TEST_CASE("analyze --verbose tells dumps that followed a teardown from earlier ones", "[cli]") {
  // Rank 0 aborted (the framework's timeout), then died of the SIGABRT after it: the abort is
  // the evidence; the later crash dump is history but not an "earlier" dump.
  TempDir dir;
  const std::string world = "000000000000000a";
  Document abort = Dump(0, 2, {Comm(world, 2, 0, 8, 8, 7)}, {Op(world, 8, "AllReduce", "gpu_reached", 700)}, "abort");
  Document crash = abort;
  crash.summary.reason = ncclwatch::trace::DumpReasonValue::Of(ncclwatch::trace::DumpReason::FatalSignal);
  crash.summary.dump_seq = 1;
  Document other = Dump(1, 2, {Comm(world, 2, 1, 7, 7, 7)});
  for (const auto& d : {abort, crash, other}) dir.Write(DumpFileName(d), Text(d));
  auto r = RunCommand("analyze --verbose --no-color " + dir.path());
  CHECK(Has(r.out, "other dumps of these ranks"));
  CHECK_FALSE(Has(r.out, "earlier dumps"));
  CHECK(Has(r.out, "(fatal_signal; later than the evidence"));
  auto j = Json::parse(RunCommand("analyze --json " + dir.path()).out);
  REQUIRE(j[rk::kEarlierDumps].size() == 1);
  CHECK(j[rk::kEarlierDumps][0][rk::kLater] == true);
}

TEST_CASE("docs/install.md lists every subcommand the command has", "[cli]") {
  std::ifstream in((fs::path(DOCS_DIR) / "install.md").string());
  const std::string doc((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string row = doc.substr(doc.find("`P/bin/ncclwatch`"), 200);
  const std::string help = RunCommand("--help").out + RunCommand("--help").err;
  std::istringstream lines(help.substr(help.find("subcommands:")));
  std::string line;
  std::getline(lines, line);
  int listed = 0;
  while (std::getline(lines, line) && line.rfind("  ", 0) == 0) {
    std::istringstream words(line);
    std::string name;
    words >> name;
    if (name == "help") continue;
    ++listed;
    CHECK(Has(row, "`" + name + "`"));
  }
  CHECK(listed >= 5);
}
