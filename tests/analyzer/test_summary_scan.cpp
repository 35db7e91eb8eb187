// The summary pass's fast path (format/summary_scan.h) against the generic reader it stands in
// for: on every golden set, every generator scenario, files cut at every byte around the
// summary's end, bytes broken one at a time, and odd but valid JSON, ReadDumpFile must give the
// same records and the same result (usable, problem line, sizes) with the fast path as without.
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "format/dump_reader.h"
#include "format/file_name.h"
#include "format/summary_scan.h"
#include "fixtures.h"

using namespace ncclwatch;
using namespace ncclwatch::testing;
using trace::ReadDepth;
namespace fs = std::filesystem;

namespace {

struct ScanOn {  // whatever a check does, the fast path is on again after it
  ~ScanOn() { trace::UseSummaryScan(true); }
};

// Reads `path` both ways and checks they agree. Returns whether the fast path took it.
bool ExpectSameBothWays(const std::string& path) {
  ScanOn on;
  trace::LoadedDump fast, slow;
  trace::UseSummaryScan(true);
  trace::ReadResult a = trace::ReadDumpFile(path, ReadDepth::kSummary, &fast);
  trace::UseSummaryScan(false);
  trace::ReadResult b = trace::ReadDumpFile(path, ReadDepth::kSummary, &slow);
  INFO(path << ": " << b.problem);
  CHECK(a.usable == b.usable);
  CHECK(a.problem == b.problem);
  CHECK(a.newer_version == b.newer_version);
  CHECK(a.bytes_read == b.bytes_read);
  CHECK(a.file_size == b.file_size);
  CHECK(fast.version == slow.version);
  CHECK(fast.summary == slow.summary);
  CHECK(!fast.detail);
  // Whether the fast path read it: the file's first MiB, scanned alone.
  std::ifstream f(path, std::ios::binary);
  std::string head(1 << 20, '\0');
  f.read(head.data(), static_cast<std::streamsize>(head.size()));
  head.resize(static_cast<size_t>(f.gcount()));
  int version = 0;
  trace::Summary summary;
  return trace::ScanSummary(head, &version, &summary);
}

// Every file of a directory, both ways. Returns how many dumps the generic reader found usable
// and clean, and how many of those the fast path took.
std::pair<int, int> ExpectDirSameBothWays(const std::string& dir) {
  int clean = 0, scanned = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file() || e.path().extension() != ".json" || e.path().filename() == "expected.json") continue;
    bool took = ExpectSameBothWays(e.path().string());
    trace::LoadedDump d;
    trace::UseSummaryScan(false);
    trace::ReadResult r = trace::ReadDumpFile(e.path().string(), ReadDepth::kSummary, &d);
    trace::UseSummaryScan(true);
    if (r.usable && r.problem.empty()) {
      ++clean;
      scanned += took;
    }
  }
  return {clean, scanned};
}

// Where the summary's object ends (the byte after its '}'), by brace depth outside strings.
size_t SummaryEnd(const std::string& text) {
  size_t start = text.find("\"summary\":");
  REQUIRE(start != std::string::npos);
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = start + 10; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  FAIL("no end of summary");
  return 0;
}

std::string GoldenFile(const std::string& set, const std::string& prefix) {
  for (const auto& e : fs::directory_iterator(std::string(GOLDEN_DIR) + "/" + set))
    if (e.path().filename().string().rfind(prefix, 0) == 0) return ReadFile(e.path().string());
  FAIL("no " << prefix << " in " << set);
  return {};
}

// A dump ncclwatch-gen writes, with every summary field the sets use: in_flight, trigger, comms.
std::string SampleDump() { return GoldenFile("rank_missing", "rank00002-"); }

}  // namespace

TEST_CASE("summary scan: every golden set reads the same both ways, and dumps ncclwatch wrote take the fast path") {
  int sets = 0;
  for (const auto& e : fs::directory_iterator(GOLDEN_DIR)) {
    if (!e.is_directory()) continue;
    ++sets;
    auto [clean, scanned] = ExpectDirSameBothWays(e.path().string());
    INFO(e.path().filename().string());
    CHECK(clean > 0);
    CHECK(scanned == clean);
  }
  CHECK(sets >= 26);
}

