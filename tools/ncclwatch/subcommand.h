// One `ncclwatch` subcommand. Each lives in its own cmd_<name>.cpp and is listed once in the
// table in main.cpp; main only dispatches.
#pragma once

#include <cstdio>
#include <string>

namespace ncclwatch {
namespace cli {

// Exit statuses shared by the subcommands (docs/analysis.md "Exit status").
constexpr int kExitOk = 0;          // nothing hangs / the command did its job
constexpr int kExitHang = 1;        // analyze: a hang was attributed
constexpr int kExitBadInput = 2;    // no readable dump, missing directory or file, bad usage

struct Subcommand {
  const char* name;
  const char* summary;                    // one line for `ncclwatch --help`
  int (*run)(int argc, char** argv);      // argv[0] is the subcommand's name
  void (*help)(std::FILE* out);           // `ncclwatch SUB --help`
};

// True when argv holds --help or -h before any "--".
bool WantsHelp(int argc, char** argv);
// Prints "ncclwatch SUB: MESSAGE" and a hint to stderr; returns kExitBadInput.
int UsageError(const char* sub, const char* message);
// `--attempt N` at argv[*i]: takes N (from 1, the oldest attempt) and moves *i past it. Returns
// kExitOk, or the usage error it printed.
int ParseAttemptOption(const char* sub, int argc, char** argv, int* i, int* attempt);
// Converts the black boxes that processes gone without a word left on this host (when no
// process of theirs was left to do it) into postmortem dumps in their dump directories, and
// removes what dead processes left there. One line on stderr per conversion. The directories
// are NCCLWATCH_BLACKBOX_DIR and NCCLWATCH_RELAY_DIR, as the library reads them. `job_instance`
// (not ""): the lines of other jobs' processes are not printed (they are converted all the same).
void ConvertLeftBlackBoxes(const std::string& job_instance = "");
// Removes the temporary files that dead processes of this host left in `dir` mid-dump (one line
// when there were any).
void RemoveLeftTemporaries(const std::string& dir);

}  // namespace cli
}  // namespace ncclwatch
