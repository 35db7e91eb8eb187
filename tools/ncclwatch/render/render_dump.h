// Rendering one rank's dump (`ncclwatch show`): readable tables, or the dump's own JSON with
// the ring cut to its last entries.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "format/dump_reader.h"
#include "model/dump.h"
#include "report/source_lines.h"
#include "render/style.h"

namespace ncclwatch {
namespace analysis {

struct ShowOptions {
  Style style;
  size_t ring_entries = 20;  // last N ring entries
  SourceLines source_lines;  // the symbolization pass's (SymbolizeDump), for native frames
};

std::string RenderDumpText(const Dump& dump, const ShowOptions& options);
// The parsed document with ring.entries cut to the last N; keys as the writer wrote them.
nlohmann::json DumpToJson(const trace::DumpDocument& doc, const std::string& file, const ShowOptions& options);

}  // namespace analysis
}  // namespace ncclwatch
