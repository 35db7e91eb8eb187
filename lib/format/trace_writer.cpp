#include "format/trace_writer.h"

#include "format/ring_columns.h"

#include <algorithm>

namespace ncclwatch {
namespace trace {

namespace k = key;

namespace {

// `key`: [ {fields(item)}, ... ]
template <typename Items, typename Fields>
void ObjectArray(JsonWriter& w, const char* key, const Items& items, Fields&& fields) {
  w.Key(key).BeginArray();
  for (const auto& item : items) {
    w.BeginObject();
    fields(item);
    w.EndObject();
  }
  w.EndArray();
}

// The writer of each listed record (records.h, "Field lists"): its fields in list order.
#define NCCLWATCH_DECLARE_FIELDS_WRITER(Type, LIST) void WriteFields(JsonWriter& w, const Type& r);
NCCLWATCH_FOR_EACH_LISTED_RECORD(NCCLWATCH_DECLARE_FIELDS_WRITER)
#undef NCCLWATCH_DECLARE_FIELDS_WRITER

template <typename Record>
void WriteObject(JsonWriter& w, const Record& r) {
  w.BeginObject();
  WriteFields(w, r);
  w.EndObject();
}

template <typename OptionalRecord>  // std::optional or Boxed
void WriteObjectOrNull(JsonWriter& w, const char* key, const OptionalRecord& r) {
  w.Key(key);
  if (r) WriteObject(w, *r);
  else w.Null();
}

template <typename OptionalRecord>
void WriteObjectIfSet(JsonWriter& w, const char* key, const OptionalRecord& r) {
  if (!r) return;
  w.Key(key);
  WriteObject(w, *r);
}

template <typename Record>
void WriteObjects(JsonWriter& w, const char* key, const std::vector<Record>& items) {
  w.Key(key).BeginArray();
  for (const auto& item : items) WriteObject(w, item);
  w.EndArray();
}

void WriteTextOrNull(JsonWriter& w, const char* key, const std::string& s) {
  w.Key(key);
  if (s.empty()) w.Null();
  else w.String(s);
}

void WriteTexts(JsonWriter& w, const char* key, const std::vector<std::string>& texts) {
  w.Key(key).BeginArray();
  for (const auto& text : texts) w.String(text);
  w.EndArray();
}

void WriteKeyValues(JsonWriter& w, const char* key, const KeyValues& kvs) {
  w.Key(key).BeginObject();
  for (const auto& kv : kvs) w.Field(kv.first, kv.second);
  w.EndObject();
}

// How each `how` of a field list is written (w: the writer, k: the key, r: the record).
#define NCCLWATCH_FIELD_WRITE_Text(w, k, r, m) w.Field(k, r.m)
#define NCCLWATCH_FIELD_WRITE_TextOrNull(w, k, r, m) WriteTextOrNull(w, k, r.m)
#define NCCLWATCH_FIELD_WRITE_Int(w, k, r, m) w.Field(k, r.m)
#define NCCLWATCH_FIELD_WRITE_Int32(w, k, r, m) w.Field(k, r.m)
#define NCCLWATCH_FIELD_WRITE_Rank(w, k, r, m) w.Field(k, r.m)
#define NCCLWATCH_FIELD_WRITE_Seq(w, k, r, m) w.Field(k, r.m)
#define NCCLWATCH_FIELD_WRITE_Real(w, k, r, m) w.Field(k, r.m)
#define NCCLWATCH_FIELD_WRITE_Flag(w, k, r, m) w.Field(k, r.m)
#define NCCLWATCH_FIELD_WRITE_RealIfSet(w, k, r, m) if (r.m >= 0) w.Field(k, r.m)
#define NCCLWATCH_FIELD_WRITE_IntIfSet(w, k, r, m) if (r.m >= 0) w.Field(k, r.m)
#define NCCLWATCH_FIELD_WRITE_IntIfNonZero(w, k, r, m) if (r.m != 0) w.Field(k, r.m)
#define NCCLWATCH_FIELD_WRITE_Object(w, k, r, m) WriteObjectOrNull(w, k, r.m)
#define NCCLWATCH_FIELD_WRITE_ObjectIfSet(w, k, r, m) WriteObjectIfSet(w, k, r.m)
#define NCCLWATCH_FIELD_WRITE_Objects(w, k, r, m) WriteObjects(w, k, r.m)
#define NCCLWATCH_FIELD_WRITE_Texts(w, k, r, m) WriteTexts(w, k, r.m)
#define NCCLWATCH_FIELD_WRITE_KeyValues(w, k, r, m) WriteKeyValues(w, k, r.m)
#define NCCLWATCH_FIELD_WRITE_OpKind(w, k, r, m) w.Field(k, r.OpName())
#define NCCLWATCH_FIELD_WRITE_OpState(w, k, r, m) w.Field(k, r.m.known ? OpStateName(r.m.value) : "unknown")
#define NCCLWATCH_FIELD_WRITE_Reason(w, k, r, m) w.Field(k, r.m.Name())
#define NCCLWATCH_FIELD_WRITE_Part(w, k, r, m)

#define NCCLWATCH_WRITE_FIELD(type, member, def, key_name, how) NCCLWATCH_FIELD_WRITE_##how(w, k::key_name, r, member);
#define NCCLWATCH_DEFINE_FIELDS_WRITER(Type, LIST) \
  void WriteFields(JsonWriter& w, const Type& r) { LIST(NCCLWATCH_WRITE_FIELD) }
NCCLWATCH_FOR_EACH_LISTED_RECORD(NCCLWATCH_DEFINE_FIELDS_WRITER)
#undef NCCLWATCH_DEFINE_FIELDS_WRITER
#undef NCCLWATCH_WRITE_FIELD

}  // namespace

void WriteOp(JsonWriter& w, const Op& o) { WriteObject(w, o); }

void WriteStack(JsonWriter& w, const Stack& s) { WriteStack(w, s, nullptr); }

void WriteStack(JsonWriter& w, const Stack& s, const ModuleTable* modules) {
  ObjectArray(w, k::kFrames, s.native, [&](const NativeFrame& f) {
    w.Key(k::kIp).Hex(f.ip);
    if (modules) {  // version 2: the module's index in `modules` (path and build id, once)
      w.Field(k::kModule, modules->IndexOf(f.module, f.build_id));
    } else {
      w.Field(k::kModule, f.module);
    }
    w.Field(k::kSymbol, f.symbol);
    w.Field(k::kOffset, f.offset);
    if (!modules) w.Field(k::kBuildId, f.build_id);
    w.Key(k::kModuleOffset).Hex(f.module_offset);
    if (f.interrupted) w.Field(k::kInterrupted, true);
  });
  WriteObjects(w, k::kPython, s.python);
}

void WriteSummary(JsonWriter& w, const Summary& s) { WriteObject(w, s); }

namespace {

// `own`: threads only (null for call sites).
void WriteThreadLike(JsonWriter& w, const char* id_key, int64_t id, const std::string* name, const Stack& stack,
                     const std::string& note, const bool* own, const ModuleTable& modules,
                     const std::string& python_driven_from = std::string()) {
  w.BeginObject();
  w.Field(id_key, id);
  if (name) w.Field(k::kName, *name);
  WriteStack(w, stack, &modules);
  w.Field(k::kNote, note);
  if (own) w.Field(k::kOwn, *own);
  if (!python_driven_from.empty()) w.Field(k::kPythonDrivenFrom, python_driven_from);
  w.EndObject();
}

}  // namespace

bool WriteDocument(const Document& doc, const OpSource& ring_entries, const TextSink& sink) {
  std::string out;
  out.reserve(kSinkChunkBytes + 4096);
  bool sink_ok = true;
  // Hands the text over once a piece is full: memory stays one piece whatever the ring holds.
  auto piece_done = [&] {
    if (sink_ok && out.size() >= kSinkChunkBytes) sink_ok = sink(&out);
    return sink_ok;
  };
  const Detail& d = doc.detail;
  JsonWriter w(&out);
  w.BeginObject();
  w.Field(k::kFormat, kFormatName);
  w.Field(k::kVersion, kTraceVersion);
  w.Key(k::kSummary);
  WriteSummary(w, doc.summary);
  if (!d.light) {
    w.Key(k::kProcess);
    WriteObject(w, d.process);
    w.Key(k::kCommunicators).BeginArray();
    for (const auto& c : d.communicators) {
      WriteObject(w, c);
      if (!piece_done()) return false;
    }
    w.EndArray();
    w.Key(k::kRing).BeginObject();
    w.Field(k::kCapacity, d.ring.capacity);
    w.Field(k::kRecorded, d.ring.recorded);
    w.Field(k::kOverwritten, d.ring.overwritten);
    w.Key(k::kColumns).BeginArray();
    for (const char* c : kRingColumnNames) w.String(c);
    w.EndArray();
    w.Key(k::kRows).BeginArray();
    RingRowWriter rows;
    if (ring_entries) {
      Op op;
      while (ring_entries(&op)) {
        rows.Row(w, op);
        if (!piece_done()) return false;
      }
    } else {
      for (const auto& op : d.ring.entries) {
        rows.Row(w, op);
        if (!piece_done()) return false;
      }
    }
    w.EndArray();
    w.EndObject();
    // Every module the stacks name, once (a module path and build id per frame were half of
    // a stack's bytes).
    ModuleTable modules;
    for (const auto& c : d.callsites)
      for (const auto& f : c.stack.native) modules.Add(f.module, f.build_id);
    for (const auto& t : d.threads)
      for (const auto& f : t.stack.native) modules.Add(f.module, f.build_id);
    w.Key(k::kModules).BeginArray();
    for (const auto& m : modules.list()) {
      w.BeginObject();
      w.Field(k::kPath, m.first);
      w.Field(k::kBuildId, m.second);
      w.EndObject();
    }
    w.EndArray();
    w.Key(k::kCallsites).BeginArray();
    for (const auto& c : d.callsites) {
      WriteThreadLike(w, k::kId, c.id, nullptr, c.stack, c.note, nullptr, modules, c.python_driven_from);
      if (!piece_done()) return false;
    }
    w.EndArray();
    w.Key(k::kThreads).BeginArray();
    for (const auto& t : d.threads) {
      WriteThreadLike(w, k::kTid, t.tid, &t.name, t.stack, t.note, &t.own, modules);
      if (!piece_done()) return false;
    }
    w.EndArray();
  }
  WriteObjects(w, k::kRecoveries, d.recoveries);
  w.EndObject();
  out += '\n';
  return sink_ok && sink(&out);
}

std::string WriteDocument(const Document& doc, const OpSource& ring_entries) {
  std::string all;
  WriteDocument(doc, ring_entries, [&](std::string* piece) {
    all += *piece;
    piece->clear();
    return true;
  });
  return all;
}

}  // namespace trace
}  // namespace ncclwatch
