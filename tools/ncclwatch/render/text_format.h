// Small formatting helpers shared by attribution (advice lines) and the renderers.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "format/display.h"
#include "model/dump.h"
#include "render/style.h"
#include "report/source_lines.h"

namespace ncclwatch {
namespace analysis {

// "rank 3", "ranks 1-7, 9" (sorted, consecutive runs collapsed).
std::string FormatRanks(std::vector<int> ranks, const char* noun = "rank");
// "612 s", "3.2 s", "45 ms"
std::string FormatSeconds(double s);
// A wall-clock time as "2026-11-27 23:41:07 UTC"; "?" unknown.
std::string FormatWallClock(int64_t unix_ns);
// "128 MiB", "4 KiB", "12 B"
std::string FormatBytes(int64_t bytes);
// "save_checkpoint (trainer.py:212)"; library frames are not marked here.
using trace::Printable;  // every string from a dump that reaches a terminal goes through it
std::string FormatPythonFrame(const trace::PythonFrame& f);
// "ncclAllReduce+0x1c (libnccl.so.2)"; "libc.so.6+0x8a3c4" (its module offset) when the symbol is
// unknown, the ip when the module is too; " at file:line" after it where this build's debug info
// was found by the symbolization pass (symbolize_debug.h), which also names a frame that has no
// symbol.
std::string FormatNativeFrame(const trace::NativeFrame& f, const SourceLines& lines);
// A stack as lines, Python frames first (innermost first within each), as the report prints it.
std::vector<std::string> FormatStack(const trace::Stack& s, const SourceLines& lines);
// A stack printed one frame a line after `indent`, Python frames first, library and native
// frames dimmed; without all_frames, the first few of each kind and a "... N more" line.
void RenderStack(std::ostream& out, const Style& st, const trace::Stack& s, const SourceLines& lines,
                 const char* indent, bool all_frames = true);
// "world (3f2a9c0d..)" or "3f2a9c0d1e2f3a4b" when the communicator has no name.
std::string CommLabel(const std::string& id, const std::string& name);
// "AllReduce #42" / "Send #3"
std::string OpLabel(const std::string& op, int64_t seq);

}  // namespace analysis
}  // namespace ncclwatch