#ifdef NCCLWATCH_GEN_BIN
TEST_CASE("summary scan: every generator scenario, with bad, cut and duplicated files, reads the same both ways") {
  // The scenarios as the generator lists them: one added there is checked here.
  TempDir help_dir;
  std::string help_file = help_dir.path() + "/help.txt";
  (void)std::system((std::string(NCCLWATCH_GEN_BIN) + " --help >" + help_file + " 2>&1").c_str());
  std::string help = ReadFile(help_file);
  size_t at = help.find("scenarios:");
  REQUIRE(at != std::string::npos);
  std::istringstream names(help.substr(at + 10, help.find('\n', at) - at - 10));
  int scenarios = 0;
  for (std::string name; names >> name;) {
    ++scenarios;
    TempDir dir;
    std::string cmd = std::string(NCCLWATCH_GEN_BIN) + " --ranks 16 --ring 32 --lean --threads 1 --scenario " + name +
                      " --bad-files --truncate 3 --duplicate 2 --out " + dir.path() + " >/dev/null 2>&1";
    INFO(cmd);
    REQUIRE(WEXITSTATUS(std::system(cmd.c_str())) == 0);
    auto [clean, scanned] = ExpectDirSameBothWays(dir.path());
    CHECK(clean > 0);
    CHECK(scanned == clean);
  }
  CHECK(scenarios >= 20);
}
#endif

TEST_CASE("summary scan: a dump cut at every byte up to past its summary's end reads the same both ways") {
  TempDir dir;
  for (const std::string& text : {SampleDump(), GoldenFile("sim_gpu_not_reached", "rank00001-")}) {
    const size_t end = SummaryEnd(text);
    int scanned = 0;
    for (size_t n = 0; n <= std::min(text.size(), end + 64); ++n) {
      // Named as the writer names it, so that the name's rank is checked too.
      scanned += ExpectSameBothWays(dir.Write("rank00002-node0000-200002-0-stall.json", text.substr(0, n)));
    }
    CHECK(scanned == static_cast<int>(std::min(text.size(), end + 64) - end + 1));  // exactly the cuts after its end
  }
}

TEST_CASE("summary scan: a byte of the summary replaced by any of the JSON's own reads the same both ways") {
  TempDir dir;
  const std::string text = SampleDump();
  const size_t end = SummaryEnd(text);
  const std::string path = dir.path() + "/rank00002-node0000-200002-0-stall.json";
  const std::string bytes = std::string("\"\\}],:0 -.en\x80\x01", 14);
#if defined(__SANITIZE_ADDRESS__)
  // Under AddressSanitizer (ten times slower: 100 s, the longest test of that run) each position
  // gets 4 of the bytes and the next position the next 4, so each byte lands at two positions in
  // seven, every kind of position included. The main build tries every byte everywhere.
  const size_t per_position = 4;
#else
  const size_t per_position = bytes.size();
#endif
  for (size_t i = 0, next = 0; i <= end; ++i) {
    for (size_t k = 0; k < per_position; ++k, ++next) {
      std::string broken = text;
      broken[i] = bytes[next % bytes.size()];
      dir.Write("rank00002-node0000-200002-0-stall.json", broken);
      ExpectSameBothWays(path);
    }
  }
}

