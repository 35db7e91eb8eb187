// `ncclwatch analyze DIR`: cross-rank attribution of a hang from a directory of dumps.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "rules/attribution.h"
#include "model/dump_set.h"
#include "render/render_report.h"
#include "debuginfo/symbolize_debug.h"
#include "render/text_format.h"
#include "subcommand.h"

namespace ncclwatch {
namespace cli {

namespace {

using namespace analysis;

// Progress is worth a line only for big sets, and only where a person watches.
constexpr size_t kProgressMinFiles = 1000;

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
               "  --no-slow-ranks  never\n\n"
               "Unreadable files are reported on stderr, one line each, and skipped.\n"
               "exit status: 0 nothing hangs, 1 a hang was attributed, 2 no readable dump or\n"
               "bad usage.\n");
}

long PeakRssKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6));
  return -1;
}

int Run(int argc, char** argv) {
  const char* dir = nullptr;
  bool json_out = false, no_color = false, verbose = false;
  int attempt = 0;
  AttributionOptions attribution;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--attempt") == 0) {
      if (int status = ParseAttemptOption("analyze", argc, argv, &i, &attempt)) return status;
    } else if (std::strcmp(argv[i], "--slow-ranks") == 0) attribution.slow_ranks = 1;
    else if (std::strcmp(argv[i], "--no-slow-ranks") == 0) attribution.slow_ranks = 0;
    else if (std::strcmp(argv[i], "--json") == 0) json_out = true;
    else if (std::strcmp(argv[i], "--no-color") == 0) no_color = true;
    else if (std::strcmp(argv[i], "--verbose") == 0 || std::strcmp(argv[i], "-v") == 0) verbose = true;
    else if (argv[i][0] == '-' && argv[i][1] != '\0') return UsageError("analyze", (std::string("unknown option ") + argv[i]).c_str());
    else if (!dir) dir = argv[i];
    else return UsageError("analyze", "more than one directory given");
  }
  if (!dir) return UsageError("analyze", "no directory given");

  auto start = std::chrono::steady_clock::now();
  // Ranks killed without a word whose job left nobody on this host to read their black boxes.
  ConvertLeftBlackBoxes();
  RemoveLeftTemporaries(dir);
  LoadOptions load;
  load.attempt = attempt;
  bool progress = ::isatty(STDERR_FILENO);
  if (progress)
    load.progress = [](size_t done, size_t total) {
      if (total > kProgressMinFiles) std::fprintf(stderr, "\rncclwatch: reading summaries %zu/%zu", done, total);
    };
  // One line with the path given and what to do: the common mistakes are a dump file for the
  // directory and a directory that is not the job's.
  struct stat st {};
  if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode)) {
    std::fprintf(stderr,
                 "ncclwatch: %s: a file, not a directory of dumps: `ncclwatch analyze DIR` takes the job's dump "
                 "directory; `ncclwatch show %s` prints this one dump\n",
                 Printable(dir).c_str(), Printable(dir).c_str());
    return kExitBadInput;
  }
  DumpSet set;
  std::string error;
  if (!set.Load(dir, load, &error)) {
    std::fprintf(stderr,
                 "ncclwatch: %s; give the job's dump directory (NCCLWATCH_DIR, or the ncclwatch-<job id> "
                 "directory `ncclwatch run` names)\n",
                 Printable(error).c_str());
    return kExitBadInput;
  }
  if (progress && set.files_seen() > kProgressMinFiles) std::fprintf(stderr, "\r\033[K");

  Report report;
  if (!set.dumps().empty()) report = Attribute(set, attribution);
  SymbolizeReport(&report);  // before rendering: renderers only look source lines up
  for (const auto& p : set.problems())
    std::fprintf(stderr, "%s\n", ProblemLine(p).c_str());
  if (set.dumps().empty()) {
    std::fprintf(stderr, "ncclwatch: %s: no readable dump (%zu rank*.json files)\n", dir, set.files_seen());
    return kExitBadInput;
  }

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
