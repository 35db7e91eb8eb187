#include "format/dump_reader.h"

#include "format/file_name.h"
#include "format/ring_columns.h"
#include "format/summary_scan.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <iterator>
#include <new>
#include <limits>
#include <vector>

namespace ncclwatch {
namespace trace {

using nlohmann::json;

namespace {

// Deeper documents are refused: the schema nests at most ~6 levels, and a bound keeps
// hostile input from costing unbounded memory in the builder's stack.
constexpr size_t kMaxNesting = 64;
// The summary of a big job's rank is a few KB: a small first read usually covers it.
constexpr size_t kFirstChunk = 8 * 1024;
constexpr size_t kNextChunk = 64 * 1024;
// Memory bounds per file, whatever the input (a huge array or string in a hostile or broken
// file must not cost gigabytes): bytes read for the summary pass (a 16,384-rank job's summary
// is tens of KB), strings, array elements, and the ring entries kept (the newest: the analyzer
// needs recent call sites; `show` prints the last few).
constexpr uint64_t kMaxSummaryPassBytes = uint64_t{64} << 20;
constexpr uint64_t kMaxFullPassBytes = uint64_t{1} << 30;
constexpr size_t kMaxStringBytes = size_t{1} << 20;
constexpr size_t kMaxArrayElements = size_t{1} << 18;
constexpr size_t kRingEntriesKept = 16384;
// Bytes are not memory: 500 MB of small numbers are 4 GB of JSON values. What the values kept
// cost is estimated as they are placed (and given back as the ring's window drops entries); a
// dump ncclwatch writes (a 16,384-entry window, a thousand threads' stacks) costs tens of MB.
constexpr const char* kOutOfMemory = "out of memory reading it";
constexpr uint64_t kArraySlotBytes = 24;   // a value in a vector, with its growth slack
constexpr uint64_t kMemberSlotBytes = 96;  // a map node: links, key string, value

// ---------------------------------------------------------------------------------------------
// Input: a file read in growing chunks, exposed as an input iterator for nlohmann's SAX parser.

class ChunkedFile {
 public:
  ChunkedFile(int fd, uint64_t limit) : fd_(fd), limit_(limit), buf_(ThreadBuffer()) {}
  // True when a byte is available at the cursor (reading the next chunk if needed).
  bool Ensure() {
    if (string_too_long_) return false;  // ends the input: the parser reports an unexpected end
    if (pos_ < len_) return true;
    if (eof_) return false;
    if (bytes_read_ >= limit_) {  // ends the input: the parser reports an unexpected end
      over_limit_ = eof_ = true;
      return false;
    }
    size_t want = bytes_read_ == 0 ? kFirstChunk : kNextChunk;
    if (buf_.size() < want) buf_.resize(want);
    ssize_t n;
    do {
      n = ::read(fd_, buf_.data(), want);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {
      if (n < 0) error_ = errno;
      eof_ = true;
      return false;
    }
    pos_ = 0;
    len_ = static_cast<size_t>(n);
    bytes_read_ += static_cast<uint64_t>(n);
    return true;
  }
  // The bytes of the chunk read (by Ensure) and not yet taken.
  const char* data() const { return buf_.data() + pos_; }
  size_t available() const { return len_ - pos_; }
  char Current() const { return buf_[pos_]; }
  void Advance() { Track(buf_[pos_++]); }
  bool string_too_long() const { return string_too_long_; }
  uint64_t bytes_read() const { return bytes_read_; }
  bool eof() const { return eof_; }
  bool over_limit() const { return over_limit_; }
  int error() const { return error_; }

 private:
  int fd_;
  uint64_t limit_;
  bool over_limit_ = false;
  // One buffer per reading thread, kept from file to file (a summary pass reads thousands).
  static std::vector<char>& ThreadBuffer() {
    static thread_local std::vector<char> buffer;
    return buffer;
  }
  std::vector<char>& buf_;
  size_t pos_ = 0;
  size_t len_ = 0;
  uint64_t bytes_read_ = 0;
  bool eof_ = false;
  int error_ = 0;
  // The parser holds a string whole (and grows its buffer by doubling) before the handler can
  // refuse it: a string far over the bound is cut here, as its bytes go by, so that one huge
  // string costs a few MiB, not twice its size. Raw bytes: an escape is up to 6 of them.
  static constexpr uint64_t kMaxStringInput = 6 * kMaxStringBytes + 16;
  bool in_string_ = false;
  bool escaped_ = false;
  bool string_too_long_ = false;
  uint64_t string_bytes_ = 0;
  void Track(char c) {
    if (!in_string_) {
      in_string_ = c == '"';
      string_bytes_ = 0;
    } else if (escaped_) {
      escaped_ = false;
    } else if (c == '\\') {
      escaped_ = true;
    } else if (c == '"') {
      in_string_ = false;
    }
    if (in_string_ && ++string_bytes_ > kMaxStringInput) string_too_long_ = true;
  }
};

class ChunkIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  ChunkIterator() = default;  // the end
  explicit ChunkIterator(ChunkedFile* f) : file_(f) {}
  char operator*() const { return file_->Current(); }
  ChunkIterator& operator++() {
    file_->Advance();
    return *this;
  }
  bool operator==(const ChunkIterator& o) const { return AtEnd() == o.AtEnd(); }
  bool operator!=(const ChunkIterator& o) const { return !(*this == o); }

