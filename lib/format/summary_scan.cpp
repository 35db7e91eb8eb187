#include "format/summary_scan.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace ncclwatch {
namespace trace {

namespace {

// A cursor over the bytes. Each method takes one JSON token (after whitespace) as the generic
// parser (nlohmann, strict) would, or returns false where that parser would fail, read another
// value, or where taking the token exactly would cost more code than the fallback costs time.
struct Scanner {
  const char* p;
  const char* e;

  bool Ws() {
    while (p < e && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')) ++p;
    return p < e;
  }
  bool Eat(char c) {
    if (!Ws() || *p != c) return false;
    ++p;
    return true;
  }
  bool Literal(const char* word, size_t n) {
    if (!Ws()) return false;
    if (static_cast<size_t>(e - p) < n) {  // "nu" at the end: more bytes may make it "null"
      if (std::memcmp(p, word, static_cast<size_t>(e - p)) == 0) p = e;
      return false;
    }
    if (std::memcmp(p, word, n) != 0) return false;
    p += n;
    return true;
  }
  bool Null() { return Literal("null", 4); }

  // A key: plain printable ASCII only (no escapes), then ':'.
  bool Key(std::string_view* k) {
    if (!Eat('"')) return false;
    const char* b = p;
    while (p < e && *p != '"') {
      auto c = static_cast<unsigned char>(*p);
      if (c < 0x20 || c >= 0x80 || c == '\\') return false;
      ++p;
    }
    if (p >= e) return false;
    *k = std::string_view(b, static_cast<size_t>(p - b));
    ++p;
    return Eat(':');
  }

  // A string: ASCII (the parser checks UTF-8; a byte outside ASCII is the fallback's), the
  // one-letter escapes; \u is the fallback's. Stored with its exact capacity, as a copy of the
  // parser's string is.
  bool Str(std::string* out) {
    if (!Eat('"')) return false;
    const char* b = p;
    while (p < e && *p != '"' && *p != '\\') {
      auto c = static_cast<unsigned char>(*p);
      if (c < 0x20 || c >= 0x80) return false;
      ++p;
    }
    if (p >= e) return false;
    if (*p == '"') {
      *out = std::string(b, static_cast<size_t>(p - b));
      ++p;
      return true;
    }
    std::string s(b, static_cast<size_t>(p - b));
    while (p < e && *p != '"') {
      auto c = static_cast<unsigned char>(*p);
      if (c < 0x20 || c >= 0x80) return false;
      if (c != '\\') {
        s += *p++;
        continue;
      }
      if (++p >= e) return false;
      switch (*p++) {
        case '"': s += '"'; break;
        case '\\': s += '\\'; break;
        case '/': s += '/'; break;
        case 'b': s += '\b'; break;
        case 'f': s += '\f'; break;
        case 'n': s += '\n'; break;
        case 'r': s += '\r'; break;
        case 't': s += '\t'; break;
        default: return false;  // \u, or not an escape
      }
    }
    if (p >= e) return false;
    ++p;
    *out = std::string(s.data(), s.size());
    return true;
  }

  // A number, as JSON spells it. An integer within int64 in *i; with a fraction or an exponent,
  // a finite double in *d (*is_float). False for one that may go on past the bytes, and for an
  // integer beyond int64 (the parser reads it as unsigned or as a double).
  bool Number(int64_t* i, double* d, bool* is_float) {
    if (!Ws()) return false;
    const char* b = p;
    auto digit = [this] { return p < e && *p >= '0' && *p <= '9'; };
    if (*p == '-') ++p;
    if (p >= e) return false;
    if (*p == '0') {
      ++p;
    } else if (digit()) {
      while (digit()) ++p;
    } else {
      return false;
    }
    bool flt = false;
    if (p < e && *p == '.') {
      flt = true;
      ++p;
      if (!digit()) return false;
      while (digit()) ++p;
    }
    if (p < e && (*p == 'e' || *p == 'E')) {
      flt = true;
      ++p;
      if (p < e && (*p == '+' || *p == '-')) ++p;
      if (!digit()) return false;
      while (digit()) ++p;
    }
    if (p >= e) return false;  // "1" at the end of the bytes may be "12" in the file
    *is_float = flt;
    if (flt) {
      auto r = std::from_chars(b, p, *d, std::chars_format::general);
      return r.ec == std::errc() && r.ptr == p && std::isfinite(*d);
    }
    auto r = std::from_chars(b, p, *i);
    return r.ec == std::errc() && r.ptr == p;
  }
  bool Integer(int64_t* i) {
    double d;
    bool flt;
    return Number(i, &d, &flt) && !flt;
  }
};

// Each `how` of records.h's field lists, read as dump_reader.cpp's getters read it from a fresh
// record (a null or absent value leaves the member at its default, as the getters give it).
bool ScanText(Scanner& s, std::string* m) { return s.Null() || s.Str(m); }
bool ScanInt(Scanner& s, int64_t* m) { return s.Null() || s.Integer(m); }
bool ScanInt32(Scanner& s, int* m) {  // out of int's range: the default
  if (s.Null()) return true;
  int64_t v;
  if (!s.Integer(&v)) return false;
  if (v >= INT32_MIN && v <= INT32_MAX) *m = static_cast<int>(v);
  return true;
}
bool ScanRank(Scanner& s, int* m) {  // -1: the default; else out of range is named: the fallback's
  if (s.Null()) return true;
  int64_t v;
  if (!s.Integer(&v)) return false;
  if (v >= 0 && v < kMaxRank) *m = static_cast<int>(v);
  return v >= 0 ? v < kMaxRank : v == -1;
}
bool ScanSeq(Scanner& s, int64_t* m) {  // out of range is named: the fallback's
  if (s.Null()) return true;
  return s.Integer(m) && *m >= 0 && *m <= kMaxSeq;
}
bool ScanReal(Scanner& s, double* m) {
  if (s.Null()) return true;
  int64_t i;
  double d;
  bool flt;
  if (!s.Number(&i, &d, &flt)) return false;
  *m = flt ? d : static_cast<double>(i);
  return true;
}
[[maybe_unused]] bool ScanFlag(Scanner& s, bool* m) {  // no Flag in the summary today
  if (s.Literal("true", 4)) {
    *m = true;
    return true;
  }
  if (s.Literal("false", 5)) {
    *m = false;
    return true;
  }
  return s.Null();
}
// A vocabulary: the generic reader parses the name, "" for null or absent.
bool ScanName(Scanner& s, std::string* name) { return s.Null() || s.Str(name); }
void ReadOpKindName(std::string name, Op* r) {
  r->op_name = std::move(name);
  r->op_known = ParseOpKind(r->op_name.c_str(), &r->op);
  if (r->op_known) r->op_name.clear();  // as ReadOpKind: the kind says it
}
bool ScanOpKind(Scanner& s, Op* r) {
  std::string name;
  if (!ScanName(s, &name)) return false;
  ReadOpKindName(std::move(name), r);
  return true;
}
OpStateValue StateNamed(const std::string& name) {
  OpStateValue v;
  v.known = ParseOpState(name.c_str(), &v.value);
  if (!v.known) v.value = OpState::Count;
  return v;
}
bool ScanOpState(Scanner& s, OpStateValue* m) {
  std::string name;
  if (!ScanName(s, &name)) return false;
  *m = StateNamed(name);
  return true;
}
bool ScanReason(Scanner& s, DumpReasonValue* m) {
  std::string name;
  if (!ScanName(s, &name)) return false;
  *m = DumpReasonValue::Named(name);
  return true;
}

// The listed records of the summary (a record added to it without its line here does not
// compile: its ScanMember is missing).
#define NCCLWATCH_FOR_EACH_SUMMARY_RECORD(R)                    \
  R(Op, NCCLWATCH_FOR_EACH_OP_FIELD)                            \
  R(P2pCounters, NCCLWATCH_FOR_EACH_P2P_COUNTERS_FIELD)         \
  R(CommSummary, NCCLWATCH_FOR_EACH_COMM_SUMMARY_FIELD)         \
  R(InNcclThread, NCCLWATCH_FOR_EACH_IN_NCCL_FIELD)             \
  R(AnsweredRequest, NCCLWATCH_FOR_EACH_ANSWERED_REQUEST_FIELD) \
  R(UncaughtException, NCCLWATCH_FOR_EACH_EXCEPTION_FIELD)      \
  R(StopRecord, NCCLWATCH_FOR_EACH_STOP_FIELD)                  \
  R(Summary, NCCLWATCH_FOR_EACH_SUMMARY_FIELD)

// The members of each record, by key; false for a key not in its list or given twice.
#define NCCLWATCH_DECLARE_SCAN(Type, LIST)                                              \
  bool ScanMember(Scanner& s, std::string_view k, Type* r, uint64_t& seen);            \
  void ReadAbsent(Type* r, uint64_t seen);
NCCLWATCH_FOR_EACH_SUMMARY_RECORD(NCCLWATCH_DECLARE_SCAN)
#undef NCCLWATCH_DECLARE_SCAN

// After '{': the members, then '}'.
template <typename Record>
bool ScanObject(Scanner& s, Record* r) {
  uint64_t seen = 0;
  if (!s.Eat('}')) {
    for (;;) {
      std::string_view k;
      if (!s.Key(&k) || !ScanMember(s, k, r, seen)) return false;
      if (s.Eat(',')) continue;
      if (s.Eat('}')) break;
      return false;
    }
  }
  ReadAbsent(r, seen);
  return true;
}

// Array elements as dump_reader.cpp's ReadElement keeps them.
template <typename Record>
bool Keep(Record*) { return true; }
bool Keep(CommSummary* c) {
  if (c->id.empty()) return false;
  if (c->size > 0 && c->rank >= c->size) c->rank = kUnknownRank;
  return true;
}

template <typename Record>
bool ScanObjects(Scanner& s, std::vector<Record>* out) {
  if (s.Null()) return true;
  if (!s.Eat('[')) return false;
  std::vector<Record> v;
  if (!s.Eat(']')) {
    for (;;) {
      Record r;
      if (!s.Eat('{') || !ScanObject(s, &r)) return false;
      if (Keep(&r)) v.push_back(std::move(r));
      if (s.Eat(',')) continue;
      if (s.Eat(']')) break;
      return false;
    }
  }
  // The generic reader reserves one slot per element: as many here, never more (131,072
  // summaries stay in memory).
  if (v.capacity() != v.size()) v.shrink_to_fit();
  *out = std::move(v);
  return true;
}

template <typename OptionalRecord>  // std::optional or Boxed
bool ScanOptional(Scanner& s, OptionalRecord* out) {
  if (s.Null()) return true;
  return s.Eat('{') && ScanObject(s, &out->emplace());
}

// The length and first letter tell most keys apart before a comparison of their bytes.
inline bool KeyIs(std::string_view k, std::string_view key) {
  return k.size() == key.size() && !k.empty() && k[0] == key[0] && std::memcmp(k.data(), key.data(), k.size()) == 0;
}

#define NCCLWATCH_SCAN_MATCH(key_name, call) \
  if (KeyIs(k, key::key_name)) {              \
    if (seen & bit) return false;             \
    seen |= bit;                              \
    return call;                              \
  }                                           \
  bit <<= 1;
#define NCCLWATCH_SCAN_Text(kn, m) NCCLWATCH_SCAN_MATCH(kn, ScanText(s, &r->m))
#define NCCLWATCH_SCAN_TextOrNull(kn, m) NCCLWATCH_SCAN_MATCH(kn, ScanText(s, &r->m))
#define NCCLWATCH_SCAN_Int(kn, m) NCCLWATCH_SCAN_MATCH(kn, ScanInt(s, &r->m))
#define NCCLWATCH_SCAN_IntIfSet(kn, m) NCCLWATCH_SCAN_MATCH(kn, ScanInt(s, &r->m))
#define NCCLWATCH_SCAN_IntIfNonZero(kn, m) NCCLWATCH_SCAN_MATCH(kn, ScanInt(s, &r->m))
#define NCCLWATCH_SCAN_Int32(kn, m) NCCLWATCH_SCAN_MATCH(kn, ScanInt32(s, &r->m))
#define NCCLWATCH_SCAN_Rank(kn, m) NCCLWATCH_SCAN_MATCH(kn, ScanRank(s, &r->m))
#define NCCLWATCH_SCAN_Seq(kn, m) NCCLWATCH_SCAN_MATCH(kn, ScanSeq(s, &r->m))
#define NCCLWATCH_SCAN_Real(kn, m) NCCLWATCH_SCAN_MATCH(kn, ScanReal(s, &r->m))
#define NCCLWATCH_SCAN_RealIfSet(kn, m) NCCLWATCH_SCAN_MATCH(kn, ScanReal(s, &r->m))
#define NCCLWATCH_SCAN_Flag(kn, m) NCCLWATCH_SCAN_MATCH(kn, ScanFlag(s, &r->m))
#define NCCLWATCH_SCAN_Object(kn, m) NCCLWATCH_SCAN_MATCH(kn, ScanOptional(s, &r->m))
#define NCCLWATCH_SCAN_ObjectIfSet(kn, m) NCCLWATCH_SCAN_MATCH(kn, ScanOptional(s, &r->m))
#define NCCLWATCH_SCAN_Objects(kn, m) NCCLWATCH_SCAN_MATCH(kn, ScanObjects(s, &r->m))
#define NCCLWATCH_SCAN_Texts(kn, m) NCCLWATCH_SCAN_MATCH(kn, false) /* not in the summary */
#define NCCLWATCH_SCAN_KeyValues(kn, m) NCCLWATCH_SCAN_MATCH(kn, false) /* not in the summary */
#define NCCLWATCH_SCAN_OpKind(kn, m) NCCLWATCH_SCAN_MATCH(kn, ScanOpKind(s, r))
#define NCCLWATCH_SCAN_OpState(kn, m) NCCLWATCH_SCAN_MATCH(kn, ScanOpState(s, &r->m))
#define NCCLWATCH_SCAN_Reason(kn, m) NCCLWATCH_SCAN_MATCH(kn, ScanReason(s, &r->m))
#define NCCLWATCH_SCAN_Part(kn, m)
#define NCCLWATCH_SCAN_FIELD(type, member, def, key_name, how) NCCLWATCH_SCAN_##how(key_name, member)

// A key absent: what the generic getters give for it. The default, except for the
// vocabularies, which parse "".
#define NCCLWATCH_ABSENT_SET(what) \
  if (!(seen & bit)) what;         \
  bit <<= 1;
#define NCCLWATCH_ABSENT_PLAIN(m) bit <<= 1;
#define NCCLWATCH_ABSENT_Text(m) NCCLWATCH_ABSENT_PLAIN(m)
#define NCCLWATCH_ABSENT_TextOrNull(m) NCCLWATCH_ABSENT_PLAIN(m)
#define NCCLWATCH_ABSENT_Int(m) NCCLWATCH_ABSENT_PLAIN(m)
#define NCCLWATCH_ABSENT_IntIfSet(m) NCCLWATCH_ABSENT_PLAIN(m)
#define NCCLWATCH_ABSENT_IntIfNonZero(m) NCCLWATCH_ABSENT_PLAIN(m)
#define NCCLWATCH_ABSENT_Int32(m) NCCLWATCH_ABSENT_PLAIN(m)
#define NCCLWATCH_ABSENT_Rank(m) NCCLWATCH_ABSENT_PLAIN(m)
#define NCCLWATCH_ABSENT_Seq(m) NCCLWATCH_ABSENT_PLAIN(m)
#define NCCLWATCH_ABSENT_Real(m) NCCLWATCH_ABSENT_PLAIN(m)
#define NCCLWATCH_ABSENT_RealIfSet(m) NCCLWATCH_ABSENT_PLAIN(m)
#define NCCLWATCH_ABSENT_Flag(m) NCCLWATCH_ABSENT_PLAIN(m)
#define NCCLWATCH_ABSENT_Object(m) NCCLWATCH_ABSENT_PLAIN(m)
#define NCCLWATCH_ABSENT_ObjectIfSet(m) NCCLWATCH_ABSENT_PLAIN(m)
#define NCCLWATCH_ABSENT_Objects(m) NCCLWATCH_ABSENT_PLAIN(m)
#define NCCLWATCH_ABSENT_Texts(m) NCCLWATCH_ABSENT_PLAIN(m)
#define NCCLWATCH_ABSENT_KeyValues(m) NCCLWATCH_ABSENT_PLAIN(m)
#define NCCLWATCH_ABSENT_OpKind(m) NCCLWATCH_ABSENT_SET(ReadOpKindName(std::string(), r))
#define NCCLWATCH_ABSENT_OpState(m) NCCLWATCH_ABSENT_SET(r->m = StateNamed(std::string()))
#define NCCLWATCH_ABSENT_Reason(m) NCCLWATCH_ABSENT_SET(r->m = DumpReasonValue::Named(std::string()))
#define NCCLWATCH_ABSENT_Part(m)
#define NCCLWATCH_ABSENT_FIELD(type, member, def, key_name, how) NCCLWATCH_ABSENT_##how(member)

#define NCCLWATCH_DEFINE_SCAN(Type, LIST)                                     \
  bool ScanMember(Scanner& s, std::string_view k, Type* r, uint64_t& seen) { \
    uint64_t bit = 1;                                                         \
    LIST(NCCLWATCH_SCAN_FIELD)                                                \
    (void)bit;                                                                \
    return false; /* a key this reader does not know */                      \
  }                                                                           \
  void ReadAbsent(Type* r, uint64_t seen) {                                   \
    uint64_t bit = 1;                                                         \
    LIST(NCCLWATCH_ABSENT_FIELD)                                              \
    (void)bit;                                                                \
    (void)r;                                                                  \
    (void)seen;                                                               \
  }
NCCLWATCH_FOR_EACH_SUMMARY_RECORD(NCCLWATCH_DEFINE_SCAN)
#undef NCCLWATCH_DEFINE_SCAN

}  // namespace

namespace {

bool ScanHead(Scanner& s, int* version, Summary* summary) {
  try {
    if (!s.Eat('{')) return false;
    bool format = false, have_version = false, have_summary = false;
    int64_t v = 0;
    Summary read;
    for (;;) {
      std::string_view k;
      if (!s.Key(&k)) return false;
      if (k == key::kFormat && !format) {
        std::string name;
        if (!s.Str(&name) || name != kFormatName) return false;
        format = true;
      } else if (k == key::kVersion && !have_version) {
        if (!s.Integer(&v) || v < kOldestTraceVersion || v > kTraceVersion) return false;
        have_version = true;
      } else if (k == key::kSummary && !have_summary) {
        if (!s.Eat('{') || !ScanObject(s, &read)) return false;
        have_summary = true;
      } else {
        return false;  // another key before these three: the generic reader's
      }
      if (format && have_version && have_summary) break;  // the generic pass stops here too
      if (!s.Eat(',')) return false;
    }
    *version = static_cast<int>(v);
    *summary = std::move(read);
    return true;
  } catch (const std::bad_alloc&) {  // the generic reader gives the file up its own way
    return false;
  }
}

}  // namespace

bool ScanSummary(std::string_view bytes, int* version, Summary* summary, bool* more) {
  Scanner s{bytes.data(), bytes.data() + bytes.size()};
  bool read = ScanHead(s, version, summary);
  if (more) *more = !read && s.p == s.e;  // every step that runs out of bytes leaves the cursor at the end
  return read;
}

}  // namespace trace
}  // namespace ncclwatch
