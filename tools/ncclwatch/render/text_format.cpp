#include "render/text_format.h"

#include <ctime>

#include <algorithm>
#include <cstdio>
#include <optional>

#include "format/display.h"
#include "format/hex.h"

namespace ncclwatch {
namespace analysis {

std::string FormatRanks(std::vector<int> ranks, const char* noun) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out = noun;
  if (ranks.size() != 1) out += "s";
  out += " ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

std::string FormatWallClock(int64_t unix_ns) {
  const std::time_t t = static_cast<std::time_t>(unix_ns / 1000000000);
  std::tm tm{};
  char buf[64];
  if (unix_ns <= 0 || !gmtime_r(&t, &tm) || !std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S UTC", &tm)) return "?";
  return buf;
}

std::string FormatSeconds(double s) {
  char buf[64];
  if (s < 0) return "?";
  if (s < 1) std::snprintf(buf, sizeof buf, "%.0f ms", s * 1000);
  else if (s < 100) std::snprintf(buf, sizeof buf, "%.1f s", s);
  else std::snprintf(buf, sizeof buf, "%.0f s", s);
  return buf;
}

std::string FormatBytes(int64_t bytes) {
  return bytes < 0 ? "?" : trace::FormatBytes(static_cast<uint64_t>(bytes));
}

std::string FormatPythonFrame(const trace::PythonFrame& f) {
  // A frame read without being named (its code object was gone by then, or the GIL never came).
  if (f.function.empty() && f.file.empty()) return "(a Python frame not named: its code was gone when it was read)";
  return Printable((f.function.empty() ? "?" : f.function) + " (" + f.file + ":" + std::to_string(f.line) + ")");
}

std::string FormatNativeFrame(const trace::NativeFrame& f, const SourceLines& lines) {
  const SourceLine* source = lines.Of(f);  // where this build's debug info was found
  const size_t slash = f.module.rfind('/');
  const std::string module = slash == std::string::npos ? f.module : f.module.substr(slash + 1);
  std::string s;
  if (!f.symbol.empty() || (source && !source->function.empty())) {
    s = f.symbol.empty() ? source->function : f.symbol + "+" + trace::HexNumber(f.offset);
    if (!module.empty()) s += " (" + module + ")";
  } else if (!module.empty()) {  // no name rather than a wrong one: where in the module it is
    s = module + "+" + trace::HexNumber(f.module_offset != 0 ? f.module_offset : f.offset);
  } else {
    s = f.ip ? trace::HexNumber(f.ip) : "?";
  }
  if (source && !source->file.empty()) s += " at " + source->file + ":" + std::to_string(source->line);
  return Printable(s);
}

std::vector<std::string> FormatStack(const trace::Stack& s, const SourceLines& source_lines) {
  std::vector<std::string> lines;
  lines.reserve(s.python.size() + s.native.size());
  for (const auto& f : s.python) lines.push_back(FormatPythonFrame(f));
  for (const auto& f : s.native) lines.push_back(FormatNativeFrame(f, source_lines));
  return lines;
}

namespace {
// Frames shown per stack without --verbose: enough to see the user's code.
constexpr size_t kPythonFramesShown = 12;
constexpr size_t kNativeFramesShown = 8;
}  // namespace

void RenderStack(std::ostream& out, const Style& st, const trace::Stack& s, const SourceLines& lines,
                 const char* indent, bool all_frames) {
  size_t shown = 0;
  for (const auto& f : s.python) {
    if (!all_frames && shown == kPythonFramesShown) {
      out << indent << st.Dim("... " + std::to_string(s.python.size() - shown) + " more Python frames") << "\n";
      break;
    }
    std::string line = FormatPythonFrame(f);
    out << indent << (f.library ? st.Dim(line) : line) << "\n";
    ++shown;
  }
  shown = 0;
  for (const auto& f : s.native) {
    if (!all_frames && shown == kNativeFramesShown) {
      out << indent << st.Dim("... " + std::to_string(s.native.size() - shown) + " more native frames") << "\n";
      break;
    }
    out << indent << st.Dim(FormatNativeFrame(f, lines)) << "\n";
    ++shown;
  }
}

std::string CommLabel(const std::string& id, const std::string& name) {
  if (name.empty()) return id;
  return name + " (" + id.substr(0, 8) + "..)";
}

std::string OpLabel(const std::string& op, int64_t seq) {
  std::string name = op.empty() ? std::string("?") : op;
  return seq > 0 ? name + " #" + std::to_string(seq) : name;  // 0: a call with no sequence (creation)
}

}  // namespace analysis
}  // namespace ncclwatch
