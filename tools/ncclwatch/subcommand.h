// One `ncclwatch` subcommand. Each lives in its own cmd_<name>.cpp and is listed once in the
// table in main.cpp; main only dispatches. What subcommands share: command_line.h (arguments),
// dump_dir.h (reading a dump directory), left_boxes.h (what dead processes left on this host).
#pragma once

#include <cstdio>
#include <string>

#include "command_line.h"

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

}  // namespace cli
}  // namespace ncclwatch
