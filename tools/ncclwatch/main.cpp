// `ncclwatch`: reads the dumps that libncclwatch.so writes. A table of subcommands; each is
// one entry here and one cmd_<name>.cpp.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "format/display.h"
#include "ncclwatch/trace_format.h"
#include "ncclwatch/version.h"
#include "subcommand.h"

namespace ncclwatch {
namespace cli {

extern const Subcommand kAnalyzeCommand;
extern const Subcommand kShowCommand;
extern const Subcommand kRunCommand;
extern const Subcommand kDumpCommand;
extern const Subcommand kTimelineCommand;

namespace {

const Subcommand* const kSubcommands[] = {
    &kAnalyzeCommand,
    &kShowCommand,
    &kRunCommand,
    &kDumpCommand,
    &kTimelineCommand,
};

void Overview(std::FILE* out) {
  std::fprintf(out,
               "usage: ncclwatch SUBCOMMAND [ARGS]\n\n"
               "Reads the per-rank dumps libncclwatch.so writes and names the rank, the collective\n"
               "and the line of code behind a hang.\n\nsubcommands:\n");
  for (const Subcommand* s : kSubcommands) std::fprintf(out, "  %-10s %s\n", s->name, s->summary);
  std::fprintf(out,
               "  %-10s this text, or `ncclwatch help SUBCOMMAND`\n\n"
               "options: --help, --version\n"
               "Documentation: `ncclwatch help SUBCOMMAND`; the README (installed with the Python\n"
               "package as its description); in the source tree, docs/analysis.md (reports) and\n"
               "docs/trace-format.md (dumps).\n",
               "help");
}

const Subcommand* Find(const char* name) {
  for (const Subcommand* s : kSubcommands)
    if (std::strcmp(s->name, name) == 0) return s;
  return nullptr;
}

// Under a memory cap (ulimit -v) an allocation fails before any bound of the reader is reached,
// and unwinding needs memory too (freeing a large JSON value allocates): each failure gives back
// one slice of a reserve and throws, so that the file being read is given up in one line.
constexpr int kReserveSlices = 8;
void* g_reserve[kReserveSlices] = {};

void ReleaseReserveAndThrow() {
  for (void*& slice : g_reserve)
    if (slice) {
      std::free(slice);
      slice = nullptr;
      throw std::bad_alloc();
    }
  std::set_new_handler(nullptr);
  throw std::bad_alloc();
}

void KeepReserve() {
  for (void*& slice : g_reserve) slice = std::malloc(size_t{8} << 20);
  std::set_new_handler(ReleaseReserveAndThrow);
}

}  // namespace

int Main(int argc, char** argv) {
  KeepReserve();
  if (argc < 2) {
    Overview(stderr);
    return kExitBadInput;
  }
  const char* first = argv[1];
  if (std::strcmp(first, "--help") == 0 || std::strcmp(first, "-h") == 0) {
    Overview(stdout);
    return kExitOk;
  }
  if (std::strcmp(first, "--version") == 0) {
    std::printf("ncclwatch %s (trace format version %d)\n", kNcclwatchVersion, trace::kTraceVersion);
    return kExitOk;
  }
  if (std::strcmp(first, "help") == 0) {
    const Subcommand* s = argc > 2 ? Find(argv[2]) : nullptr;
    if (s) {
      s->help(stdout);
    } else if (argc > 2) {
      std::fprintf(stderr, "ncclwatch help: unknown subcommand '%s'\n\n", trace::Printable(argv[2]).c_str());
      Overview(stderr);
      return kExitBadInput;
    } else {
      Overview(stdout);
    }
    return kExitOk;
  }
  const Subcommand* s = Find(first);
  if (!s) {
    std::fprintf(stderr, "ncclwatch: unknown subcommand '%s'\n\n", first);
    Overview(stderr);
    return kExitBadInput;
  }
  // Each file is given up when memory runs out reading it; this is the last resort for what
  // is built from all of them: one line and an exit status, never an abort.
  try {
    return s->run(argc - 1, argv + 1);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "ncclwatch %s: out of memory\n", first);
    return kExitBadInput;
  }
}

}  // namespace cli
}  // namespace ncclwatch

int main(int argc, char** argv) { return ncclwatch::cli::Main(argc, argv); }