 private:
  bool AtEnd() const { return file_ == nullptr || !file_->Ensure(); }
  ChunkedFile* file_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// SAX handler that builds the top-level object key by key, so that a syntax error keeps the
// keys completed before it, and that can stop right after `summary`.

class TopLevelCollector {
 public:
  TopLevelCollector(ReadDepth depth, DumpDocument* doc, uint64_t memory_bound)
      : depth_mode_(depth), doc_(doc), memory_bound_(memory_bound) {}

  bool null() { return Value(json(nullptr)); }
  bool boolean(bool v) { return Value(json(v)); }
  bool number_integer(json::number_integer_t v) { return Value(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return Value(json(v)); }
  bool number_float(json::number_float_t v, const std::string&) { return Value(json(v)); }
  bool string(std::string& v) {
    if (v.size() > kMaxStringBytes) return Refuse("a string of " + std::to_string(v.size()) + " bytes");
    return Value(json(std::move(v)));
  }
  bool binary(json::binary_t&) { return Value(json(nullptr)); }

  bool start_object(std::size_t) {
    if (level_ == 0) {
      level_ = 1;
      return true;
    }
    return Open(json::object());
  }
  bool start_array(std::size_t) {
    if (level_ == 0) {
      doc_->not_an_object = true;
      return false;
    }
    return Open(json::array());
  }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }

  bool key(std::string& k) {
    if (level_ == 1) {
      top_key_ = std::move(k);
      skipping_ = !Wanted(top_key_);
    } else if (!skipping_) {
      member_key_.assign(k);  // a copy: the lexer keeps its buffer for the next token
    }
    return true;
  }

  bool parse_error(std::size_t position, const std::string& last_token,
                   const nlohmann::detail::exception& ex) {
    doc_->syntax_error = true;
    doc_->error_byte = position;
    // The lexer reports a truncated document as an error on an empty last token at the end.
    doc_->error_text = last_token.empty() ? "unexpected end" : Printable(last_token);
    (void)ex;
    return false;
  }

  bool complete() const { return complete_; }

 private:
  bool Wanted(const std::string& k) const {
    if (depth_mode_ == ReadDepth::kFull) return true;
    return k == key::kFormat || k == key::kVersion || k == key::kSummary;
  }

  bool Refuse(const std::string& what) {
    doc_->syntax_error = true;
    doc_->too_large = true;
    doc_->error_text = what + " (larger than any dump ncclwatch writes)";
    return false;
  }

  static std::string Printable(const std::string& s) {
    std::string out;
    for (char c : s.substr(0, 16)) out += (c >= 0x20 && c < 0x7f) ? c : '?';
    return out;
  }

  bool Value(json&& v) {
    if (level_ == 0) {  // a scalar document
      doc_->not_an_object = true;
      return false;
    }
    if (skipping_) return level_ > 1 || FinishTopValue();
    if (Duplicate() || !Room() || !Charge(v)) return false;
    Place(std::move(v));
    return level_ > 1 || FinishTopValue();
  }

  // Whether the open array may take one more element. The ring's entries are a window on the
  // newest: the oldest are dropped in batches (amortized O(1)).
  bool Room() {
    if (stack_.empty() || !stack_.back()->is_array()) return true;
    json& a = *stack_.back();
    if (&a == ring_entries_ || &a == ring_rows_) {
      if (a.size() >= 2 * kRingEntriesKept) DropOldest(a);
      return true;
    }
    if (a.size() >= kMaxArrayElements) return Refuse("an array of more than " + std::to_string(kMaxArrayElements) + " elements");
    return true;
  }

  bool Open(json&& container) {
    if (level_ >= kMaxNesting) {
      doc_->syntax_error = true;
      doc_->error_text = "nesting deeper than " + std::to_string(kMaxNesting);
      return false;
    }
    ++level_;
    if (skipping_) return true;
    if (Duplicate() || !Room() || !Charge(container)) return false;
    bool ring_member = container.is_array() && stack_.size() == 1 && top_key_ == key::kRing;
    bool entries = ring_member && member_key_ == key::kEntries;
    bool rows = ring_member && member_key_ == key::kRows;
    stack_.push_back(Place(std::move(container)));
    if (entries) ring_entries_ = stack_.back();
    if (rows) {  // version 2: rows are turned back into operation objects as they close
      ring_rows_ = stack_.back();
      ring_reader_ = RingRowReader();
      if (stack_.front()->is_object() && stack_.front()->contains(key::kColumns))
        ring_reader_.Columns((*stack_.front())[key::kColumns]);
    }
    return true;
  }

