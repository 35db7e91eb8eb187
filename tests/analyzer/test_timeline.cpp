// `ncclwatch timeline`: the trace-event structure Perfetto and chrome://tracing read, and
// clock alignment checked against dump sets whose true host clock offsets are known.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "model/clock_align.h"
#include "render/timeline.h"
#include "fixtures.h"

using namespace ncclwatch;
using namespace ncclwatch::testing;
using analysis::AlignClocks;
using analysis::CollectRankTimes;

namespace {

// Ranks on hosts whose monotonic clocks start at `host_clock_ns[h]` before true time 0: the
// same moment reads true + host_clock_ns[h] on host h. `collectives` AllReduces on one
// communicator of every rank, 1 ms apart; completions within +-30 us of each other.
std::vector<Document> Job(const std::vector<int>& host_of_rank, const std::vector<int64_t>& host_clock_ns,
                          int collectives, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int n = static_cast<int>(host_of_rank.size());
  std::vector<Document> out;
  for (int r = 0; r < n; ++r) {
    const int h = host_of_rank[r];
    const int64_t clock = host_clock_ns[h];
    Document d = Dump(r, n, {Comm("00000000000c0ffe", n, r, collectives, collectives, collectives)}, {}, "on_demand");
    d.summary.host = "host" + std::to_string(h);
    const int64_t true_dump_ns = 10000000000LL + 1000000LL * collectives;
    d.summary.time_mono_ns = true_dump_ns + clock;
    d.summary.time_unix_ns = 1700000000000000000LL + true_dump_ns + static_cast<int64_t>(rng() % 2000000);  // NTP: ms off
    d.detail.ring.capacity = 4096;
    d.detail.ring.recorded = collectives;
    for (int k = 1; k <= collectives; ++k) {
      trace::Op op = Op("00000000000c0ffe", k, "AllReduce", "completed");
      op.age_s = op.deadline_s = -1;
      op.stream = "0x7f00";
      op.bytes = 4096;
      op.count = 1024;
      op.dtype = "float32";
      const int64_t true_done = 10000000000LL + 1000000LL * k + static_cast<int64_t>(rng() % 60000) - 30000;
      op.enqueue_ns = true_done - 400000 + clock;
      op.gpu_reached_ns = true_done - 300000 + clock;
      op.completed_ns = true_done + clock;
      d.detail.ring.entries.push_back(op);
    }
    out.push_back(std::move(d));
  }
  return out;
}

analysis::DumpSet Load(const TempDir& dir, const std::vector<Document>& dumps) {
  for (const auto& d : dumps) dir.Write(DumpFileName(d), Text(d));
  analysis::DumpSet set;
  std::string error;
  REQUIRE(set.Load(dir.path(), {}, &error));
  REQUIRE(set.dumps().size() == dumps.size());
  return set;
}

}  // namespace

TEST_CASE("clock offsets between hosts come back from shared collectives within 50 us", "[timeline]") {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    // host1's clock is 123.456789012 s ahead of host0's, host2's 987 ms behind.
    const std::vector<int64_t> clock = {1000, 123456789012LL + 1000, 1000 - 987000000LL};
    TempDir dir;
    auto set = Load(dir, Job({0, 0, 1, 1, 2, 2, 2, 2}, clock, 200, seed));
    auto clocks = AlignClocks(CollectRankTimes(set));
    INFO("seed " << seed);
    CHECK(clocks.reference_host == "host0");
    for (int h = 1; h <= 2; ++h) {
      const auto& c = clocks.hosts.at("host" + std::to_string(h));
      CHECK(c.method == "collectives");
      CHECK(c.samples >= 200);
      CHECK(std::llabs(c.offset_ns - (clock[0] - clock[h])) < 50000);
      CHECK(c.spread_ns > 0);
      CHECK(c.spread_ns < 120000);
    }
  }
}

TEST_CASE("a host sharing no collective is placed by the wall clock and says so", "[timeline]") {
  TempDir dir;
  auto dumps = Job({0, 0, 1, 1}, {1000, 5000000000LL}, 50, 3);
  for (auto& d : dumps)
    if (d.summary.host == "host1")
      for (auto& op : d.detail.ring.entries) op.comm = "00000000000beef0";  // another communicator
  auto set = Load(dir, dumps);
  auto clocks = AlignClocks(CollectRankTimes(set));
  const auto& c = clocks.hosts.at("host1");
  CHECK(c.method == "wall_clock");
  CHECK(std::llabs(c.offset_ns - (1000 - 5000000000LL)) < 3000000);  // the wall clocks are ms apart
}

