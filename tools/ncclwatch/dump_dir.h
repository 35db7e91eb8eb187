// A directory of dumps as the commands read it: the same lines, said the same way, by every
// command that reads one.
#pragma once

#include <cstdio>
#include <set>
#include <string>

#include "model/dump_set.h"

namespace ncclwatch {
namespace cli {

// The names of the dump files in `dir` (none when it does not exist yet).
std::set<std::string> DumpFiles(const std::string& dir);

// Loads `dir` into *set for subcommand `sub` (`progress`: a count on a terminal for big sets).
// Returns kExitOk, or kExitBadInput after saying in one line why there is nothing to read (a
// file given for the directory, a directory that cannot be listed, no readable dump: then the
// unreadable files first, one line each).
int ReadDumpDir(const char* sub, const std::string& dir, analysis::LoadOptions load, analysis::DumpSet* set,
                bool progress = false);

// The files the set could not use as they are, one line each on stderr: after the analysis,
// which may find more as it reads full dumps.
void SayProblems(const analysis::DumpSet& set);

}  // namespace cli
}  // namespace ncclwatch
