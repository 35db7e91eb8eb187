// Source lines of native frames from debug info, for the analyzer only (elfutils' libdwfl;
// libncclwatch.so never links it): a dump records each frame's module, build id and module
// offset, and where that module's debug info is at hand here, a report can say file:line.
#pragma once

#include <optional>
#include <string>

#include "model/dump.h"
#include "report/report.h"
#include "report/source_lines.h"

namespace ncclwatch {
namespace analysis {


// Where `frame` is in its source, when the debug info of exactly its build is here: the module
// file at its recorded path (a regular file with the same build id, with DWARF of its own), or
// /usr/lib/debug/.build-id/xx/yyyy.debug for its build id. Nothing for a frame without a build
// id, a file of another build, or no line information: never a line of another build. Local
// files only (no debuginfod). Cached per module and address; thread-safe.
std::optional<SourceLine> SourceLineOf(const trace::NativeFrame& frame);

// The symbolization pass, before rendering: the source lines of every native frame a report
// prints (its culprits' stacks, its findings' call sites) into report->source_lines, and of
// every stack of one dump (`show`).
void SymbolizeReport(Report* report);
SourceLines SymbolizeDump(const Dump& dump);

// Where separate debug files are looked up by build id (tests point it elsewhere).
void SetDebugFileDirectory(const std::string& directory);

}  // namespace analysis
}  // namespace ncclwatch