TEST_CASE("the timeline is a Chrome trace-event file: processes, tracks, slices, marks and aligned times", "[timeline]") {
  const std::vector<int64_t> clock = {1000, 77777777777LL};
  TempDir dir;
  auto dumps = Job({0, 0, 1, 1}, clock, 40, 9);
  dumps[3].detail.ring.entries.back().completed_ns = 0;  // still running at the dump
  dumps[3].detail.ring.entries.back().state = trace::OpStateValue::Of(trace::OpState::GpuReached);
  trace::Op send = Op("00000000000c0ffe", 0, "Send", "gpu_reached");  // rank 1 reports a stalled send
  send.p2p_seq = 3;
  send.peer = 0;
  dumps[1].summary.stalled = send;
  auto set = Load(dir, dumps);
  auto times = CollectRankTimes(set);
  auto clocks = AlignClocks(times);
  std::string text;
  auto stats = analysis::WriteTimeline(set, times, clocks, [&](const std::string& s) { text += s; });
  auto t = nlohmann::json::parse(text);  // valid JSON, whole
  REQUIRE(t["traceEvents"].is_array());
  CHECK(t["displayTimeUnit"] == "ms");
  CHECK(t["otherData"]["clock_reference_host"] == "host0");
  CHECK(t["otherData"]["clock_offsets"]["host1"]["method"] == "collectives");
  CHECK(stats.ranks == 4);
  CHECK(stats.events == t["traceEvents"].size());
  std::map<int, std::string> process_names;
  std::set<std::pair<int, int>> named_tracks;
  std::map<int64_t, std::vector<double>> start_by_seq;
  size_t slices = 0, reached = 0, dumps_marked = 0;
  std::vector<std::string> stall_marks;
  for (const auto& e : t["traceEvents"]) {
    // Every event has the keys the format requires for its phase.
    REQUIRE(e["ph"].is_string());
    REQUIRE(e["pid"].is_number_integer());
    REQUIRE(e["tid"].is_number_integer());
    REQUIRE(e["name"].is_string());
    const std::string ph = e["ph"];
    if (ph == "M") {
      if (e["name"] == "process_name") process_names[e["pid"].get<int>()] = e["args"]["name"];
      if (e["name"] == "thread_name") named_tracks.insert({e["pid"].get<int>(), e["tid"].get<int>()});
      continue;
    }
    REQUIRE(e["ts"].is_number());
    CHECK(e["ts"].get<double>() >= 0);
    if (ph == "X") {
      ++slices;
      REQUIRE(e["dur"].is_number());
      CHECK(e["dur"].get<double>() >= 0);
      CHECK(named_tracks.count({e["pid"].get<int>(), e["tid"].get<int>()}) == 1);  // every slice is on a named track
      for (const char* k : {"seq", "op", "bytes", "dtype", "comm"}) CHECK(e["args"].contains(k));
      start_by_seq[e["args"]["seq"].get<int64_t>()].push_back(e["ts"].get<double>());
    } else {
      REQUIRE(ph == "i");
      CHECK((e["s"] == "t" || e["s"] == "p"));
      if (e["name"] == "gpu_reached") ++reached;
      if (e["name"].get<std::string>().rfind("dump: ", 0) == 0) ++dumps_marked;
      if (e["name"].get<std::string>().rfind("stall: ", 0) == 0) stall_marks.push_back(e["name"]);
    }
  }
  CHECK(process_names.size() == 4);
  CHECK(process_names[2].rfind("rank 2 (host1", 0) == 0);
  CHECK(slices == 4 * 40);
  CHECK(reached == 4 * 40);
  CHECK(dumps_marked == 4);
  CHECK(stall_marks == std::vector<std::string>{"stall: Send #3 with peer 0"});
  // Despite a 77 s difference between the hosts' clocks, each collective starts at nearly the
  // same moment on every rank (within the +-30 us jitter and the estimate's error).
  for (const auto& [seq, starts] : start_by_seq) {
    INFO("seq " << seq);
    CHECK(starts.size() == 4);
    CHECK(*std::max_element(starts.begin(), starts.end()) - *std::min_element(starts.begin(), starts.end()) < 150);
  }
}

