#include "format/json_writer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace ncclwatch {
namespace trace {

namespace {

// Length of the valid UTF-8 sequence starting at s[i], or 0 when it is not one.
size_t Utf8Length(std::string_view s, size_t i) {
  auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = b(i);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(i + k) & 0xc0) != 0x80) return 0;
  if (n == 2 && c < 0xc2) return 0;                                  // overlong
  if (n == 3) {
    unsigned char c1 = b(i + 1);
    if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 >= 0xa0)) return 0;  // overlong, surrogate
  }
  if (n == 4) {
    unsigned char c1 = b(i + 1);
    if ((c == 0xf0 && c1 < 0x90) || c > 0xf4 || (c == 0xf4 && c1 >= 0x90)) return 0;
  }
  return n;
}

}  // namespace

void AppendJsonString(std::string* out, std::string_view s) {
  std::string& o = *out;
  o += '"';
  size_t plain = 0;  // start of the run of bytes copied as they are
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
      ++i;
      continue;
    }
    size_t n = c >= 0x80 ? Utf8Length(s, i) : 0;
    if (n > 0) {
      i += n;
      continue;
    }
    o.append(s.data() + plain, i - plain);
    if (c == '"' || c == '\\') {
      o += '\\';
      o += static_cast<char>(c);
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o += "\xef\xbf\xbd";  // U+FFFD for a byte that is not UTF-8
    }
    plain = ++i;
  }
  o.append(s.data() + plain, s.size() - plain);
  o += '"';
}

JsonWriter& JsonWriter::Key(std::string_view k) {
  Separate();
  AppendJsonString(&out_, k);
  out_ += ':';
  after_key_ = true;
  return *this;
}

void JsonWriter::Separate() {
  if (after_key_) {  // the value of a key: no comma
    after_key_ = false;
    return;
  }
  if (depth_ > 0) {
    if (!first_[depth_]) out_ += ',';
    first_[depth_] = false;
  }
}

void JsonWriter::Open(char c) {
  Separate();
  out_ += c;
  if (depth_ < kMaxDepth) ++depth_;
  first_[depth_] = true;
}

void JsonWriter::Close(char c) {
  out_ += c;
  if (depth_ > 0) --depth_;
}

void JsonWriter::String(std::string_view s) {
  Separate();
  AppendJsonString(&out_, s);
}

void JsonWriter::Int(int64_t v) {
  Separate();
  char b[24];
  auto r = std::to_chars(b, b + sizeof b, v);
  out_.append(b, r.ptr);
}

void JsonWriter::Uint(uint64_t v) {
  Separate();
  char b[24];
  auto r = std::to_chars(b, b + sizeof b, v);
  out_.append(b, r.ptr);
}

void JsonWriter::Double(double v) {
  Separate();
  if (!std::isfinite(v)) {
    out_ += "null";
    return;
  }
  char b[32];
  auto r = std::to_chars(b, b + sizeof b - 2, v);  // shortest round-trip form
  // "600" reads as an integer in most JSON libraries: a double always looks like one.
  if (std::find_if(b, r.ptr, [](char c) { return c == '.' || c == 'e'; }) == r.ptr) {
    *r.ptr++ = '.';
    *r.ptr++ = '0';
  }
  out_.append(b, r.ptr);
}

void JsonWriter::Bool(bool v) {
  Separate();
  out_ += v ? "true" : "false";
}

void JsonWriter::Null() {
  Separate();
  out_ += "null";
}

void JsonWriter::Hex(uint64_t v) {
  Separate();
  char b[24];
  b[0] = '"';
  b[1] = '0';
  b[2] = 'x';
  auto r = std::to_chars(b + 3, b + sizeof b - 1, v, 16);
  *r.ptr = '"';
  out_.append(b, r.ptr + 1);
}

void JsonWriter::Raw(std::string_view json_value) {
  Separate();
  out_.append(json_value.data(), json_value.size());
}

}  // namespace trace
}  // namespace ncclwatch
