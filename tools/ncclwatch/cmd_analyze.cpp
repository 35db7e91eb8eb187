// `ncclwatch analyze DIR`: cross-rank attribution of a hang from a directory of dumps.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "rules/attribution.h"
#include "model/dump_set.h"
#include "render/render_report.h"
#include "debuginfo/symbolize_debug.h"
#include "render/text_format.h"
#include "dump_dir.h"
#include "store_source.h"
#include "subcommand.h"

namespace ncclwatch {
namespace cli {

namespace {

using namespace analysis;

void Help(std::FILE* out) {
  std::fprintf(out,
               "usage: ncclwatch analyze DIR [--json] [--no-color] [--verbose] [--attempt N]\n"
               "                         [--slow-ranks | --no-slow-ranks]\n\n"
               "Reads every rank's dump in DIR (rank*.json) and names the rank, the collective\n"
               "and the code behind a hang: the most likely root cause first, communicators\n"
               "blocked only because of it as its consequences.\n\n"
               "  --json       print the report as JSON (schema: docs/analysis.md)\n"
               "  --no-color   no colour even on a terminal (NO_COLOR=1 does the same)\n"
               "  --verbose    full stacks; statistics (files, bytes read, time, peak RSS) on stderr\n"
               "  --attempt N  a directory reused by restarts holds several attempts of the job:\n"
               "               analyze attempt N (from 1, oldest first) instead of the latest\n"
               "  --slow-ranks  look for ranks that reach collectives last by a clear margin\n"
               "               (slow_rank, below the verdicts) whatever the number of ranks; by\n"
               "               default only up to 64 ranks (every full dump is read)\n"
               "  --no-slow-ranks  never\n"
               "  --store HOST:PORT  first fetch into DIR (made if missing) the dumps that\n"
               "               hosts without a shared dump directory published in the\n"
               "               launcher's store (NCCLWATCH_STORE); one line names the hosts\n"
               "               whose evidence it holds\n"
               "  --store-job ID  the job there: torchrun's --rdzv-id (default\n"
               "               TORCHELASTIC_RUN_ID, else none); its latest attempt is read\n\n"
               "Unreadable files are reported on stderr, one line each, and skipped. Nothing is\n"
               "changed: the black boxes of ranks killed without a word that no process of this\n"
               "host converted are read in memory (one line says which; `ncclwatch collect`\n"
               "writes them as dumps).\n"
               "exit status: 0 nothing hangs (also every rank killed at once from outside:\n"
               "job_killed), 1 a hang was attributed, 2 no readable dump or bad usage.\n");
}

long PeakRssKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

int Run(int argc, char** argv) {
  bool json_out = false, no_color = false, verbose = false;
  LoadOptions load;
  AttributionOptions attribution;
  StoreSource store;
  ArgSpec spec = {"analyze", Help,
                        {{"--json", nullptr, nullptr, SetTo(&json_out, true)},
                         {"--no-color", nullptr, nullptr, SetTo(&no_color, true)},
                         {"--verbose", "-v", nullptr, SetTo(&verbose, true)},
                         {"--attempt", nullptr, "a number from 1 (the oldest attempt)",
                          [&](const char* v) { return TakeAttempt(v, &load.attempt); }},
                         {"--slow-ranks", nullptr, nullptr, SetTo(&attribution.slow_ranks, 1)},
                         {"--no-slow-ranks", nullptr, nullptr, SetTo(&attribution.slow_ranks, 0)}},
                        "directory"};
  for (Option& o : StoreOptions(&store)) spec.options.push_back(std::move(o));
  const ParsedArgs args = ParseArgs(spec, argc, argv);
  if (args.exit_status >= 0) return args.exit_status;
  if (store.given()) GatherFromStore("analyze", store, args.operand, "", /*say=*/true);

  auto start = std::chrono::steady_clock::now();
  DumpSet set;
  if (int status = ReadDumpDir("analyze", args.operand, load, &set, /*progress=*/true)) return status;
  Report report = Attribute(set, attribution);
  SymbolizeReport(&report);  // before rendering: renderers only look source lines up
  SayProblems(set);

  if (json_out) {
    std::string text = ReportToJson(report).dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fputc('\n', stdout);
  } else {
    ReportTextOptions options;
    options.style = Style(Style::ColorWanted(no_color));
    options.verbose = verbose;
    std::string text = RenderReportText(report, options);
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
  std::fflush(stdout);

  if (verbose) {
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::fprintf(stderr,
                 "ncclwatch: %zu files, %zu selected dumps, %zu earlier dumps; read %llu bytes of "
                 "summaries + %llu bytes of %zu full dumps; %.2f s; peak RSS %ld KiB\n",
                 set.files_seen(), set.dumps().size(), set.history().size(),
                 static_cast<unsigned long long>(set.bytes_read()),
                 static_cast<unsigned long long>(set.detail_bytes_read()), set.details_read(), secs,
                 PeakRssKiB());
  }
  return report.Hang() ? kExitHang : kExitOk;
}

}  // namespace

extern const Subcommand kAnalyzeCommand = {"analyze", "attribute a hang from a directory of dumps", Run, Help};

}  // namespace cli
}  // namespace ncclwatch