TEST_CASE("ncclwatch timeline writes the file, says where, and refuses bad usage", "[timeline]") {
  TempDir dir;
  for (const auto& d : Job({0, 1}, {0, 3000000000LL}, 20, 4)) dir.Write(DumpFileName(d), Text(d));
  std::string out = dir.path() + "/trace.json";
  auto r = RunCommand("timeline " + dir.path() + " -o " + out);
  CHECK(r.status == 0);
  CHECK(r.out.find("wrote " + out) != std::string::npos);
  CHECK(r.out.find("ui.perfetto.dev") != std::string::npos);
  CHECK(r.out.find("clock of host1") != std::string::npos);
  CHECK(nlohmann::json::parse(ReadFile(out))["traceEvents"].size() > 40);
  CHECK(RunCommand("timeline").status == 2);
  CHECK(RunCommand("timeline " + dir.path() + " --bogus").status == 2);
  CHECK(RunCommand("timeline /nonexistent/ncclwatch-dir -o " + out + ".2").status == 2);
  CHECK(RunCommand("timeline " + dir.path() + " -o /proc/ncclwatch-cannot/trace.json").status == 2);
}

TEST_CASE("timeline prints host names from the dumps escaped", "[timeline]") {
  TempDir dir;
  auto dumps = Job({0, 1}, {0, 3000000000LL}, 20, 4);
  for (auto& d : dumps)
    if (d.summary.host == "host1") d.summary.host = "evil\x1b]0;title\x07\x1b[2J";
  for (const auto& d : dumps) dir.Write(DumpFileName(d), Text(d));
  auto r = RunCommand("timeline " + dir.path() + " -o -");  // the trace on stdout, what it says on stderr
  CHECK(r.status == 0);
  INFO(r.err);
  CHECK(r.err.find('\x1b') == std::string::npos);
  CHECK(r.err.find("clock of evil\\x1b]0;title\\x07\\x1b[2J") != std::string::npos);
}

TEST_CASE("slices on a track never overlap when the host runs ahead of the GPU, and operations with no known end are marks",
          "[timeline]") {
  // One rank enqueues 40 all-reduces 1 ms apart, alternating two communicators on one stream;
  // each completes 30 ms after its enqueue and the watchdog sees completions every 100 ms: the
  // host runs up to ~13 operations ahead of what is seen done. Then, on a second stream, one
  // captured into a CUDA graph and one not followed on the GPU; the last of the first stream is
  // still running at the dump.
  TempDir dir;
  Document d = Dump(0, 1, {Comm("00000000000000aa", 1, 0, 40, 40, 40), Comm("00000000000000bb", 1, 0, 40, 40, 40)}, {},
                    "on_demand");
  const int64_t t0 = 5000000000LL;
  d.summary.time_mono_ns = t0 + 2000000000LL;
  auto add = [&](const char* comm, int64_t seq, const char* state, const char* stream, int64_t enqueue_ns,
                 int64_t completed_ns) {
    trace::Op op = Op(comm, seq, "AllReduce", state);
    op.age_s = op.deadline_s = -1;
    op.stream = stream;
    op.bytes = 4096;
    op.count = 1024;
    op.dtype = "float32";
    op.enqueue_ns = enqueue_ns;
    op.completed_ns = completed_ns;
    d.detail.ring.entries.push_back(op);
  };
  for (int k = 0; k < 40; ++k) {
    const int64_t enqueue = t0 + 1000000LL * k;
    const int64_t seen = ((enqueue + 30000000LL) / 100000000LL + 1) * 100000000LL;
    add(k % 2 ? "00000000000000bb" : "00000000000000aa", k / 2 + 1, k == 39 ? "gpu_reached" : "completed", "0x1",
        enqueue, k == 39 ? 0 : seen);
  }
  add("00000000000000aa", 21, "captured", "0x2", t0 + 50000000LL, 0);
  add("00000000000000aa", 22, "unmonitored", "0x2", t0 + 51000000LL, 0);
  d.detail.ring.recorded = d.detail.ring.entries.size();
  auto set = Load(dir, {d});
  auto times = CollectRankTimes(set);
  auto clocks = AlignClocks(times);
  std::string text;
  analysis::WriteTimeline(set, times, clocks, [&](const std::string& s) { text += s; });
  auto t = nlohmann::json::parse(text);

  std::map<int, std::vector<std::pair<double, double>>> slices_by_track;
  std::vector<std::string> marked_states;
  size_t queued = 0, running = 0;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "X") {
      slices_by_track[e["tid"].get<int>()].push_back({e["ts"].get<double>(), e["dur"].get<double>()});
      if (e["args"].contains("queued_ms")) {
        ++queued;
        CHECK(e["args"]["queued_ms"].get<double>() > 0);
      }
      if (e["args"].contains("until")) ++running;
    } else if (e["ph"] == "i" && e["name"] == "AllReduce") {
      marked_states.push_back(e["args"]["state"]);
    }
  }
  size_t slices = 0;
  for (auto& [tid, s] : slices_by_track) {
    std::sort(s.begin(), s.end());
    slices += s.size();
    for (size_t i = 1; i < s.size(); ++i) {
      INFO("track " << tid << ": slice at " << s[i].first << " us starts before the one at " << s[i - 1].first
                    << " us (" << s[i - 1].second << " us long) ends");
      CHECK(s[i].first >= s[i - 1].first + s[i - 1].second - 0.001);
    }
  }
  CHECK(slices_by_track.size() == 2);  // two communicators on stream 0x1
  CHECK(slices == 40);
  CHECK(running == 1);
  CHECK(queued > 20);  // most waited behind earlier work on their stream
  std::sort(marked_states.begin(), marked_states.end());
  CHECK(marked_states == std::vector<std::string>{"captured", "unmonitored"});
}

