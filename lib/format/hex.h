// Hexadecimal text, one way for every writer and reader of it: bytes as lowercase digit pairs
// (build ids, as .build-id paths spell them) and numbers as 0x... (addresses, offsets, handles).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

namespace ncclwatch {
namespace trace {

inline std::string HexBytes(const unsigned char* bytes, size_t size) {
  static const char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(size * 2);
  for (size_t i = 0; i < size; ++i) {
    out += kDigits[bytes[i] >> 4];
    out += kDigits[bytes[i] & 15];
  }
  return out;
}

inline std::string HexNumber(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

}  // namespace trace
}  // namespace ncclwatch