TEST_CASE("summary scan: odd but valid values read the same both ways") {
  TempDir dir;
  const std::string text = SampleDump();
  const size_t summary = text.find("\"summary\":{") + 11;
  const size_t end = SummaryEnd(text);
  // Each is put first in the summary (the rank's key is checked by name: it stays), or replaces
  // the summary's body, or the whole head.
  const std::vector<std::string> members = {
      "\"host\":\"a\\\"b\\\\c\\/d\\n\\t\\r\\b\\f\"", "\"host\":\"caf\\u00e9\"", "\"host\":\"caf\xc3\xa9\"",
      "\"host\":null", "\"host\":7", "\"pid\":-0", "\"pid\":1e2", "\"pid\":1.5", "\"pid\":9223372036854775807",
      "\"pid\":9223372036854775808", "\"pid\":-9223372036854775808", "\"pid\":-9223372036854775809",
      "\"pid\":18446744073709551616", "\"pid\":\"7\"", "\"pid\":true", "\"pid\":01", "\"pid\":-", "\"pid\":1.",
      "\"local_rank\":4294967296", "\"local_rank\":-5", "\"world_size\":16777216", "\"world_size\":-1",
      "\"world_size\":-2", "\"world_size\":16777215", "\"world_size\":2.0", "\"dump_seq\":null",
      "\"ring_overwritten\":1e400", "\"reason\":\"no_such_reason\"", "\"reason\":null", "\"reason\":3",
      "\"detail\":\"\"", "\"unknown_key\":1", "\"rank\":2", "\"stalled\":{}", "\"stalled\":{\"op\":\"Nope\"}",
      "\"stalled\":{\"op\":null,\"state\":\"nope\",\"seq\":-1}", "\"stalled\":{\"seq\":1152921504606846977}",
      "\"stalled\":{\"seq\":1152921504606846976,\"age_s\":1E-3,\"gpu_ms\":-0.0,\"root\":2147483648}",
      "\"stalled\":[]", "\"stalled\":{\"seq\":1,\"seq\":2}", "\"in_nccl\":null", "\"in_nccl\":[1]",
      "\"in_nccl\":[{\"tid\":1,\"function\":\"ncclAllReduce\",\"since_s\":2}]", "\"in_nccl\":{}",
      "\"exception\":{\"type\":\"ValueError\",\"message\":\"x\\ny\",\"line\":3}", "\"stopped\":{\"how\":\"stopped\"}",
      "\"exit_status\":-1", "\"error_result\":0", "\"states_as_of_mono_ns\":-1", "\"trigger\":null",
      "\"trigger\":{\"origin_rank\":4294967296}"};
  for (const auto& m : members) {
    std::string edited = text.substr(0, summary) + m + "," + text.substr(summary);
    ExpectSameBothWays(dir.Write("rank00002-node0000-200002-0-stall.json", edited));
  }
  // Communicators: no id (dropped), a rank past its size, a duplicated key, out of range.
  const size_t comms = text.find("\"comms\":[") + 9;
  for (const std::string& c : std::vector<std::string>{"{},", "{\"id\":\"\"},", "{\"id\":\"x\",\"size\":2,\"rank\":3},", "{\"id\":\"x\",\"id\":\"y\"},",
                              "{\"id\":\"x\",\"last_completed\":-1},", "{\"id\":\"\",\"last_completed\":-1},",
                              "{\"id\":\"x\",\"p2p\":[{\"peer\":1,\"send_enqueued\":2}]},", "{\"id\":\"x\",\"p2p\":[{\"peer\":-1}]},",
                              "{\"id\":\"x\",\"p2p\":[{\"peer\":-3}]},", "null,", "[],"}) {
    ExpectSameBothWays(dir.Write("rank00002-node0000-200002-0-stall.json", text.substr(0, comms) + c + text.substr(comms)));
  }
  // The summary's body and the head around it.
  const std::string body = text.substr(summary, end - 1 - summary);
  const std::string rest = text.substr(end);
  for (const std::string& head : std::vector<std::string>{
        "{\"format\":\"ncclwatch-trace\",\"version\":3,\"summary\":{" + body + "}",
        " \n\t{ \"format\" : \"ncclwatch-trace\" , \"version\" : 3 , \"summary\" : { " + body + " } ",
        "\xef\xbb\xbf{\"format\":\"ncclwatch-trace\",\"version\":3,\"summary\":{" + body + "}",
        "{\"summary\":{" + body + "},\"version\":3,\"format\":\"ncclwatch-trace\"",
        "{\"version\":1,\"format\":\"ncclwatch-trace\",\"summary\":{" + body + "}",
        "{\"format\":\"ncclwatch-trace\",\"version\":4,\"summary\":{" + body + "}",
        "{\"format\":\"ncclwatch-trace\",\"version\":0,\"summary\":{" + body + "}",
        "{\"format\":\"ncclwatch-trace\",\"version\":\"3\",\"summary\":{" + body + "}",
        "{\"format\":\"ncclwatch-trace\",\"version\":3.0,\"summary\":{" + body + "}",
        "{\"format\":\"other\",\"version\":3,\"summary\":{" + body + "}",
        "{\"format\":\"ncclwatch-trace\",\"format\":\"ncclwatch-trace\",\"version\":3,\"summary\":{" + body + "}",
        "{\"extra\":1,\"format\":\"ncclwatch-trace\",\"version\":3,\"summary\":{" + body + "}",
        "{\"format\":\"ncclwatch-trace\",\"version\":3,\"summary\":null",
        "{\"format\":\"ncclwatch-trace\",\"version\":3,\"summary\":{}",
        "{\"format\":\"ncclwatch-trace\",\"summary\":{" + body + "}",
        "[{\"format\":\"ncclwatch-trace\",\"version\":3,\"summary\":{" + body + "}"}) {
    ExpectSameBothWays(dir.Write("rank00002-node0000-200002-0-stall.json", head + rest));
    ExpectSameBothWays(dir.Write("other-name.json", head + rest));  // not named as a dump: any rank
  }
}

TEST_CASE("summary scan: the version is the last value of the first chunk, cut or not") {
  // A number at the end of the bytes read may go on in the file: the fast path leaves it.
  TempDir dir;
  const std::string text = SampleDump();
  const size_t summary_end = SummaryEnd(text);
  const size_t summary = text.find("\"summary\":{") + 10;
  const std::string head =
      "{\"summary\":" + text.substr(summary, summary_end - summary) + ",\"format\":\"ncclwatch-trace\",\"version\":";
  REQUIRE(head.size() < 8 * 1024);
  const std::string padded = head + std::string(8 * 1024 - head.size() - 1, ' ');  // the chunk ends after the digit
  ExpectSameBothWays(dir.Write("a.json", padded + "3}" ));
  ExpectSameBothWays(dir.Write("b.json", padded + "31}"));
  trace::LoadedDump d;  // version 31, not the 3 of the first chunk
  CHECK(trace::ReadDumpFile(dir.path() + "/b.json", ReadDepth::kSummary, &d).newer_version);
  ExpectSameBothWays(dir.Write("c.json", padded + "3"));
}
