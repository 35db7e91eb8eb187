// A streaming JSON writer: appends text to a string as values are given, with the comma
// bookkeeping done here. No document tree, so a dump costs its own size in memory, not the tens
// of times more a DOM costs. Strings are escaped; bytes that are not valid UTF-8 become U+FFFD
// (an environment value or a symbol with a stray byte never makes the output invalid).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace ncclwatch {
namespace trace {

class JsonWriter {
 public:
  explicit JsonWriter(std::string* out) : out_(*out) {}

  // Inside an object, every value is preceded by Key().
  JsonWriter& Key(std::string_view k);
  void BeginObject() { Open('{'); }
  void EndObject() { Close('}'); }
  void BeginArray() { Open('['); }
  void EndArray() { Close(']'); }
  void String(std::string_view s);
  void Int(int64_t v);
  void Uint(uint64_t v);
  void Double(double v);  // shortest text that reads back equal; non-finite as null
  void Bool(bool v);
  void Null();
  void Hex(uint64_t v);  // "0x1f" as a string
  // Splices text that is already one JSON value.
  void Raw(std::string_view json_value);

  // Key + value in one call.
  template <typename T>
  void Field(std::string_view k, const T& v) {
    Key(k);
    Put(v);
  }
  void Put(std::string_view s) { String(s); }
  void Put(const std::string& s) { String(s); }
  void Put(const char* s) { String(s); }
  void Put(bool v) { Bool(v); }
  void Put(int v) { Int(v); }
  void Put(long v) { Int(v); }
  void Put(long long v) { Int(v); }
  void Put(unsigned v) { Uint(v); }
  void Put(unsigned long v) { Uint(v); }
  void Put(unsigned long long v) { Uint(v); }
  void Put(double v) { Double(v); }

  size_t depth() const { return depth_; }

 private:
  static constexpr size_t kMaxDepth = 32;  // the schema nests about 6 levels
  void Separate();
  void Open(char c);
  void Close(char c);

  std::string& out_;
  size_t depth_ = 0;
  bool first_[kMaxDepth + 1] = {true};
  bool after_key_ = false;
};

// Appends `s` as a quoted, escaped JSON string.
void AppendJsonString(std::string* out, std::string_view s);

}  // namespace trace
}  // namespace ncclwatch
