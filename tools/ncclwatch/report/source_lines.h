// Source lines of the native frames a report (or a dump shown) will print: found by the
// symbolization pass before rendering (debuginfo/symbolize_debug.h reads debug info), looked up
// by the renderers, which never read a file themselves.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>

#include "format/records.h"

namespace ncclwatch {
namespace analysis {

struct SourceLine {
  std::string file;      // as the debug info names it
  int line = 0;
  std::string function;  // from the debug info's symbol table, only when the frame has no symbol
};

class SourceLines {
 public:
  // Null where the pass found nothing (or never saw the frame).
  const SourceLine* Of(const trace::NativeFrame& f) const {
    auto it = lines_.find(Key(f));
    return it == lines_.end() || !it->second ? nullptr : &*it->second;
  }
  bool Seen(const trace::NativeFrame& f) const { return lines_.count(Key(f)) > 0; }
  void Set(const trace::NativeFrame& f, std::optional<SourceLine> line) { lines_[Key(f)] = std::move(line); }

 private:
  // module, build id, offset, and whether the offset is an interrupted instruction's own
  using FrameKey = std::tuple<std::string, std::string, uint64_t, bool>;
  static FrameKey Key(const trace::NativeFrame& f) { return {f.module, f.build_id, f.module_offset, f.interrupted}; }
  std::map<FrameKey, std::optional<SourceLine>> lines_;  // nullopt: looked up, nothing found
};

}  // namespace analysis
}  // namespace ncclwatch
