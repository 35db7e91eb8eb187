// How people write the trace format's values: the library's messages and the command's
// reports print sizes and NCCL versions through these.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "ncclwatch/trace_format.h"

namespace ncclwatch {
namespace trace {

// summary.nccl_version (ncclGetVersion's code, major*10000 + minor*100 + patch since NCCL 2.9;
// major*1000 + minor*100 + patch before) as people write it: "2.28.0".
inline std::string NcclVersionText(int64_t code) {
  if (code <= 0) return "?";
  const bool old_scheme = code < 20900;
  const int64_t major = old_scheme ? code / 1000 : code / 10000;
  const int64_t minor = old_scheme ? code / 100 % 10 : code / 100 % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

// summary.stopped.how as the caretaker's line and the report say it.
inline std::string StopKindText(StopKind how) {
  switch (how) {
    case StopKind::Stopped: return "stopped (SIGSTOP or a debugger)";
    case StopKind::Traced: return "stopped by a debugger or tracer (ptrace)";
    case StopKind::Frozen: return "frozen (its cgroup's freezer)";
    case StopKind::Count: break;
  }
  return "stopped";
}

// "4.0 KiB", "1.5 GiB": sizes as every ncclwatch message and report prints them.
inline std::string FormatBytes(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[64];
  bool whole = u == 0 || v >= 100 || v == static_cast<double>(static_cast<uint64_t>(v));
  std::snprintf(buf, sizeof buf, whole ? "%.0f %s" : "%.1f %s", v, kUnits[u]);
  return buf;
}

// Control characters (escape sequences in a host name, a symbol, a file name, a setting's value)
// as \xNN: a message or report line stays one line and never drives the terminal.
inline std::string Printable(const std::string& s) {
  std::string out;
  for (char c : s) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", u);
      out += b;
    } else {
      out += c;
    }
  }
  return out;
}

// Printable, cut to about `max` bytes: a long value must not push what a line says about it
// out of the line.
inline std::string PrintableCut(const std::string& s, size_t max = 160) {
  if (s.size() <= max) return Printable(s);
  return Printable(s.substr(0, max / 2)) + "...(" + std::to_string(s.size()) + " bytes)..." +
         Printable(s.substr(s.size() - max / 2));
}

}  // namespace trace
}  // namespace ncclwatch
