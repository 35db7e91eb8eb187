// `ncclwatch`: reads the dumps that libncclwatch.so writes. A table of subcommands; each is
// one entry here and one cmd_<name>.cpp.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include <unistd.h>

#include "blackbox/postmortem.h"
#include "common/process_info.h"
#include "dump/dump_files.h"
#include "format/display.h"
#include "model/dump_set.h"
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

}  // namespace

bool WantsHelp(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) return false;  // what follows belongs to a command
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) return true;
  }
  return false;
}

int UsageError(const char* sub, const char* message) {
  std::fprintf(stderr, "ncclwatch %s: %s\n(see `ncclwatch %s --help`)\n", sub, message, sub);
  return kExitBadInput;
}

void RemoveLeftTemporaries(const std::string& dir) {
  const char* host = std::getenv("NCCLWATCH_HOST");
  char name[256] = {0};
  if (!(host && *host) && gethostname(name, sizeof name - 1) == 0) host = name;
  if (!host || !*host) return;
  if (int n = RemoveStaleTemporaries(dir, host))
    std::fprintf(stderr, "ncclwatch: removed %d partial dump file(s) in %s that dead processes of this host left\n", n,
                 dir.c_str());
}

void ConvertLeftBlackBoxes(const std::string& job_instance) {
  auto setting = [](const char* name) {  // where the library keeps them: this user's own directory
    const char* v = std::getenv(name);
    const std::string dir(v && *v ? v : "/dev/shm");
    std::string why;
    const std::string mine = dir == "none" ? dir : UserPrivateDir(dir, &why);
    return mine.empty() ? std::string("none") : mine;
  };
  for (const auto& c : blackbox::ConvertDeadBoxes(setting("NCCLWATCH_BLACKBOX_DIR"), setting("NCCLWATCH_RELAY_DIR")).converted) {
    if (job_instance.empty() || analysis::OfJobInstance(c.job_instance, job_instance)) std::fprintf(stderr, "ncclwatch: %s\n", c.line.c_str());
  }
}

int ParseAttemptOption(const char* sub, int argc, char** argv, int* i, int* attempt) {
  char* end = nullptr;
  long n = *i + 1 < argc ? std::strtol(argv[*i + 1], &end, 10) : 0;
  if (*i + 1 >= argc || !end || *end || n < 1 || n > 1000000)
    return UsageError(sub, "--attempt needs a number from 1 (the oldest attempt)");
  *attempt = static_cast<int>(n);
  ++*i;
  return kExitOk;
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
  if (WantsHelp(argc - 1, argv + 1)) {
    s->help(stdout);
    return kExitOk;
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
