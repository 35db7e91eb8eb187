// The dump reader and the directory loader: early stop after the summary, the version check,
// and one clear line per bad file while the rest is still analyzed.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <map>

#include <catch2/catch.hpp>

#include "format/dump_reader.h"
#include "render/render_report.h"
#include "fixtures.h"

using namespace ncclwatch;
using namespace ncclwatch::testing;
using trace::ReadDepth;
using json = nlohmann::ordered_json;
namespace key = trace::key;

namespace {

// A dump with a big ring after its summary, as the writer lays it out.
Document DumpWithRing(size_t entries) {
  Document d = Dump(0, 2, {Comm("c0", 2, 0, 5, 5, 5)});
  auto n = static_cast<int64_t>(entries);
  d.detail.ring = {n, n, 0, {}};
  for (int64_t i = 0; i < n; ++i) d.detail.ring.entries.push_back(Op("c0", i + 1, "AllReduce", "completed", -1));
  d.detail.threads.push_back({1000, "main", {}, ""});
  return d;
}

bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("summary pass stops after the summary and does not read the whole file", "[reader]") {
  TempDir dir;
  // 16000 entries: a big file even in version 2's compact ring, within the reader's window.
  std::string path = dir.Write("rank00000-h-1-0-stall.json", Text(DumpWithRing(16000)));
  analysis::Dump d;
  auto r = trace::ReadDumpFile(path, trace::ReadDepth::kSummary, &d);
  REQUIRE(r.usable);
  CHECK(r.problem.empty());
  CHECK(d.summary.rank == 0);
  CHECK(d.summary.comms.size() == 1);
  CHECK(d.detail == nullptr);
  REQUIRE(r.file_size > 60000);
  CHECK(r.bytes_read < r.file_size / 4);

  analysis::Dump full;
  auto rf = trace::ReadDumpFile(path, trace::ReadDepth::kFull, &full);
  REQUIRE(rf.usable);
  CHECK(rf.bytes_read == rf.file_size);
  REQUIRE(full.detail);
  CHECK(full.detail->ring.entries.size() == 16000);
  CHECK(full.detail->threads.size() == 1);
}

TEST_CASE("a version this reader does not know is refused with a message", "[reader]") {
  json d = AsJson(Dump(0, 1, {}));
  d[key::kVersion] = trace::kTraceVersion + 1;
  analysis::Dump out;
  auto r = trace::ReadDumpBuffer(d.dump(), trace::ReadDepth::kSummary, &out);
  CHECK_FALSE(r.usable);
  CHECK(r.newer_version);
  CHECK(Contains(r.problem, "trace version " + std::to_string(trace::kTraceVersion + 1) +
                                ", written by a newer ncclwatch: upgrade"));
  d[key::kVersion] = trace::kOldestTraceVersion - 1;
  r = trace::ReadDumpBuffer(d.dump(), trace::ReadDepth::kSummary, &out);
  CHECK_FALSE(r.usable);
  CHECK_FALSE(r.newer_version);
  CHECK(Contains(r.problem, "unknown trace version " + std::to_string(trace::kOldestTraceVersion - 1)));
}

TEST_CASE("the files of a newer ncclwatch give one problem line, not one each", "[reader]") {
  TempDir dir;
  dir.Write(DumpFileName(Dump(0, 4, {})), Text(Dump(0, 4, {})));
  for (int rank = 1; rank < 4; ++rank) {
    json future = AsJson(Dump(rank, 4, {}));
    future[key::kVersion] = trace::kTraceVersion + 1;
    dir.Write(DumpFileName(Dump(rank, 4, {})), future.dump());
  }
  analysis::DumpSet set;
  std::string error;
  REQUIRE(set.Load(dir.path(), {}, &error));
  CHECK(set.dumps().size() == 1);
  REQUIRE(set.problems().size() == 1);
  const std::string line = analysis::ProblemLine(set.problems()[0]);
  CHECK(Contains(line, "written by a newer ncclwatch: upgrade"));
  CHECK(Contains(line, "so are 2 more files here; all skipped"));
  CHECK(line.find('\n') == std::string::npos);
}

TEST_CASE("bad inputs give one line each", "[reader]") {
  Document small = Dump(0, 1, {});
  small.detail.light = true;  // the summary is nearly all of it: half the text cuts inside it
  std::string good = Text(small);
  struct Case {
    std::string input;
    std::string expect;
  } cases[] = {
      {"", "empty file"},
      {"[1,2,3]", "not an ncclwatch dump (not a JSON object)"},
      {"42", "not an ncclwatch dump (not a JSON object)"},
      {"{\"hello\":1}", "not an ncclwatch dump (no \"format\" key)"},
      {"{\"format\":\"other\",\"version\":1,\"summary\":{}}", "not an ncclwatch dump (format is \"other\")"},
      {good.substr(0, good.size() / 2), "truncated JSON at byte " + std::to_string(good.size() / 2) + " (summary unreadable)"},
      {"{\"format\":\"ncclwatch-trace\",\"version\":1,\"summary\":{\"rank\":x}}", "invalid JSON at byte"},
      {"{\"format\":\"ncclwatch-trace\",\"version\":1,\"summary\":[]}", "\"summary\" is not an object"},
      {std::string(200, '[') , "not an ncclwatch dump (not a JSON object)"},
      {"{\"format\":\"ncclwatch-trace\",\"version\":1,\"summary\":" + std::string(100, '[') + std::string(100, ']') + "}",
       "nesting deeper than"},
  };
  for (const auto& c : cases) {
    INFO("input: " << c.input.substr(0, 80));
    analysis::Dump out;
    auto r = trace::ReadDumpBuffer(c.input, trace::ReadDepth::kSummary, &out);
    CHECK_FALSE(r.usable);
    CHECK(Contains(r.problem, c.expect));
    CHECK(r.problem.find('\n') == std::string::npos);
  }
}

TEST_CASE("a dump cut after its summary is usable, with the detail problem said", "[reader]") {
  std::string text = Text(DumpWithRing(200));
  std::string cut = text.substr(0, text.size() * 3 / 4);
  analysis::Dump d;
  auto r = trace::ReadDumpBuffer(cut, trace::ReadDepth::kFull, &d);
  REQUIRE(r.usable);
  CHECK(Contains(r.problem, "truncated JSON at byte " + std::to_string(cut.size())));
  CHECK(Contains(r.problem, "details unreadable; summary used"));
  CHECK(d.summary.comms.size() == 1);
}

TEST_CASE("missing optional keys read as absent", "[reader]") {
  // Only what a minimal writer must write: no in_flight, no p2p, no host, no times.
  json summary = {{key::kRank, 3}, {key::kComms, json::array({{{key::kId, "c"}, {key::kSize, 4}, {key::kRank, 3}}})}};
  json d = {{key::kFormat, trace::kFormatName}, {key::kVersion, 1}, {key::kSummary, summary}};
  analysis::Dump out;
  auto r = trace::ReadDumpBuffer(d.dump(), trace::ReadDepth::kFull, &out);
  REQUIRE(r.usable);
  CHECK(out.summary.rank == 3);
  CHECK(out.summary.world_size == -1);
  CHECK(out.summary.in_flight.empty());
  REQUIRE(out.summary.comms.size() == 1);
  CHECK(out.summary.comms[0].last_enqueued == 0);
  CHECK(out.detail->ring.entries.empty());

  // Mistyped values read as absent too, never as an error.
  summary[key::kRank] = "three";
  summary[key::kComms][0][key::kSize] = json::array();
  d[key::kSummary] = summary;
  analysis::Dump odd;
  REQUIRE(trace::ReadDumpBuffer(d.dump(), trace::ReadDepth::kSummary, &odd).usable);
  CHECK(odd.summary.rank == trace::kUnknownRank);
  CHECK(odd.summary.comms[0].size == 0);
}

TEST_CASE("the loader reports each bad file in one line and analyzes the rest", "[reader][dumpset]") {
  TempDir dir;
  const std::string c = "00000000000000aa";
  std::vector<Document> good;
  for (int r = 0; r < 4; ++r) good.push_back(Dump(r, 4, {Comm(c, 4, r, 3, 3, 3)}, {}, "on_demand"));
  for (const auto& d : good) dir.Write(DumpFileName(d), Text(d));
  const std::string cut = "{\"format\":\"ncclwatch-trace\",\"ver";
  dir.Write("rank00007-h-1-0-stall.json", cut);
  dir.Write("rankx-foreign-1-0-stall.json", "{\"a\":1}");
  json future = AsJson(Dump(5, 4, {}));
  future[key::kVersion] = 99;
  dir.Write("rank00005-h-9-0-stall.json", future.dump());
  dir.Write("rank00006-h-1-0-stall.json", "");
  REQUIRE(::mkdir((dir.path() + "/rank00008-h-1-0-stall.json").c_str(), 0755) == 0);
  REQUIRE(::symlink("/nonexistent/nowhere", (dir.path() + "/rank00009-h-1-0-stall.json").c_str()) == 0);
  // A FIFO named like a dump: refused at once, never waited on (no writer will ever come).
  REQUIRE(::mkfifo((dir.path() + "/rank00010-h-1-0-stall.json").c_str(), 0644) == 0);
  dir.Write("dump-request.json", "{}");    // not a dump: ignored silently
  dir.Write("notes.txt", "hello");         // not a dump name: ignored silently
  // Two processes claiming rank 2 at the same time: the second is reported.
  Document twin = good[2];
  twin.summary.pid = 4242;
  dir.Write(DumpFileName(twin), Text(twin));

  analysis::DumpSet set;
  std::string error;
  REQUIRE(set.Load(dir.path(), {}, &error));
  CHECK(set.dumps().size() == 4);
  std::map<std::string, std::string> problems;
  for (const auto& p : set.problems()) problems[p.file] = analysis::ProblemText(p);
  CHECK(problems.size() == 8);
  CHECK(Contains(problems["rank00007-h-1-0-stall.json"], "truncated JSON at byte " + std::to_string(cut.size()) + " (summary unreadable); skipped"));
  CHECK(Contains(problems["rankx-foreign-1-0-stall.json"], "not an ncclwatch dump"));
  CHECK(Contains(problems["rank00005-h-9-0-stall.json"], "trace version 99, written by a newer ncclwatch: upgrade"));
  CHECK(Contains(problems["rank00006-h-1-0-stall.json"], "empty file"));
  CHECK(Contains(problems["rank00008-h-1-0-stall.json"], "is a directory"));
  CHECK(Contains(problems["rank00009-h-1-0-stall.json"], "cannot open"));
  CHECK(Contains(problems["rank00010-h-1-0-stall.json"], "not a regular file"));
  CHECK(Contains(problems[DumpFileName(twin)], "claims rank 2 at the same time as"));
  auto report = analysis::Attribute(set);
  CHECK(report.verdicts.front().cause == analysis::Cause::NoHang);
}

TEST_CASE("with a summary cache a load reads only the dumps new or replaced since the last", "[dumpset]") {
  TempDir dir;
  const std::string c = "00000000000000cc";
  Document r0 = Dump(0, 2, {Comm(c, 2, 0, 5, 5, 4)}, {Op(c, 5, "AllReduce", "gpu_reached")});
  dir.Write(DumpFileName(r0), Text(r0));
  analysis::SummaryCache cache;
  analysis::LoadOptions options;
  options.cache = &cache;
  std::string error;
  analysis::DumpSet first;
  REQUIRE(first.Load(dir.path(), options, &error));
  CHECK(first.files_read() == 1);

  Document r1 = Dump(1, 2, {Comm(c, 2, 1, 4, 4, 4)});
  dir.Write(DumpFileName(r1), Text(r1));
  analysis::DumpSet second, plain;
  REQUIRE(second.Load(dir.path(), options, &error));
  REQUIRE(plain.Load(dir.path(), {}, &error));
  CHECK(second.files_read() == 1);
  CHECK(second.files_seen() == 2);
  REQUIRE(second.dumps().size() == 2);
  auto cached = analysis::Attribute(second), read = analysis::Attribute(plain);
  REQUIRE(cached.verdicts.size() == read.verdicts.size());
  CHECK(cached.verdicts.front().cause == analysis::Cause::RankMissing);
  CHECK(cached.verdicts.front().culprit_ranks == read.verdicts.front().culprit_ranks);

  // A dump renamed over an old one (a new inode) is read again; a file gone is forgotten.
  r1.summary.comms[0].last_enqueued = 5;
  std::string tmp = dir.Write(".tmp-r1", Text(r1));
  REQUIRE(::rename(tmp.c_str(), (dir.path() + "/" + DumpFileName(r1)).c_str()) == 0);
  REQUIRE(::unlink((dir.path() + "/" + DumpFileName(r0)).c_str()) == 0);
  analysis::DumpSet third;
  REQUIRE(third.Load(dir.path(), options, &error));
  CHECK(third.files_read() == 1);
  REQUIRE(third.dumps().size() == 1);
  CHECK(third.dumps()[0].summary.comms[0].last_enqueued == 5);
  CHECK(cache.files() == 1);
}

TEST_CASE("several dumps of one rank: the latest is the evidence", "[dumpset]") {
  TempDir dir;
  const std::string c = "00000000000000bb";
  // Same process: greatest dump_seq wins. Rank 1 dumped before the hang, then in it.
  Document early = Dump(1, 2, {Comm(c, 2, 1, 3, 3, 3)}, {}, "on_demand");
  Document late = Dump(1, 2, {Comm(c, 2, 1, 4, 3, 3)}, {Op(c, 4, "AllReduce", "enqueued")}, "peer_request");
  late.summary.dump_seq = 1;
  // A restarted rank 0 (new pid, later wall clock) replaces the old process.
  Document old0 = Dump(0, 2, {Comm(c, 2, 0, 9, 9, 9)}, {}, "on_demand");
  old0.summary.time_unix_ns = 1600000000000000000LL;
  old0.summary.pid = 7;
  Document new0 = Dump(0, 2, {Comm(c, 2, 0, 4, 4, 3)}, {Op(c, 4, "AllReduce", "gpu_reached")}, "stall");
  auto report = Analyze(dir, {early, late, old0, new0});
  REQUIRE(report.verdicts.size() == 1);
  CHECK(report.verdicts[0].cause == analysis::Cause::GpuNotReached);
  CHECK(report.verdicts[0].culprit_ranks == std::vector<int>{1});
  // Two processes claiming one rank in one attempt is said, in one line.
  REQUIRE(report.problems.size() == 1);
  CHECK(Contains(analysis::ProblemText(report.problems[0]), "another process claims rank 0 with a later dump"));
}

TEST_CASE("the file name's rank is parsed for unreadable dumps", "[dumpset]") {
  CHECK(analysis::RankFromFileName("rank00042-host-1-0-stall.json") == 42);
  CHECK(analysis::RankFromFileName("rankx-host-1-0-stall.json") == -1);
  CHECK(analysis::RankFromFileName("rank-host.json") == -1);
  CHECK(analysis::RankFromFileName("other.json") == -1);
}

TEST_CASE("memory stays bounded whatever a file holds: huge strings and arrays give one line", "[reader]") {
  // A 2 MiB string in the summary: the dump is refused, with why.
  Document big = Dump(0, 1, {});
  big.summary.detail = std::string(2 << 20, 'x');
  analysis::Dump out;
  auto r = trace::ReadDumpBuffer(Text(big), trace::ReadDepth::kSummary, &out);
  CHECK_FALSE(r.usable);
  CHECK(Contains(r.problem, "too large: a string of 2097152 bytes"));

  // An array of 300,000 threads after the summary: the summary is used, the detail is not.
  Document many = Dump(0, 1, {Comm("c0", 1, 0, 1, 1, 1)});
  many.detail.threads.assign(300000, trace::Thread{1, "t", {}, ""});
  analysis::Dump partial;
  auto rp = trace::ReadDumpBuffer(Text(many), trace::ReadDepth::kFull, &partial);
  REQUIRE(rp.usable);
  CHECK(Contains(rp.problem, "too large: an array of more than 262144 elements"));
  CHECK(partial.summary.comms.size() == 1);
}

// Arrays of small numbers: few bytes each on disk, 16 and more in memory.
std::string SmallNumbers(size_t arrays, size_t each) {
  Document d = Dump(0, 1, {Comm("c0", 1, 0, 1, 1, 1)});
  std::string text = Text(d);
  std::string numbers = "\"callsites\":[";
  for (size_t a = 0; a < arrays; ++a) {
    numbers += a ? ",[" : "[";
    for (size_t i = 0; i < each; ++i) numbers += i ? ",1" : "1";
    numbers += "]";
  }
  numbers += "],";
  text.insert(text.find("\"summary\""), numbers);
  return text;
}

TEST_CASE("memory per file is bounded, not only its bytes: many small numbers give one line", "[reader]") {
  // 2.4 MB of numbers under a 4 MiB bound (the default is the same check at 256 MiB).
  std::string text = SmallNumbers(12, 100000);
  auto doc = trace::ParseDocumentFromBuffer(text, ReadDepth::kFull, uint64_t{4} << 20);
  CHECK(doc.too_large);
  CHECK(Contains(doc.error_text, "JSON values of more than 4 MiB in memory"));
  analysis::Dump out;
  auto r = trace::InterpretDocument(doc, ReadDepth::kFull, &out);
  CHECK_FALSE(r.usable);  // the bound was reached before the summary
  CHECK(Contains(r.problem, "too large"));
  // The same values under the default bound, and the ring's window given back as it moves on.
  CHECK_FALSE(trace::ParseDocumentFromBuffer(text, ReadDepth::kFull).too_large);
  CHECK_FALSE(trace::ParseDocumentFromBuffer(Text(DumpWithRing(40000)), ReadDepth::kFull, uint64_t{96} << 20).too_large);
}

TEST_CASE("a huge ring keeps its newest entries only", "[reader]") {
  Document d = DumpWithRing(40000);
  analysis::Dump full;
  auto r = trace::ReadDumpBuffer(Text(d), trace::ReadDepth::kFull, &full);
  REQUIRE(r.usable);
  CHECK(r.problem.empty());
  REQUIRE(full.detail);
  REQUIRE(full.detail->ring.entries.size() == 16384);
  CHECK(full.detail->ring.entries.front().seq == 40000 - 16384 + 1);
  CHECK(full.detail->ring.entries.back().seq == 40000);
  CHECK(full.detail->threads.size() == 1);  // what follows the ring is still read
}

TEST_CASE("values out of range are read as absent and said in one line", "[reader]") {
  json d = AsJson(Dump(0, 2, {Comm("c0", 2, 0, 5, 5, 5)}));
  d[key::kSummary][key::kComms][0][key::kLastEnqueued] = json::parse("18446744073709551615");
  d[key::kSummary][key::kRank] = 1 << 30;
  analysis::Dump out;
  auto r = trace::ReadDumpBuffer(d.dump(), trace::ReadDepth::kSummary, &out);
  REQUIRE(r.usable);
  CHECK(Contains(r.problem, "values out of range read as absent:"));
  CHECK(Contains(r.problem, "last_enqueued=18446744073709551615"));
  CHECK(Contains(r.problem, "rank=1073741824"));
  CHECK(out.summary.rank == trace::kUnknownRank);
  CHECK(out.summary.comms[0].last_enqueued == trace::kMaxSeq);
  CHECK(r.problem.find('\n') == std::string::npos);

  analysis::Dump clean;
  CHECK(trace::ReadDumpBuffer(Text(Dump(0, 2, {Comm("c0", 2, 0, 5, 5, 5)})), trace::ReadDepth::kSummary, &clean).problem.empty());
}

TEST_CASE("hostile version 2 rings and module tables read tolerantly", "[reader]") {
  const std::string head = std::string("{\"format\":\"") + trace::kFormatName +
                           "\",\"version\":2,\"summary\":{\"rank\":0,\"host\":\"h\",\"comms\":[]},";
  const char* bodies[] = {
      // rows before any shape, slots out of range, non-integers, nested junk, floats
      "\"ring\":{\"columns\":[\"shape\",\"seq\",\"enqueue_ns\"],\"rows\":[[0,1,2],[99999,1],[-5],[\"x\",{}],"
      "[1.5,2.5],[],3,null,{\"op\":\"AllReduce\"},[0,9223372036854775807,9223372036854775807],[0,1,1]]}",
      // columns missing or of the wrong type; rows not an array
      "\"ring\":{\"columns\":7,\"rows\":[{\"comm\":5},[0,1]]}",
      "\"ring\":{\"rows\":{\"a\":1}}",
      // module indexes out of range, of the wrong type; modules not an array
      "\"modules\":[{\"path\":\"/lib/a.so\"},7],\"threads\":[{\"tid\":1,\"frames\":[{\"ip\":\"0x1\",\"module\":0},"
      "{\"ip\":\"0x2\",\"module\":1},{\"ip\":\"0x3\",\"module\":-1},{\"ip\":\"0x4\",\"module\":99},"
      "{\"ip\":\"0x5\",\"module\":\"/lib/b.so\"}]}]",
      "\"modules\":{\"x\":1},\"callsites\":[{\"id\":0,\"frames\":[{\"ip\":\"0x1\",\"module\":0}]}]",
  };
  for (const char* body : bodies) {
    INFO(body);
    trace::LoadedDump d;
    trace::ReadResult r = trace::ReadDumpBuffer(head + body + "}", trace::ReadDepth::kFull, &d);
    REQUIRE(r.usable);
    REQUIRE(d.detail);
    for (const auto& op : d.detail->ring.entries) CHECK((op.OpName() == std::string("AllReduce") || op.OpName() == std::string()));
    for (const auto& t : d.detail->threads)
      for (const auto& f : t.stack.native) CHECK((f.module.empty() || f.module == "/lib/a.so" || f.module == "/lib/b.so"));
  }
  // The first ring: the shape defined mid-array applies to the rows after it.
  trace::LoadedDump d;
  REQUIRE(trace::ReadDumpBuffer(head + bodies[0] + "}", trace::ReadDepth::kFull, &d).usable);
  REQUIRE(!d.detail->ring.entries.empty());
  CHECK(d.detail->ring.entries.back().OpName() == std::string("AllReduce"));
}

TEST_CASE("a key given twice is refused, named, wherever it is", "[reader]") {
  TempDir dir;
  const std::string text = Text(Dump(3, 4, {Comm("c0", 4, 3, 5, 5, 5)}));
  // `"rank":3,"rank":0`: read as the last one, it would make this rank 3's dump rank 0's.
  const size_t at = text.find("\"rank\":3");
  REQUIRE(at != std::string::npos);
  std::string in_summary = text;
  in_summary.insert(at + 8, ",\"rank\":0");
  // At the top level too: a second "summary" object.
  std::string top = text;
  top.insert(top.rfind('}'), ",\"summary\":{}");
  // (The summary pass stops after the summary: a second one after it is seen by a full read.)
  for (int which = 0; which < 2; ++which) {
    const std::string& bad = which == 0 ? in_summary : top;
    for (ReadDepth depth : {ReadDepth::kSummary, ReadDepth::kFull}) {
      if (which == 1 && depth == ReadDepth::kSummary) continue;
      analysis::Dump d;
      auto r = trace::ReadDumpFile(dir.Write("rank00003-h-1-0-stall.json", bad), depth, &d);
      INFO(r.problem);
      CHECK_FALSE(r.usable);
      CHECK(Contains(r.problem, "is given twice"));
    }
  }
}

TEST_CASE("a dump whose file name says another rank than its summary is not used", "[reader]") {
  TempDir dir;
  const std::string text = Text(Dump(0, 4, {Comm("c0", 4, 0, 5, 5, 5)}));
  analysis::Dump d;
  auto r = trace::ReadDumpFile(dir.Write("rank00003-h-1-0-stall.json", text), ReadDepth::kSummary, &d);
  CHECK_FALSE(r.usable);
  CHECK(Contains(r.problem, "its name says rank 3 but its summary says rank 0"));
  // The same file under its own rank's name, or under a name that is not a dump's, is read.
  analysis::Dump same;
  CHECK(trace::ReadDumpFile(dir.Write("rank00000-h-1-0-stall.json", text), ReadDepth::kSummary, &same).usable);
  analysis::Dump renamed;
  CHECK(trace::ReadDumpFile(dir.Write("copy.json", text), ReadDepth::kSummary, &renamed).usable);
}

TEST_CASE("a huge string is cut as it is read, not held whole first", "[reader]") {
  // 64 MiB of command line: the parser would hold it all (and grow its buffer to twice that)
  // before the bound could refuse it. Cut as its bytes go by: read stops a few MiB into it.
  TempDir dir;
  Document big = Dump(0, 1, {});
  big.summary.detail = std::string(size_t{64} << 20, 'x');
  analysis::Dump out;
  for (ReadDepth depth : {ReadDepth::kSummary, ReadDepth::kFull}) {
    auto r = trace::ReadDumpFile(dir.Write("rank00000-h-1-0-stall.json", Text(big)), depth, &out);
    CHECK_FALSE(r.usable);
    CHECK(Contains(r.problem, "too large: a string of more than 1048576 bytes"));
    CHECK(r.bytes_read < (uint64_t{16} << 20));
  }
}