  bool Close() {
    if (level_ == 1) {  // end of the document object
      level_ = 0;
      complete_ = true;
      return true;
    }
    --level_;
    if (!skipping_) {
      json* closed = stack_.back();
      if (closed == ring_entries_ || closed == ring_rows_) {
        if (closed->size() > kRingEntriesKept) DropOldest(*closed);
        ring_entries_ = ring_rows_ = nullptr;
      }
      bool ring_row = ring_rows_ && stack_.size() >= 2 && stack_[stack_.size() - 2] == ring_rows_;
      stack_.pop_back();
      // A version 2 row becomes the operation object it stands for (so rows can leave the
      // window like entries); a shape is taken by the row reader and leaves the array.
      if (ring_row && closed->is_array()) {
        Release(DeepCost(*closed));
        *closed = ring_reader_.Row(*closed);
        memory_ += DeepCost(*closed);
      } else if (ring_row) {
        ring_reader_.DefineShape(*closed);
        Release(kArraySlotBytes + DeepCost(*closed));
        ring_rows_->erase(ring_rows_->end() - 1);
      }
    }
    return level_ > 1 || FinishTopValue();
  }

  // What a value costs by itself (a string its bytes, a container its header), and in its slot.
  static uint64_t OwnCost(const json& v) {
    if (v.is_string()) return 32 + v.get_ref<const std::string&>().size();
    return v.is_object() ? 48 : v.is_array() ? 24 : 0;
  }
  static uint64_t DeepCost(const json& v) {
    uint64_t c = OwnCost(v);
    if (v.is_array())
      for (const auto& e : v) c += kArraySlotBytes + DeepCost(e);
    else if (v.is_object())
      for (auto it = v.begin(); it != v.end(); ++it) c += kMemberSlotBytes + it.key().size() + DeepCost(it.value());
    return c;
  }
  // Counts the value about to be placed against the file's memory bound.
  bool Charge(const json& v) {
    uint64_t slot = stack_.empty() ? 0 : stack_.back()->is_array() ? kArraySlotBytes : kMemberSlotBytes + member_key_.size();
    memory_ += slot + OwnCost(v);
    if (memory_ <= memory_bound_) return true;
    return Refuse("JSON values of more than " + std::to_string(memory_bound_ >> 20) + " MiB in memory");
  }
  void Release(uint64_t bytes) { memory_ -= std::min(memory_, bytes); }
  // The ring's window keeps the newest entries.
  void DropOldest(json& window) {
    auto drop = static_cast<long>(window.size() - kRingEntriesKept);
    for (auto it = window.begin(); it != window.begin() + drop; ++it) Release(kArraySlotBytes + DeepCost(*it));
    window.erase(window.begin(), window.begin() + drop);
  }

  json* Place(json&& v) {
    if (stack_.empty()) {  // a top-level value: it joins the document only once complete
      current_ = std::move(v);
      return &current_;
    }
    json* parent = stack_.back();
    if (parent->is_array()) {
      parent->push_back(std::move(v));
      return &parent->back();
    }
    *member_slot_ = std::move(v);  // made by Duplicate()
    return member_slot_;
  }

  // A key given twice in one object: which value is meant cannot be told (a later "rank"
  // would silently replace the first), so the file is refused, with the key named. A member of
  // an open object gets its slot here (one lookup of its key, not two): a null that Place()
  // fills, or that a refusal leaves in a value never kept.
  bool Duplicate() {
    const bool top = stack_.empty();
    const std::string& k = top ? top_key_ : member_key_;
    if (top) {
      if (!doc_->top.contains(k)) return false;
    } else if (stack_.back()->is_object()) {
      auto placed = stack_.back()->get_ref<json::object_t&>().emplace(k, nullptr);
      member_slot_ = &placed.first->second;
      if (placed.second) return false;
    } else {
      return false;
    }
    doc_->syntax_error = true;
    doc_->duplicate_key = Printable(k);
    doc_->error_text = "the key \"" + doc_->duplicate_key + "\" is given twice in one object";
    return true;
  }

  // A top-level value just ended: stop if the summary pass has all it needs.
  bool FinishTopValue() {
    if (!skipping_) doc_->top[top_key_] = std::move(current_);
    skipping_ = false;
    if (depth_mode_ != ReadDepth::kSummary) return true;
    const json& t = doc_->top;
    if (t.contains(key::kSummary) && t.contains(key::kFormat) && t.contains(key::kVersion)) {
      doc_->stopped_early = true;
      return false;
    }
    return true;
  }

