// ncclwatch-gen: writes synthetic dump sets in the documented format, for any number of ranks
// and every hang scenario, to test and time `ncclwatch analyze`.
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dump_renderer.h"
#include "format/json_writer.h"
#include "scenario.h"

namespace ncclwatch {
namespace gen {
namespace {

struct Args {
  int ranks = 0;
  std::string scenario;
  std::string out;
  int ring = 4096;
  uint64_t seed = 1;
  int tp = -1;       // -1: 8 for 16+ ranks, 4 for 8+, else none
  int culprit = -1;  // -1: per scenario
  bool fatal = false;
  std::set<int> drop, duplicate, truncate;
  bool bad_files = false;
  bool lean = false;
  unsigned threads = 0;
};

void Usage(std::FILE* out) {
  std::fprintf(out,
               "usage: ncclwatch-gen --ranks N --scenario NAME --out DIR [options]\n\n"
               "Writes one synthetic dump per rank in the ncclwatch trace format.\n"
               "scenarios:");
  for (const auto& n : ScenarioNames()) std::fprintf(out, " %s", n.c_str());
  std::fprintf(out,
               "\n\noptions:\n"
               "  --ring N        ring capacity, full in every dump (default 4096)\n"
               "  --seed S        jitter of dump times and clocks (default 1)\n"
               "  --tp T          tensor-parallel group size, 1 for none (default 8 for 16+ ranks,\n"
               "                  4 for 8+, else 1); DP groups follow\n"
               "  --culprit R     the rank the scenario blames (default 0 for rank_missing, else 5/8 of N)\n"
               "  --fatal         rank_dead: the culprit writes a fatal_signal dump instead of none\n"
               "  --drop R        do not write rank R's dump (repeatable)\n"
               "  --duplicate R   also write an earlier dump (dump_seq 0) of rank R (repeatable)\n"
               "  --truncate R    cut rank R's file after its summary (repeatable)\n"
               "  --bad-files     add a foreign JSON file, an unknown version, an empty file and one\n"
               "                  cut inside its summary\n"
               "  --lean          only the main and ncclwatch threads' stacks (small test sets)\n"
               "  --threads N     writer threads (default: hardware concurrency)\n");
}

bool ParseInt(const char* s, long lo, long hi, long* out) {
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (!end || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool Parse(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string opt = argv[i];
    if (opt == "--help" || opt == "-h") {
      Usage(stdout);
      std::exit(0);
    }
    if (opt == "--fatal") {
      a->fatal = true;
      continue;
    }
    if (opt == "--lean") {
      a->lean = true;
      continue;
    }
    if (opt == "--bad-files") {
      a->bad_files = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "ncclwatch-gen: %s needs a value\n", opt.c_str());
      return false;
    }
    const char* v = argv[++i];
    long n = 0;
    bool ok = true;
    if (opt == "--scenario") a->scenario = v;
    else if (opt == "--out") a->out = v;
    else if (opt == "--ranks") ok = ParseInt(v, 1, 1 << 20, &n) && (a->ranks = static_cast<int>(n));
    else if (opt == "--ring") ok = ParseInt(v, 1, 1 << 24, &n) && (a->ring = static_cast<int>(n), true);
    else if (opt == "--seed") ok = ParseInt(v, 0, 1L << 62, &n) && (a->seed = static_cast<uint64_t>(n), true);
    else if (opt == "--tp") ok = ParseInt(v, 1, 1 << 20, &n) && (a->tp = static_cast<int>(n));
    else if (opt == "--culprit") ok = ParseInt(v, 0, 1 << 20, &n) && (a->culprit = static_cast<int>(n), true);
    else if (opt == "--threads") ok = ParseInt(v, 1, 1024, &n) && (a->threads = static_cast<unsigned>(n));
    else if (opt == "--drop") ok = ParseInt(v, 0, 1 << 20, &n) && a->drop.insert(static_cast<int>(n)).second;
    else if (opt == "--duplicate") ok = ParseInt(v, 0, 1 << 20, &n) && a->duplicate.insert(static_cast<int>(n)).second;
    else if (opt == "--truncate") ok = ParseInt(v, 0, 1 << 20, &n) && a->truncate.insert(static_cast<int>(n)).second;
    else {
      std::fprintf(stderr, "ncclwatch-gen: unknown option %s\n", opt.c_str());
      return false;
    }
    if (!ok) {
      std::fprintf(stderr, "ncclwatch-gen: bad value for %s: %s\n", opt.c_str(), v);
      return false;
    }
  }
  if (a->ranks <= 0 || a->scenario.empty() || a->out.empty()) {
    Usage(stderr);
    return false;
  }
  return true;
}

bool WriteSmallFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  return static_cast<bool>(f);
}

// What a correct analysis says (scenario.h), for tests that check verdicts against the scenario
// rather than against earlier output. Not a dump: readers skip it by its name.
constexpr const char* kTruthFile = "scenario-truth.json";

std::string TruthJson(const std::string& scenario, const Topology& topo, int ring, uint64_t seed,
                      const std::vector<int>& callsites, const std::vector<ExpectedVerdict>& truth) {
  DumpRenderer renderer(topo, ring, seed, callsites, true);
  std::string out;
  trace::JsonWriter w(&out);
  w.BeginObject();
  w.Field("scenario", scenario);
  w.Field("ranks", topo.ranks);
  w.Key("verdicts").BeginArray();
  for (const auto& v : truth) {
    w.BeginObject();
    w.Field(analysis::report_key::kCause, analysis::CauseName(v.cause));
    w.Key(analysis::report_key::kCulpritRanks).BeginArray();
    for (int r : v.culprits) w.Int(r);
    w.EndArray();
    // Sequence numbers the verdict may name: the next operation after the common history.
    w.Key("seqs").BeginArray();
    for (CommKind k : v.comms) w.Int(v.p2p ? 1 : renderer.base_seq(k) + 1);
    w.EndArray();
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  return out + "\n";
}

int Main(int argc, char** argv) {
  Args a;
  if (!Parse(argc, argv, &a)) return 2;
  Topology topo;
  topo.ranks = a.ranks;
  topo.tp = a.tp > 0 ? a.tp : a.ranks >= 16 && a.ranks % 8 == 0 ? 8 : a.ranks >= 8 && a.ranks % 4 == 0 ? 4 : 1;
  if (a.tp > 1 && !topo.HasSubComms()) {
    std::fprintf(stderr, "ncclwatch-gen: --tp %d must divide --ranks %d and be smaller\n", a.tp, a.ranks);
    return 2;
  }
  int culprit = a.culprit >= 0 ? a.culprit
                : a.scenario == analysis::CauseName(analysis::Cause::RankMissing) ? 0
                                                                            : (a.ranks * 5 / 8) % a.ranks;
  std::vector<RankPlan> plans;
  std::vector<ExpectedVerdict> truth;
  std::string error;
  if (!BuildScenario(a.scenario, topo, culprit, a.fatal, &plans, &truth, &error)) {
    std::fprintf(stderr, "ncclwatch-gen: %s\n", error.c_str());
    return 2;
  }
  for (int r : a.drop)
    if (r < a.ranks) plans[r].write = false;
  int origin = -1;
  for (int r = 0; r < a.ranks && origin < 0; ++r)
    if (plans[r].first_to_stall) origin = r;
  ::mkdir(a.out.c_str(), 0755);
  std::vector<int> callsites;  // in first-use order: the history's, then the scenario's
  for (const auto& op : StepOperations(topo)) callsites.push_back(op.callsite);
  for (const auto& p : plans)
    for (const auto& e : p.extras) callsites.push_back(e.op.callsite);

  auto start = std::chrono::steady_clock::now();
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> bytes{0};
  auto worker = [&] {
    DumpRenderer renderer(topo, a.ring, a.seed, callsites, a.lean);
    std::string err;
    for (int r; !failed && (r = next.fetch_add(1)) < a.ranks;) {
      if (!plans[r].write) continue;
      DumpOptions opt;
      opt.origin_rank = origin;
      if (a.duplicate.count(r)) {
        DumpOptions early = opt;
        early.earlier = true;
        if (renderer.Write(a.out, r, plans[r], early, &err).empty()) failed = true;
        opt.dump_seq = 1;
      }
      std::string name = renderer.Write(a.out, r, plans[r], opt, &err);
      if (name.empty()) {
        std::fprintf(stderr, "ncclwatch-gen: %s\n", err.c_str());
        failed = true;
        continue;
      }
      std::string path = a.out + "/" + name;
      struct stat st {};
      if (::stat(path.c_str(), &st) == 0) {
        if (a.truncate.count(r)) {
          // Cut inside the detail (ring, stacks): the summary stays readable.
          off_t cut = std::max<off_t>(static_cast<off_t>(renderer.last_summary_end()) + 64, st.st_size * 6 / 10);
          if (::truncate(path.c_str(), std::min(cut, st.st_size - 1)) != 0) failed = true;
        }
        bytes += static_cast<uint64_t>(st.st_size);
      }
    }
  };
  unsigned n = a.threads ? a.threads : std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < n; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (failed) return 1;
  if (!WriteSmallFile(a.out + "/" + kTruthFile, TruthJson(a.scenario, topo, a.ring, a.seed, callsites, truth)))
    return 1;

  if (a.bad_files) {
    std::string fmt = std::string("{\"") + trace::key::kFormat + "\":\"" + trace::kFormatName + "\",\"" +
                      trace::key::kVersion + "\":99,\"" + trace::key::kSummary + "\":{}}";
    std::string cut = std::string("{\"") + trace::key::kFormat + "\":\"" + trace::kFormatName + "\",\"" +
                      trace::key::kVersion + "\":1,\"" + trace::key::kSummary + "\":{\"" + trace::key::kRank +
                      "\":9,\"" + trace::key::kComms + "\":[{\"" + trace::key::kId + "\":\"";
    bool ok = WriteSmallFile(a.out + "/rankx-foreign-1-0-stall.json", "{\"hello\": \"world\"}\n") &&
              WriteSmallFile(a.out + "/rankx-cut-1-0-stall.json", cut) &&
              WriteSmallFile(a.out + "/rankx-future-1-0-stall.json", fmt) &&
              WriteSmallFile(a.out + "/rankx-empty-1-0-stall.json", "");
    if (!ok) return 1;
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("ncclwatch-gen: %s, %d ranks (tp %d), ring %d: %.1f MB in %s, %.1f s\n", a.scenario.c_str(),
              a.ranks, topo.HasSubComms() ? topo.tp : 1, a.ring, static_cast<double>(bytes) / 1e6,
              a.out.c_str(), secs);
  return 0;
}

}  // namespace
}  // namespace gen
}  // namespace ncclwatch

int main(int argc, char** argv) { return ncclwatch::gen::Main(argc, argv); }
