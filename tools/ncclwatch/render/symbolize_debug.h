// Source lines of native frames from debug info, for the analyzer only (elfutils' libdwfl;
// libncclwatch.so never links it): a dump records each frame's module, build id and module
// offset, and where that module's debug info is at hand here, a report can say file:line.
#pragma once

#include <optional>
#include <string>

#include "model/dump.h"

namespace ncclwatch {
namespace analysis {

struct SourceLine {
  std::string file;      // as the debug info names it
  int line = 0;
  std::string function;  // from the debug info's symbol table, only when the frame has no symbol
};

// Where `frame` is in its source, when the debug info of exactly its build is here: the module
// file at its recorded path (a regular file with the same build id, with DWARF of its own), or
// /usr/lib/debug/.build-id/xx/yyyy.debug for its build id. Nothing for a frame without a build
// id, a file of another build, or no line information: never a line of another build. Local
// files only (no debuginfod). Cached per module and address; thread-safe.
std::optional<SourceLine> SourceLineOf(const trace::NativeFrame& frame);

// Where separate debug files are looked up by build id (tests point it elsewhere).
void SetDebugFileDirectory(const std::string& directory);

}  // namespace analysis
}  // namespace ncclwatch