  ReadDepth depth_mode_;
  DumpDocument* doc_;
  uint64_t memory_bound_;
  uint64_t memory_ = 0;  // estimated bytes of the values kept
  size_t level_ = 0;  // 0 outside the document, 1 inside the top object
  std::string top_key_;
  std::string member_key_;
  bool skipping_ = false;
  bool complete_ = false;
  json current_;              // the top-level value being built
  json* member_slot_ = nullptr;  // Duplicate(): where the member about to be placed goes
  std::vector<json*> stack_;  // open containers of current_
  json* ring_entries_ = nullptr;  // ring.entries while it is open
  json* ring_rows_ = nullptr;     // ring.rows (version 2) while it is open
  RingRowReader ring_reader_;
};

// Out of memory (a memory cap below the bound): the file is given up, never the process.
void OutOfMemory(DumpDocument* doc) {
  doc->syntax_error = doc->too_large = true;
  doc->truncated = false;
  doc->error_text = kOutOfMemory;
}

template <typename Iterator>
void ParseAndNormalize(Iterator first, Iterator last, ReadDepth depth, DumpDocument* doc, uint64_t memory_bound) {
  TopLevelCollector collector(depth, doc, memory_bound);
  try {
    json::sax_parse(first, last, &collector, json::input_format_t::json, /*strict=*/true);
  } catch (const std::bad_alloc&) {
    throw;
  } catch (const std::exception& e) {  // defensive: the SAX path reports errors, not throws
    doc->syntax_error = true;
    doc->error_text = e.what();
  }
  if (!collector.complete() && !doc->stopped_early && !doc->syntax_error && !doc->not_an_object) {
    doc->syntax_error = true;  // e.g. empty input: the parser saw no value at all
    doc->error_text = "unexpected end";
  }
  // Every reader of the ring (analysis, `show`, `show --json`) sees version 1's shape.
  if (doc->top.contains(key::kRing)) {
    json& ring = doc->top[key::kRing];
    if (ring.is_object() && ring.contains(key::kRows)) {
      json entries = json::array();
      for (auto& row : ring[key::kRows])
        if (row.is_object()) entries.push_back(std::move(row));
      ring.erase(key::kRows);
      ring.erase(key::kColumns);
      ring[key::kEntries] = std::move(entries);
    }
  }
  // Version 2's frames name their module by index in `modules`: put the path and build id
  // back, so that every reader of stacks sees version 1's frames.
  if (doc->top.contains(key::kModules)) {
    const json modules = std::move(doc->top[key::kModules]);
    doc->top.erase(key::kModules);
    for (const char* list : {key::kCallsites, key::kThreads}) {
      if (!doc->top.contains(list) || !doc->top[list].is_array()) continue;
      for (auto& item : doc->top[list]) {
        if (!item.is_object() || !item.contains(key::kFrames) || !item[key::kFrames].is_array()) continue;
        for (auto& frame : item[key::kFrames]) {
          if (!frame.is_object() || !frame.contains(key::kModule) || !frame[key::kModule].is_number_integer()) continue;
          int64_t i = frame[key::kModule].get<int64_t>();
          const json* m = modules.is_array() && i >= 0 && static_cast<size_t>(i) < modules.size() ? &modules[static_cast<size_t>(i)] : nullptr;
          frame[key::kModule] = m && m->is_object() && m->contains(key::kPath) && (*m)[key::kPath].is_string() ? (*m)[key::kPath] : json("");
          frame[key::kBuildId] = m && m->is_object() && m->contains(key::kBuildId) && (*m)[key::kBuildId].is_string() ? (*m)[key::kBuildId] : json("");
        }
      }
    }
  }
}

template <typename Iterator>
void RunParser(Iterator first, Iterator last, ReadDepth depth, DumpDocument* doc, uint64_t memory_bound) {
  try {
    ParseAndNormalize(first, last, depth, doc, memory_bound);
  } catch (const std::bad_alloc&) {
    OutOfMemory(doc);
  }
}

// ---------------------------------------------------------------------------------------------
// Tolerant access: a missing or mistyped key reads as the given default.

const json* Find(const json& obj, std::string_view k) {  // a view: its length is taken once
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(k);
  return it == obj.end() ? nullptr : &*it;
}

int64_t GetInt(const json& obj, const char* k, int64_t def) {
  const json* v = Find(obj, k);
  if (!v) return def;
  if (v->is_number_unsigned()) {
    auto u = v->get<uint64_t>();
    return u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
               ? std::numeric_limits<int64_t>::max()
               : static_cast<int64_t>(u);
  }
  if (v->is_number_integer()) return v->get<int64_t>();
  if (v->is_number_float()) {
    double d = v->get<double>();
    if (std::isfinite(d) && d > -9.2e18 && d < 9.2e18) return static_cast<int64_t>(d);
  }
  return def;
}

int GetInt32(const json& obj, const char* k, int def) {
  int64_t v = GetInt(obj, k, def);
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) return def;
  return static_cast<int>(v);
}

// A rank or size in [0, kMaxRank), else `def`.
// Values out of their range are read as absent (or clamped) and named once per dump: a reader
// that silently clamps a corrupt counter blames the wrong rank without saying why.
thread_local std::vector<std::string>* t_out_of_range = nullptr;

void OutOfRange(const json& obj, const char* k) {
  if (!t_out_of_range || t_out_of_range->size() >= 3) return;
  const json* v = Find(obj, k);
  t_out_of_range->push_back(std::string(k) + "=" + (v ? v->dump().substr(0, 24) : std::string("?")));
}

int GetRank(const json& obj, const char* k, int def) {
  const json* raw = Find(obj, k);
  if (!raw || !raw->is_number()) return def;
  int v = GetInt32(obj, k, def);
  if (v >= 0 && v < kMaxRank && GetInt(obj, k, def) == v) return v;
  if (!(raw->is_number_integer() && raw->get<int64_t>() == -1)) OutOfRange(obj, k);  // -1: unknown, as written
  return def;
}

// A sequence number or counter in [0, kMaxSeq]; negative reads as 0, huge as kMaxSeq.
int64_t GetSeq(const json& obj, const char* k) {
  const json* raw = Find(obj, k);
  int64_t v = GetInt(obj, k, 0);
  bool exact = raw && raw->is_number_integer() && (raw->is_number_unsigned()
                                                        ? raw->get<uint64_t>() <= static_cast<uint64_t>(kMaxSeq)
                                                        : raw->get<int64_t>() >= 0);
  if (raw && raw->is_number() && (!exact || v > kMaxSeq)) OutOfRange(obj, k);
  return std::clamp<int64_t>(v, 0, kMaxSeq);
}

double GetDouble(const json& obj, const char* k, double def) {
  const json* v = Find(obj, k);
  if (!v || !v->is_number()) return def;
  double d = v->get<double>();
  return std::isfinite(d) ? d : def;
}

std::string GetString(const json& obj, const char* k) {
  const json* v = Find(obj, k);
  return v && v->is_string() ? v->get<std::string>() : std::string();
}

bool GetBool(const json& obj, const char* k, bool def) {
  const json* v = Find(obj, k);
  return v && v->is_boolean() ? v->get<bool>() : def;
}

template <typename Fn>
void ForEachObject(const json& obj, const char* k, Fn&& fn) {
  const json* arr = Find(obj, k);
  if (!arr || !arr->is_array()) return;
  for (const auto& e : *arr)
    if (e.is_object()) fn(e);
}

OpStateValue ParseState(const std::string& s) {
  OpStateValue v;
  v.known = ParseOpState(s.c_str(), &v.value);
  if (!v.known) v.value = OpState::Count;
  return v;
}

KeyValues KeyValuesFromJson(const json* obj) {
  KeyValues kvs;
  if (obj && obj->is_object())
    for (auto it = obj->begin(); it != obj->end(); ++it)
      if (it.value().is_string()) kvs.emplace_back(it.key(), it.value().get<std::string>());
  return kvs;
}

std::vector<std::string> TextsFromJson(const json* arr) {
  std::vector<std::string> texts;
  if (arr && arr->is_array())
    for (const auto& a : *arr)
      if (a.is_string()) texts.push_back(a.get<std::string>());
  return texts;
}

void ReadOpKind(const json& j, const char* k, Op* op) {
  op->op_name = GetString(j, k);
  op->op_known = ParseOpKind(op->op_name.c_str(), &op->op);
  if (op->op_known) op->op_name.clear();  // the kind says it; don't keep the string twice
}

// The reader of each listed record (records.h, "Field lists"): its fields in list order.
#define NCCLWATCH_DECLARE_FIELDS_READER(Type, LIST) void ReadFields(const json& j, Type* r);
NCCLWATCH_FOR_EACH_LISTED_RECORD(NCCLWATCH_DECLARE_FIELDS_READER)
#undef NCCLWATCH_DECLARE_FIELDS_READER

// A record of an array, read whole; false: the reader drops it.
template <typename Record>
bool ReadElement(const json& j, Record* r) {
  ReadFields(j, r);
  return true;
}
// A communicator without id cannot be matched across ranks (dropped before its other fields
// are read, so their values out of range are not named); a rank beyond its size is unknown.
bool ReadElement(const json& j, CommSummary* c) {
  c->id = GetString(j, key::kId);
  if (c->id.empty()) return false;
  ReadFields(j, c);
  if (c->size > 0 && c->rank >= c->size) c->rank = kUnknownRank;
  return true;
}

template <typename Record>
void ReadObjects(const json& j, const char* k, std::vector<Record>* out) {
  if (const json* arr = Find(j, k); arr && arr->is_array()) out->reserve(arr->size());  // exact: 131,072 summaries stay in memory
  ForEachObject(j, k, [&](const json& e) {
    Record r;
    if (ReadElement(e, &r)) out->push_back(std::move(r));
  });
}

template <typename OptionalRecord>  // std::optional or Boxed
void ReadObject(const json& j, const char* k, OptionalRecord* out) {
  if (const json* v = Find(j, k); v && v->is_object()) ReadFields(*v, &out->emplace());
}

// How each `how` of a field list is read (j: the object, k: the key, r: the record).
#define NCCLWATCH_FIELD_READ_Text(j, k, def, r, m) r->m = GetString(j, k)
#define NCCLWATCH_FIELD_READ_TextOrNull(j, k, def, r, m) r->m = GetString(j, k)
#define NCCLWATCH_FIELD_READ_Int(j, k, def, r, m) r->m = GetInt(j, k, def)
#define NCCLWATCH_FIELD_READ_Int32(j, k, def, r, m) r->m = GetInt32(j, k, def)
#define NCCLWATCH_FIELD_READ_Rank(j, k, def, r, m) r->m = GetRank(j, k, def)
#define NCCLWATCH_FIELD_READ_Seq(j, k, def, r, m) r->m = GetSeq(j, k)
#define NCCLWATCH_FIELD_READ_Real(j, k, def, r, m) r->m = GetDouble(j, k, def)
#define NCCLWATCH_FIELD_READ_Flag(j, k, def, r, m) r->m = GetBool(j, k, def)
#define NCCLWATCH_FIELD_READ_RealIfSet(j, k, def, r, m) r->m = GetDouble(j, k, def)
#define NCCLWATCH_FIELD_READ_IntIfSet(j, k, def, r, m) r->m = GetInt(j, k, def)
#define NCCLWATCH_FIELD_READ_IntIfNonZero(j, k, def, r, m) r->m = GetInt(j, k, def)
#define NCCLWATCH_FIELD_READ_Object(j, k, def, r, m) ReadObject(j, k, &r->m)
#define NCCLWATCH_FIELD_READ_ObjectIfSet(j, k, def, r, m) ReadObject(j, k, &r->m)
#define NCCLWATCH_FIELD_READ_Objects(j, k, def, r, m) ReadObjects(j, k, &r->m)
#define NCCLWATCH_FIELD_READ_Texts(j, k, def, r, m) r->m = TextsFromJson(Find(j, k))
#define NCCLWATCH_FIELD_READ_KeyValues(j, k, def, r, m) r->m = KeyValuesFromJson(Find(j, k))
#define NCCLWATCH_FIELD_READ_OpKind(j, k, def, r, m) ReadOpKind(j, k, r)
#define NCCLWATCH_FIELD_READ_OpState(j, k, def, r, m) r->m = ParseState(GetString(j, k))
#define NCCLWATCH_FIELD_READ_Reason(j, k, def, r, m) r->m = DumpReasonValue::Named(GetString(j, k))
#define NCCLWATCH_FIELD_READ_Part(j, k, def, r, m)

#define NCCLWATCH_READ_FIELD(type, member, def, key_name, how) \
  NCCLWATCH_FIELD_READ_##how(j, key::key_name, def, r, member);
#define NCCLWATCH_DEFINE_FIELDS_READER(Type, LIST) \
  void ReadFields(const json& j, Type* r) { LIST(NCCLWATCH_READ_FIELD) }
NCCLWATCH_FOR_EACH_LISTED_RECORD(NCCLWATCH_DEFINE_FIELDS_READER)
#undef NCCLWATCH_DEFINE_FIELDS_READER
#undef NCCLWATCH_READ_FIELD

// "0x1f" (as written) or a plain number; 0 when neither.
uint64_t ParseIp(const json& obj, const char* k) {
  const json* v = Find(obj, k);
  if (v && v->is_number_unsigned()) return v->get<uint64_t>();
  if (!v || !v->is_string()) return 0;
  const std::string& s = v->get_ref<const std::string&>();
  if (s.size() < 3 || s[0] != '0' || (s[1] != 'x' && s[1] != 'X')) return 0;
  uint64_t ip = 0;
  auto r = std::from_chars(s.data() + 2, s.data() + s.size(), ip, 16);
  return r.ec == std::errc() && r.ptr == s.data() + s.size() ? ip : 0;
}

Stack StackFromJson(const json& j) {
  Stack s;
  ForEachObject(j, key::kFrames, [&](const json& f) {
    s.native.push_back({ParseIp(f, key::kIp), GetString(f, key::kModule), GetString(f, key::kSymbol),
                        static_cast<uint64_t>(GetInt(f, key::kOffset, 0)), GetString(f, key::kBuildId),
                        ParseIp(f, key::kModuleOffset), GetBool(f, key::kInterrupted, false)});
  });
  ReadObjects(j, key::kPython, &s.python);
  return s;
}

std::string ErrorLine(const DumpDocument& doc, const char* consequence) {
  std::string line;
  if (doc.too_large)
    line = "too large: " + doc.error_text;
  else if (doc.truncated)  // report where the input ends, as a person checking the file size would
    line = "truncated JSON at byte " + std::to_string(std::min(doc.error_byte, doc.input_size));
  else if (doc.error_byte == 0)
    line = "invalid JSON: " + doc.error_text;
  else
    line = "invalid JSON at byte " + std::to_string(doc.error_byte) + " near '" + doc.error_text + "'";
  return line + " (" + consequence + ")";
}

}  // namespace

// ---------------------------------------------------------------------------------------------

namespace {

std::atomic<bool> g_summary_scan{true};

// A summary longer than the first chunk (a big job's p2p counters): the fast path reads on in
// the chunks the generic pass would read (so that both count the same bytes), with pread, which
// leaves the file's offset where the generic pass, if it is needed, goes on from.
constexpr size_t kMaxScanBytes = size_t{1} << 20;
bool ScanLonger(int fd, const ChunkedFile& file, LoadedDump* fast, uint64_t* bytes_read) {
  static thread_local std::string bytes;
  bytes.assign(file.data(), file.available());
  for (bool more = true; more && bytes.size() < kMaxScanBytes;) {
    const size_t had = bytes.size();
    bytes.resize(had + kNextChunk);
    ssize_t n;
    do {
      n = ::pread(fd, &bytes[had], kNextChunk, static_cast<off_t>(had));
    } while (n < 0 && errno == EINTR);
    bytes.resize(had + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n <= 0) return false;
    if (ScanSummary(bytes, &fast->version, &fast->summary, &more)) {
      *bytes_read = bytes.size();
      return true;
    }
  }
  return false;
}

// `fast`: the summary pass may read the summary with ScanSummary into it; *scanned says it did
// (the document then holds the sizes only).
DumpDocument ParseFile(const std::string& path, ReadDepth depth, LoadedDump* fast, bool* scanned) {
  DumpDocument doc;
  // O_NONBLOCK: opening a FIFO named like a dump must not wait for a writer.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    doc.io_error = std::string("cannot open: ") + std::strerror(errno);
    return doc;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    doc.io_error = S_ISDIR(st.st_mode) ? "is a directory" : "not a regular file";
    return doc;
  }
  doc.input_size = static_cast<uint64_t>(st.st_size);
  // The summary pass reads a few KB of each of thousands of files: kernel readahead (128 KB
  // and more) would multiply the disk traffic of a cold cache.
  if (depth == ReadDepth::kSummary) (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
  ChunkedFile file(fd, depth == ReadDepth::kSummary ? kMaxSummaryPassBytes : kMaxFullPassBytes);
  // The summary is in the first few KB of a dump: parsed from the first chunk as one block of
  // memory (several times faster than byte by byte through the chunks). Used only when the
  // summary pass ends in it; else the chunk is parsed again below, as the start of the file,
  // so that a dump read either way gives the same document and the same problems.
  bool parsed = false;
  if (depth == ReadDepth::kSummary && file.Ensure()) {
    bool more = false;
    if (fast && (ScanSummary(std::string_view(file.data(), file.available()), &fast->version, &fast->summary, &more) ||
                 (more && ScanLonger(fd, file, fast, &doc.bytes_read)))) {
      if (doc.bytes_read == 0) doc.bytes_read = file.bytes_read();
      *scanned = true;
      ::close(fd);
      return doc;
    }
    // A digit at the end of a full chunk may be a number that goes on in the file (a version
    // "31" cut after its "3"): then the chunks only.
    const char last = file.data()[file.available() - 1];
    const bool may_go_on = file.available() == kFirstChunk && last >= '0' && last <= '9';
    DumpDocument first;
    first.input_size = doc.input_size;
    if (!may_go_on) RunParser(file.data(), file.data() + file.available(), depth, &first, kMaxValueMemory);
    if (!may_go_on && first.stopped_early && !first.syntax_error) {
      doc = std::move(first);
      parsed = true;
    }
  }
  if (!parsed) RunParser(ChunkIterator(&file), ChunkIterator(), depth, &doc, kMaxValueMemory);
  doc.bytes_read = file.bytes_read();

  if (file.error() != 0) doc.io_error = std::string("read error: ") + std::strerror(file.error());
  doc.truncated = doc.syntax_error && file.eof() && doc.error_byte >= file.bytes_read();
  if (file.string_too_long() && doc.syntax_error) {  // cut by the string bound, as it went by
    doc.truncated = false;
    doc.too_large = true;
    doc.error_byte = 0;
    doc.error_text = "a string of more than " + std::to_string(kMaxStringBytes) + " bytes";
  } else if (file.over_limit() && doc.syntax_error) {  // cut by our bound, not by the writer
    doc.truncated = false;
    doc.too_large = true;
    doc.error_byte = 0;
    doc.error_text = "stopped reading after " + std::to_string(file.bytes_read() >> 20) +
                     " MiB (larger than any dump ncclwatch writes)";
  }
  ::close(fd);
  return doc;
}

}  // namespace

void UseSummaryScan(bool on) { g_summary_scan.store(on, std::memory_order_relaxed); }

DumpDocument ParseDocumentFromFile(const std::string& path, ReadDepth depth) {
  return ParseFile(path, depth, nullptr, nullptr);
}

DumpDocument ParseDocumentFromBuffer(std::string_view bytes, ReadDepth depth, uint64_t memory_bound) {
  DumpDocument doc;
  doc.input_size = bytes.size();
  RunParser(bytes.begin(), bytes.end(), depth, &doc, memory_bound);
  doc.bytes_read = bytes.size();
  doc.truncated = doc.syntax_error && doc.error_byte >= bytes.size();
  return doc;
}

Op OpFromJson(const json& j) {
  Op op;
  ReadFields(j, &op);
  return op;
}

Summary SummaryFromJson(const json& j) {
  Summary s;
  ReadFields(j, &s);
  return s;
}

Detail DetailFromJson(const json& top) {
  Detail d;
  const json* p = Find(top, key::kProcess);
  // A dump without the full detail (a recovery) is light: it has recoveries only.
  d.light = !p && !Find(top, key::kRing) && !Find(top, key::kCommunicators);
  if (p) ReadFields(*p, &d.process);
  ReadObjects(top, key::kCommunicators, &d.communicators);
  if (const json* r = Find(top, key::kRing)) {
    d.ring.capacity = GetInt(*r, key::kCapacity, 0);
    d.ring.recorded = GetInt(*r, key::kRecorded, 0);
    d.ring.overwritten = GetInt(*r, key::kOverwritten, 0);
    ForEachObject(*r, key::kEntries, [&](const json& o) { d.ring.entries.push_back(OpFromJson(o)); });
  }
  ForEachObject(top, key::kCallsites, [&](const json& c) {
    d.callsites.push_back(
        {GetInt(c, key::kId, -1), StackFromJson(c), GetString(c, key::kNote), GetString(c, key::kPythonDrivenFrom)});
  });
  ForEachObject(top, key::kThreads, [&](const json& t) {
    d.threads.push_back({GetInt(t, key::kTid, 0), GetString(t, key::kName), StackFromJson(t),
                         GetString(t, key::kNote), GetBool(t, key::kOwn, false)});
  });
  ReadObjects(top, key::kRecoveries, &d.recoveries);
  return d;
}

namespace {

ReadResult Interpret(const DumpDocument& doc, ReadDepth depth, LoadedDump* dump) {
  ReadResult r;
  r.bytes_read = doc.bytes_read;
  r.file_size = doc.input_size;
  if (!doc.duplicate_key.empty()) {  // which of the two values is meant cannot be told
    r.problem = doc.error_text + " (edited or not written by ncclwatch): not used";
    return r;
  }
  if (!doc.io_error.empty() && doc.bytes_read == 0) {
    r.problem = doc.io_error;
    return r;
  }
  if (doc.input_size == 0 && doc.bytes_read == 0) {
    r.problem = "empty file";
    return r;
  }
  if (doc.not_an_object) {
    r.problem = "not an ncclwatch dump (not a JSON object)";
    return r;
  }
  const json& top = doc.top;
  const json* format = Find(top, key::kFormat);
  const json* version = Find(top, key::kVersion);
  const json* summary = Find(top, key::kSummary);
  if (format && (!format->is_string() || format->get<std::string>() != kFormatName)) {
    r.problem = "not an ncclwatch dump (format is " + format->dump() + ")";
    return r;
  }
  if (version) {
    if (!version->is_number_integer()) {
      r.problem = "unreadable trace version " + version->dump();
      return r;
    }
    const std::string known = "this ncclwatch reads versions " + std::to_string(kOldestTraceVersion) + " to " +
                              std::to_string(kTraceVersion);
    if (version->get<int64_t>() > kTraceVersion) {
      r.problem = "trace version " + version->dump() + ", written by a newer ncclwatch: upgrade (" + known + ")";
      r.newer_version = true;
      return r;
    }
    if (version->get<int64_t>() < kOldestTraceVersion) {
      r.problem = "unknown trace version " + version->dump() + " (" + known + ")";
      return r;
    }
  }
  if (!summary) {
    if (doc.syntax_error) r.problem = ErrorLine(doc, "summary unreadable");
    else if (!format) r.problem = "not an ncclwatch dump (no \"" + std::string(key::kFormat) + "\" key)";
    else r.problem = "no \"" + std::string(key::kSummary) + "\" object";
    return r;
  }
  if (!format || !version) {
    r.problem = std::string("not an ncclwatch dump (no \"") + (format ? key::kVersion : key::kFormat) +
                "\" key)";
    return r;
  }
  if (!summary->is_object()) {
    r.problem = "\"summary\" is not an object";
    return r;
  }
  dump->version = static_cast<int>(version->get<int64_t>());
  std::vector<std::string> out_of_range;
  t_out_of_range = &out_of_range;
  dump->summary = SummaryFromJson(*summary);
  t_out_of_range = nullptr;
  r.usable = true;
  if (!out_of_range.empty()) {
    r.problem = "values out of range read as absent:";
    for (const auto& v : out_of_range) r.problem += " " + v;
  }
  if (depth == ReadDepth::kFull) {
    dump->detail = std::make_shared<Detail>(DetailFromJson(top));
    if (doc.syntax_error) {
      dump->detail_problem = ErrorLine(doc, "details unreadable; summary used");
      r.problem = dump->detail_problem;
    }
  }
  return r;
}

}  // namespace

ReadResult InterpretDocument(const DumpDocument& doc, ReadDepth depth, LoadedDump* dump) {
  try {
    return Interpret(doc, depth, dump);
  } catch (const std::bad_alloc&) {  // the file is given up, never the process
    t_out_of_range = nullptr;
    dump->detail.reset();
    ReadResult r;
    r.problem = kOutOfMemory;
    r.bytes_read = doc.bytes_read;
    r.file_size = doc.input_size;
    return r;
  }
}

ReadResult ReadDumpFile(const std::string& path, ReadDepth depth, LoadedDump* dump) {
  bool scanned = false;
  const bool scan = depth == ReadDepth::kSummary && g_summary_scan.load(std::memory_order_relaxed);
  DumpDocument doc = ParseFile(path, depth, scan ? dump : nullptr, &scanned);
  ReadResult r;
  if (scanned) {  // what InterpretDocument gives for a summary read whole and in range
    r.usable = true;
    r.bytes_read = doc.bytes_read;
    r.file_size = doc.input_size;
  } else {
    r = InterpretDocument(doc, depth, dump);
  }
  // A file named as the writer names dumps must be the dump its name says: one whose summary
  // says another rank (edited, or copied over another) would be read as that rank's.
  const std::string name = path.substr(path.rfind('/') == std::string::npos ? 0 : path.rfind('/') + 1);
  const int named_rank = RankFromFileName(name);
  if (r.usable && IsDumpFileName(name) && named_rank >= 0 && named_rank != dump->summary.rank) {
    r.usable = false;
    r.problem = "its name says rank " + std::to_string(named_rank) + " but its summary says rank " +
                std::to_string(dump->summary.rank) + " (edited, or copied over another dump): not used";
    dump->detail.reset();
  }
  return r;
}

ReadResult ReadDumpBuffer(std::string_view bytes, ReadDepth depth, LoadedDump* dump) {
  DumpDocument doc = ParseDocumentFromBuffer(bytes, depth);
  return InterpretDocument(doc, depth, dump);
}

}  // namespace trace
}  // namespace ncclwatch
