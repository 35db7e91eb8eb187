// `ncclwatch collect [DIR]`: what the host's caretaker does, where none was left to do it. The
// commands that read (analyze, show, timeline) never change what they read: this one says it does.
#include <sys/stat.h>

#include <cstdio>
#include <string>

#include "format/display.h"
#include "left_boxes.h"
#include "subcommand.h"

namespace ncclwatch {
namespace cli {

namespace {

void Help(std::FILE* out) {
  std::fprintf(out,
               "usage: ncclwatch collect [DIR]\n\n"
               "Turns the black boxes that this user's processes on this host left when they ended\n"
               "without a word (SIGKILL, the OOM killer) into postmortem dumps, each in its own job's\n"
               "dump directory, and removes them and what dead processes left beside them (relay\n"
               "files; with DIR, partial dump files in DIR). One line per box.\n\n"
               "While a process of a job with ncclwatch lives on the host, its caretaker does this\n"
               "within about a second, and `ncclwatch run` does it when its job ends. This is for the\n"
               "rest: every rank of a host killed at once (torchrun, srun). `analyze` and `timeline`\n"
               "read such boxes in memory (one line says so) and change nothing.\n\n"
               "Run it on the ranks' host, as their user, with NCCLWATCH_BLACKBOX_DIR and\n"
               "NCCLWATCH_RELAY_DIR as the job had them (default /dev/shm).\n\n"
               "exit status: 0 done, 2 DIR not a directory or bad usage.\n");
}

int Run(int argc, char** argv) {
  const ArgSpec spec = {"collect", Help, {}, "directory", /*operand_optional=*/true};
  const ParsedArgs args = ParseArgs(spec, argc, argv);
  if (args.exit_status >= 0) return args.exit_status;
  struct stat st {};
  if (!args.operand.empty() && (stat(args.operand.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))) {
    std::fprintf(stderr, "ncclwatch collect: %s: not a directory; give the job's dump directory\n",
                 trace::Printable(args.operand).c_str());
    return kExitBadInput;
  }
  const size_t boxes = ConvertLeftBlackBoxes();
  if (!args.operand.empty()) RemoveLeftTemporaries(args.operand);
  if (boxes == 0) std::fprintf(stderr, "ncclwatch collect: no black box of a process gone without a word on this host\n");
  return kExitOk;
}

}  // namespace

extern const Subcommand kCollectCommand = {"collect", "turn black boxes that dead ranks left on this host into dumps",
                                           Run, Help};

}  // namespace cli
}  // namespace ncclwatch
