// `ncclwatch timeline DIR`: every rank's flight record on one clock, for Perfetto.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "model/clock_align.h"
#include "model/dump_set.h"
#include "render/text_format.h"
#include "render/render_report.h"
#include "render/timeline.h"
#include "dump_dir.h"
#include "subcommand.h"

namespace ncclwatch {
namespace cli {

namespace {

using namespace analysis;

constexpr const char* kDefaultOutput = "ncclwatch-timeline.json";

void Help(std::FILE* out) {
  std::fprintf(out,
               "usage: ncclwatch timeline DIR [-o FILE] [--attempt N]\n\n"
               "Writes every rank's recorded operations on one clock as a trace that Perfetto\n"
               "(https://ui.perfetto.dev, \"Open trace file\") and chrome://tracing open: one\n"
               "process per rank, one track per communicator and stream, a slice per operation\n"
               "from host enqueue to completion, GPU-reached marks, dump, stall and recovery\n"
               "instants. Hosts' clocks are aligned on the collectives they share (the median\n"
               "difference of completion times), else on the wall clock; the offsets, their\n"
               "spread and the method are in the file's \"otherData\".\n\n"
               "  -o FILE      where to write it (default ./%s; - for stdout)\n"
               "  --attempt N  a directory reused by restarts: attempt N (from 1, oldest first)\n"
               "               instead of the latest\n\n"
               "exit status: 0 written, 2 no readable dump, bad usage or unwritable FILE.\n",
               kDefaultOutput);
}

int Run(int argc, char** argv) {
  std::string output = kDefaultOutput;
  LoadOptions load;
  const ArgSpec spec = {"timeline", Help,
                        {{"--attempt", nullptr, "a number from 1 (the oldest attempt)",
                          [&](const char* v) { return TakeAttempt(v, &load.attempt); }},
                         {"--output", "-o", "a file name", [&](const char* v) { return output = v, std::string(); }}},
                        "directory"};
  const ParsedArgs args = ParseArgs(spec, argc, argv);
  if (args.exit_status >= 0) return args.exit_status;

  DumpSet set;
  if (int status = ReadDumpDir("timeline", args.operand, load, &set)) return status;
  std::FILE* out = stdout;
  std::string tmp;
  if (output != "-") {
    tmp = output + ".tmp";  // renamed when complete: a half-written trace never has the name
    out = std::fopen(tmp.c_str(), "w");
    if (!out) {
      std::fprintf(stderr, "ncclwatch timeline: cannot write %s: %s\n", tmp.c_str(), std::strerror(errno));
      return kExitBadInput;
    }
  }
  std::vector<RankTimes> times = CollectRankTimes(set);
  ClockAlignment clocks = AlignClocks(times);
  TimelineStats stats =
      WriteTimeline(set, times, clocks, [&](const std::string& piece) { std::fwrite(piece.data(), 1, piece.size(), out); });
  bool ok = !std::ferror(out);
  if (out != stdout) {
    ok = std::fclose(out) == 0 && ok;
    if (ok && std::rename(tmp.c_str(), output.c_str()) != 0) ok = false;
    if (!ok) {
      std::fprintf(stderr, "ncclwatch timeline: cannot write %s: %s\n", output.c_str(), std::strerror(errno));
      std::remove(tmp.c_str());
      return kExitBadInput;
    }
  } else {
    std::fflush(stdout);
  }
  SayProblems(set);
  std::FILE* say = out == stdout ? stderr : stdout;
  if (out != stdout)
    std::fprintf(say, "ncclwatch: wrote %s: %zu ranks, %zu events; open it in https://ui.perfetto.dev\n",
                 output.c_str(), stats.ranks, stats.events);
  for (const auto& [host_raw, c] : clocks.hosts) {
    if (c.method == "reference") continue;
    const std::string host = Printable(host_raw);  // host names come from the dumps
    if (c.method == "collectives")
      std::fprintf(say, "  clock of %s: %+.3f ms against %s, from %zu shared collectives (spread %.3f ms)\n",
                   host.c_str(), c.offset_ns / 1e6, Printable(c.via).c_str(), c.samples, c.spread_ns / 1e6);
    else
      std::fprintf(say, "  clock of %s: from the wall clock (too few shared collectives): %+.3f ms\n", host.c_str(),
                   c.offset_ns / 1e6);
  }
  return kExitOk;
}

}  // namespace

extern const Subcommand kTimelineCommand = {"timeline", "all ranks' operations on one clock, for Perfetto", Run,
                                            Help};

}  // namespace cli
}  // namespace ncclwatch
