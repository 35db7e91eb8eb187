// A symbol's name as dumps and black boxes carry it (a frame's `symbol`): C++ names demangled,
// any other name as it is. Header-only, beside hex.h: the library's symbolizer, the black box's
// ELF symbol reader and the command's debug-info pass all use this one copy.
#pragma once

#include <cxxabi.h>

#include <cstdlib>
#include <string>

namespace ncclwatch {
namespace trace {

inline std::string Demangle(const char* name) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || demangled == nullptr) return name;  // a C symbol, or not a mangled name
  std::string out(demangled);
  std::free(demangled);
  return out;
}

}  // namespace trace
}  // namespace ncclwatch