TEST_CASE("the timeline and slow ranks use every dump of a process, not its latest alone", "[timeline]") {
  // A mid-run snapshot holds 100 collectives; the exit record written later keeps the last 20
  // (96..115). The timeline has all 115 of each rank, once each; the slow-rank pass sees them too.
  const std::vector<int64_t> clock = {1000};
  TempDir dir;
  auto full = Job({0, 0}, clock, 115, 3);
  std::vector<Document> dumps;
  for (auto& d : full) {
    Document snapshot = d, exit = d;
    snapshot.detail.ring.entries.resize(100);
    snapshot.summary.comms[0].last_enqueued = snapshot.summary.comms[0].last_completed = 100;
    snapshot.summary.time_mono_ns -= 20000000;
    snapshot.summary.time_unix_ns -= 20000000;
    exit.summary.reason = trace::DumpReasonValue::Of(trace::DumpReason::Exit);
    exit.summary.exit_status = 0;
    exit.summary.dump_seq = 1;
    exit.detail.ring.entries.erase(exit.detail.ring.entries.begin(), exit.detail.ring.entries.begin() + 95);
    dumps.push_back(snapshot);
    dumps.push_back(exit);
  }
  for (const auto& d : dumps) dir.Write(DumpFileName(d), Text(d));
  analysis::DumpSet set;
  std::string error;
  REQUIRE(set.Load(dir.path(), {}, &error));
  REQUIRE(set.dumps().size() == 2);
  auto times = CollectRankTimes(set);
  REQUIRE(times.size() == 2);
  CHECK(times[0].collectives.size() == 115);
  std::string text;
  analysis::WriteTimeline(set, times, AlignClocks(times), [&](const std::string& s) { text += s; });
  auto t = nlohmann::json::parse(text);
  std::map<int, std::set<int64_t>> seqs;
  size_t slices = 0;
  for (const auto& e : t["traceEvents"])
    if (e["ph"] == "X") {
      ++slices;
      seqs[e["pid"].get<int>()].insert(e["args"]["seq"].get<int64_t>());
    }
  CHECK(slices == 2 * 115);
  REQUIRE(seqs.size() == 2);
  for (const auto& [pid, s] : seqs) {
    CHECK(s.size() == 115);
    CHECK(*s.begin() == 1);
    CHECK(*s.rbegin() == 115);
  }
}
