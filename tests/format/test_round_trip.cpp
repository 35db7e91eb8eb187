// Round trip: random records written by the one writer and read back by the one reader are
// equal, field by field. A field the writer forgets or the reader drops fails here.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <cmath>
#include <cstring>
#include <iterator>
#include <random>

#include "format/display.h"
#include "format/dump_reader.h"
#include "format/trace_writer.h"

using namespace ncclwatch::trace;

namespace {

class Random {
 public:
  explicit Random(uint64_t seed) : rng_(seed) {}
  uint64_t U64() { return rng_(); }
  int64_t Any() { return static_cast<int64_t>(rng_()); }
  int64_t Below(int64_t n) { return static_cast<int64_t>(rng_() % static_cast<uint64_t>(n)); }
  bool Coin() { return rng_() & 1; }
  int Rank() { return Coin() ? kUnknownRank : static_cast<int>(Below(kMaxRank)); }
  int Int32() { return static_cast<int>(static_cast<int32_t>(rng_())); }
  int64_t Seq() { return Below(kMaxSeq + 1); }
  double Finite() {
    double d;
    do {
      uint64_t bits = rng_();
      std::memcpy(&d, &bits, sizeof d);
    } while (!std::isfinite(d));
    return d;
  }
  double Optional() { return Coin() ? -1 : std::abs(Finite()); }  // < 0: absent
  // Valid UTF-8 with the characters that need escaping.
  std::string Text(size_t max = 12) {
    static const char* const kPieces[] = {"a", "Z", "0", " ", "\"", "\\", "\n", "\t", "\x01", "\x1f", "/",
                                          "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "{", "]", ",", ":"};
    std::string s;
    for (int64_t n = Below(static_cast<int64_t>(max) + 1); n > 0; --n) s += kPieces[Below(std::size(kPieces))];
    return s;
  }
  std::string NonEmpty() { return "x" + Text(); }
  template <typename T, typename F>
  std::vector<T> List(int64_t max, F make) {
    std::vector<T> v;
    for (int64_t n = Below(max + 1); n > 0; --n) v.push_back(make());
    return v;
  }

 private:
  std::mt19937_64 rng_;
};

Op RandomOp(Random& r, bool in_flight) {
  Op o;
  o.comm = r.Text(20);
  o.seq = r.Seq();
  o.p2p_seq = r.Seq();
  if (r.Below(4) > 0) o.SetKind(static_cast<OpKind>(r.Below(static_cast<int64_t>(OpKind::Count))));
  else o.op_name = "Future" + r.Text();  // a kind this reader does not know: kept as text
  o.count = r.Any();
  o.dtype = r.Text();
  o.bytes = r.Any();
  o.redop = r.Coin() ? "" : r.NonEmpty();
  o.root = r.Int32();
  o.peer = r.Int32();
  o.stream = r.Text();
  o.group = r.Any();
  o.tid = r.Any();
  o.enqueue_ns = r.Any();
  o.gpu_reached_ns = r.Any();
  o.completed_ns = r.Any();
  o.state = OpStateValue::Of(static_cast<OpState>(r.Below(static_cast<int64_t>(OpState::Count))));
  o.result = r.Any();
  o.callsite = r.Any();
  o.gpu_ms = r.Optional();
  if (in_flight) {
    o.age_s = r.Optional();
    o.deadline_s = r.Optional();
  }
  return o;
}

Stack RandomStack(Random& r) {
  Stack s;
  s.native = r.List<NativeFrame>(4, [&] {
    return NativeFrame{r.U64(), r.Text(30), r.Text(), r.U64() >> 1, r.Text(40), r.U64()};
  });
  s.python = r.List<PythonFrame>(4, [&] { return PythonFrame{r.Text(30), r.Any(), r.Text(), r.Coin()}; });
  return s;
}

// Objects keep no order and no duplicate keys once read: generate them sorted and unique.
KeyValues RandomKeyValues(Random& r) {
  std::map<std::string, std::string> m;
  for (int64_t n = r.Below(5); n > 0; --n) m[r.Text()] = r.Text();
  return KeyValues(m.begin(), m.end());
}

Document RandomDocument(Random& r) {
  Document d;
  Summary& s = d.summary;
  s.rank = r.Rank();
  s.local_rank = r.Int32();
  s.world_size = r.Rank();
  s.host = r.Text();
  s.pid = r.Any();
  s.dump_seq = r.Any();
  s.reason = DumpReasonValue::Named(r.Text());
  s.detail = r.Text(40);
  if (r.Coin()) s.answered = AnsweredRequest{r.Text(), r.Int32(), r.Text(), r.Text()};
  s.time_unix_ns = r.Any();
  s.time_mono_ns = r.Any();
  s.start_mono_ns = r.Any();
  s.nccl_version = r.Any();
  s.in_nccl = r.List<InNcclThread>(3, [&] { return InNcclThread{r.Any(), r.Text(), r.Finite()}; });
  s.comms = r.List<CommSummary>(4, [&] {
    CommSummary c;
    c.id = r.NonEmpty();  // a communicator without id is dropped by readers
    c.size = static_cast<int>(r.Below(kMaxRank));
    c.rank = c.size > 0 && r.Coin() ? static_cast<int>(r.Below(c.size)) : kUnknownRank;
    c.name = r.Text();
    c.state = r.Text();
    c.last_enqueued = r.Seq();
    c.last_gpu_reached = r.Seq();
    c.last_completed = r.Seq();
    c.p2p = r.List<P2pCounters>(3, [&] { return P2pCounters{r.Rank(), r.Seq(), r.Seq(), r.Seq(), r.Seq()}; });
    return c;
  });
  s.in_flight = r.List<Op>(3, [&] { return RandomOp(r, true); });
  if (r.Coin()) s.stalled = RandomOp(r, true);
  s.ring_overwritten = r.Any();
  s.process_uid = r.Text();
  s.job_instance = r.Text();
  s.start_unix_ns = r.Any();
  s.exit_status = r.Any();
  if (r.Coin()) s.failed = RandomOp(r, false);

  Detail& t = d.detail;
  t.light = r.Below(5) == 0;
  t.recoveries = r.List<Recovery>(3, [&] { return Recovery{r.Text(), r.Seq(), r.Text(), r.Finite(), r.Finite()}; });
  if (t.light) return d;
  t.process.exe = r.Text(30);
  t.process.cmdline = r.List<std::string>(4, [&] { return r.Text(); });
  t.process.cwd = r.Text();
  t.process.env = RandomKeyValues(r);
  t.process.cuda_driver_version = r.Any();
  t.process.ncclwatch_version = r.Text();
  t.process.config = RandomKeyValues(r);
  t.communicators = r.List<Communicator>(3, [&] {
    Communicator c;
    c.id = r.Text();
    c.size = r.Int32();
    c.rank = r.Int32();
    c.name = r.Text();
    c.state = r.Text();
    c.device = r.Any();
    c.kind = r.Text();
    c.parent = r.Text();
    c.color = r.Any();
    c.key = r.Any();
    c.blocking = r.Coin();
    c.created_mono_ns = r.Any();
    c.ended_mono_ns = r.Any();
    return c;
  });
  t.ring.capacity = r.Any();
  t.ring.recorded = r.Any();
  t.ring.overwritten = r.Any();
  t.ring.entries = r.List<Op>(6, [&] { return RandomOp(r, false); });
  t.callsites = r.List<Callsite>(3, [&] { return Callsite{r.Any(), RandomStack(r), r.Text(), r.Text()}; });
  t.threads = r.List<Thread>(3, [&] { return Thread{r.Any(), r.Text(), RandomStack(r), r.Text(), r.Coin()}; });
  return d;
}

}  // namespace

TEST_CASE("random documents written and read back are equal") {
#if defined(__SANITIZE_ADDRESS__)
  const uint64_t seeds = 1000;  // ten times slower under AddressSanitizer; the main build tries 3000
#else
  const uint64_t seeds = 3000;
#endif
  for (uint64_t seed = 1; seed <= seeds; ++seed) {
    Random r(seed);
    Document written = RandomDocument(r);
    std::string text = WriteDocument(written);
    LoadedDump loaded;
    ReadResult result = ReadDumpBuffer(text, ReadDepth::kFull, &loaded);
    INFO("seed " << seed << ": " << text.substr(0, 400));
    REQUIRE(result.usable);
    REQUIRE(result.problem.empty());
    REQUIRE(loaded.detail);
    CHECK(loaded.version == kTraceVersion);
    CHECK(loaded.summary == written.summary);
    CHECK(*loaded.detail == written.detail);

    // The summary pass reads the same summary and stops before the detail.
    LoadedDump summary_only;
    REQUIRE(ReadDumpBuffer(text, ReadDepth::kSummary, &summary_only).usable);
    CHECK(summary_only.summary == written.summary);
    CHECK(summary_only.detail == nullptr);
  }
}

// Each field of a listed record (records.h, "Field lists") changed alone survives write and
// read back: a field added to a list is checked here without a line of its own.
namespace {

template <typename T>
T Sample() {
  return T{};
}
template <>
Op Sample<Op>() {  // a state the reader reads back as it is (an absent one reads as `unknown`)
  Op o;
  o.SetKind(OpKind::Send);
  o.state = OpStateValue::Of(OpState::Enqueued);
  return o;
}
template <>
CommSummary Sample<CommSummary>() {  // readers drop a communicator without id
  CommSummary c;
  c.id = "c1";
  return c;
}

// A value other than the one there.
template <typename Record>
void Change(Record*, int* v) { *v = *v == 7 ? 8 : 7; }
template <typename Record>
void Change(Record*, int64_t* v) { *v = *v == 7 ? 8 : 7; }
template <typename Record>
void Change(Record*, double* v) { *v = *v == 2.5 ? 3.5 : 2.5; }
template <typename Record>
void Change(Record*, bool* v) { *v = !*v; }
template <typename Record>
void Change(Record*, std::string* v) { *v += "x"; }
template <typename Record>
void Change(Record*, OpStateValue* v) { *v = OpStateValue::Of(v->Is(OpState::GpuReached) ? OpState::Error : OpState::GpuReached); }
template <typename Record>
void Change(Record*, DumpReasonValue* v) { *v = DumpReasonValue::Of(v->Is(DumpReason::Stall) ? DumpReason::Exit : DumpReason::Stall); }
void Change(Op* o, OpKind*) { o->SetKind(o->op == OpKind::Recv ? OpKind::AllReduce : OpKind::Recv); }
template <typename Record, typename T>
void Change(Record*, std::optional<T>* v) { *v = Sample<T>(); }
template <typename Record, typename T>
void Change(Record*, Boxed<T>* v) { *v = Sample<T>(); }
template <typename Record, typename T>
void Change(Record*, std::vector<T>* v) { v->push_back(Sample<T>()); }
template <typename Record>
void Change(Record*, KeyValues* v) { v->emplace_back("k", "v"); }

// Writes a document holding `r` where `place` puts it and reads `r` back from there.
template <typename Record, typename Place>
Record WrittenAndRead(const Record& r, Place place) {
  Document d;
  place(d) = r;
  LoadedDump loaded;
  REQUIRE(ReadDumpBuffer(WriteDocument(d), ReadDepth::kFull, &loaded).usable);
  REQUIRE(loaded.detail);
  Document back{loaded.summary, *loaded.detail};
  return place(back);
}

#define NCCLWATCH_CHECK_FIELD(type, member, def, key_name, how)        \
  if (std::strcmp(#how, "Part") != 0) {                                \
    INFO("field " #member);                                             \
    auto changed = base;                                                \
    Change(&changed, &changed.member);                                  \
    CHECK(changed != base);                                             \
    CHECK(WrittenAndRead(changed, place) == changed);                   \
  }
#define NCCLWATCH_CHECK_EACH_FIELD(LIST, base_value, place_expr)  \
  {                                                               \
    const auto base = base_value;                                 \
    auto place = place_expr;                                      \
    CHECK(WrittenAndRead(base, place) == base);                   \
    LIST(NCCLWATCH_CHECK_FIELD)                                   \
  }

}  // namespace

TEST_CASE("each field of each field list survives write and read back") {
  auto summary = [](Document& d) -> Summary& { return d.summary; };
  auto stalled = [](Document& d) -> Op& { return d.summary.stalled ? *d.summary.stalled : d.summary.stalled.emplace(); };
  auto comm = [](Document& d) -> CommSummary& {
    if (d.summary.comms.empty()) d.summary.comms.push_back(Sample<CommSummary>());
    return d.summary.comms[0];
  };
  auto p2p = [comm](Document& d) -> P2pCounters& {
    CommSummary& c = comm(d);
    if (c.p2p.empty()) c.p2p.emplace_back();
    return c.p2p[0];
  };
  auto in_nccl = [](Document& d) -> InNcclThread& {
    if (d.summary.in_nccl.empty()) d.summary.in_nccl.emplace_back();
    return d.summary.in_nccl[0];
  };
  auto trigger = [](Document& d) -> AnsweredRequest& {
    return d.summary.answered ? *d.summary.answered : d.summary.answered.emplace();
  };
  auto exception = [](Document& d) -> UncaughtException& {
    return d.summary.exception ? *d.summary.exception : d.summary.exception.emplace();
  };
  auto stopped = [](Document& d) -> StopRecord& { return d.summary.stopped ? *d.summary.stopped : d.summary.stopped.emplace(); };
  auto python_frame = [](Document& d) -> PythonFrame& {
    if (d.detail.threads.empty()) d.detail.threads.emplace_back().stack.python.emplace_back();
    return d.detail.threads[0].stack.python[0];
  };
  auto communicator = [](Document& d) -> Communicator& {
    if (d.detail.communicators.empty()) d.detail.communicators.emplace_back();
    return d.detail.communicators[0];
  };
  auto recovery = [](Document& d) -> Recovery& {
    if (d.detail.recoveries.empty()) d.detail.recoveries.emplace_back();
    return d.detail.recoveries[0];
  };
  auto process = [](Document& d) -> Process& { return d.detail.process; };

  NCCLWATCH_CHECK_EACH_FIELD(NCCLWATCH_FOR_EACH_SUMMARY_FIELD, Summary{}, summary);
  NCCLWATCH_CHECK_EACH_FIELD(NCCLWATCH_FOR_EACH_OP_FIELD, Sample<Op>(), stalled);
  NCCLWATCH_CHECK_EACH_FIELD(NCCLWATCH_FOR_EACH_COMM_SUMMARY_FIELD, Sample<CommSummary>(), comm);
  NCCLWATCH_CHECK_EACH_FIELD(NCCLWATCH_FOR_EACH_P2P_COUNTERS_FIELD, P2pCounters{}, p2p);
  NCCLWATCH_CHECK_EACH_FIELD(NCCLWATCH_FOR_EACH_IN_NCCL_FIELD, InNcclThread{}, in_nccl);
  NCCLWATCH_CHECK_EACH_FIELD(NCCLWATCH_FOR_EACH_ANSWERED_REQUEST_FIELD, AnsweredRequest{}, trigger);
  NCCLWATCH_CHECK_EACH_FIELD(NCCLWATCH_FOR_EACH_EXCEPTION_FIELD, UncaughtException{}, exception);
  NCCLWATCH_CHECK_EACH_FIELD(NCCLWATCH_FOR_EACH_STOP_FIELD, StopRecord{}, stopped);
  NCCLWATCH_CHECK_EACH_FIELD(NCCLWATCH_FOR_EACH_PYTHON_FRAME_FIELD, PythonFrame{}, python_frame);
  NCCLWATCH_CHECK_EACH_FIELD(NCCLWATCH_FOR_EACH_COMMUNICATOR_FIELD, Communicator{}, communicator);
  NCCLWATCH_CHECK_EACH_FIELD(NCCLWATCH_FOR_EACH_RECOVERY_FIELD, Recovery{}, recovery);
  NCCLWATCH_CHECK_EACH_FIELD(NCCLWATCH_FOR_EACH_PROCESS_FIELD, Process{}, process);
}

TEST_CASE("the ring can be streamed: the same text as from a vector") {
  Random r(99);
  Document d = RandomDocument(r);
  d.detail.light = false;
  d.detail.ring.entries = r.List<Op>(50, [&] { return RandomOp(r, false); });
  size_t next = 0;
  std::string streamed = WriteDocument(d, [&](Op* op) {
    if (next >= d.detail.ring.entries.size()) return false;
    *op = d.detail.ring.entries[next++];
    return true;
  });
  CHECK(streamed == WriteDocument(d));
}

TEST_CASE("every vocabulary name parses back to its value") {
  for (size_t i = 0; i < static_cast<size_t>(OpState::Count); ++i) {
    OpState v = OpState::Count;
    REQUIRE(ParseOpState(kOpStateNames[i], &v));
    CHECK(static_cast<size_t>(v) == i);
  }
  for (size_t i = 0; i < static_cast<size_t>(DumpReason::Count); ++i) {
    DumpReason v = DumpReason::Count;
    REQUIRE(ParseDumpReason(DumpReasonName(static_cast<DumpReason>(i)), &v));
    CHECK(static_cast<size_t>(v) == i);
  }
  for (size_t i = 0; i < static_cast<size_t>(CommKind::Count); ++i) {
    CommKind v = CommKind::Count;
    REQUIRE(ParseCommKind(CommKindName(static_cast<CommKind>(i)), &v));
    CHECK(static_cast<size_t>(v) == i);
  }
  for (size_t i = 0; i < static_cast<size_t>(CommState::Count); ++i) {
    CommState v = CommState::Count;
    REQUIRE(ParseCommState(CommStateName(static_cast<CommState>(i)), &v));
    CHECK(static_cast<size_t>(v) == i);
  }
  for (size_t i = 0; i < static_cast<size_t>(OpKind::Count); ++i) {
    OpKind v = OpKind::Count;
    REQUIRE(ParseOpKind(OpKindName(static_cast<OpKind>(i)), &v));
    CHECK(static_cast<size_t>(v) == i);
  }
  CommState unknown;
  CHECK_FALSE(ParseCommState("resting", &unknown));
  CHECK_FALSE(ParseCommState(nullptr, &unknown));
}

#include <fstream>
#include <sstream>

#include "format/ring_columns.h"

TEST_CASE("the documented version 2 ring example is what the writer writes and reads back as documented") {
  std::ifstream f(std::string(NCCLWATCH_SOURCE_DIR) + "/docs/trace-format.md");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string doc = ss.str();
  size_t start = doc.find("```json\n\"ring\":");
  REQUIRE(start != std::string::npos);
  start += 8;
  const std::string example = "{" + doc.substr(start, doc.find("```", start) - start) + "}";
  const nlohmann::json documented = nlohmann::json::parse(example)["ring"];

  Document d;
  d.detail.ring.capacity = 4096;
  d.detail.ring.recorded = 3;
  for (int i = 0; i < 3; ++i) {
    Op o;
    o.comm = "00000000000abcde";
    o.seq = i + 1;
    o.SetKind(OpKind::AllReduce);
    o.count = 1024;
    o.dtype = "float32";
    o.bytes = 4096;
    o.redop = "sum";
    o.stream = "0x7f00";
    o.tid = 4242;
    o.callsite = 7;
    o.enqueue_ns = 5000000 + 500000 * i;
    o.gpu_reached_ns = o.enqueue_ns + 20000;
    o.completed_ns = i < 2 ? o.enqueue_ns + 150000 : 0;
    o.state = OpStateValue::Of(i < 2 ? OpState::Completed : OpState::GpuReached);
    d.detail.ring.entries.push_back(o);
  }
  const std::string text = WriteDocument(d);
  CHECK(nlohmann::json::parse(text)["ring"] == documented);
  LoadedDump loaded;
  REQUIRE(ReadDumpBuffer(text, ReadDepth::kFull, &loaded).usable);
  REQUIRE(loaded.detail);
  CHECK(loaded.detail->ring.entries == d.detail.ring.entries);
}

TEST_CASE("a ring with more shapes than slots round-trips, and the reader keeps the newest window") {
  Document d;
  d.detail.ring.capacity = 1 << 17;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 3 * static_cast<int>(kRingShapeSlots) + 17; ++i) {
    Op o;
    o.comm = "c" + std::to_string(rng() % 3);
    o.seq = i;
    o.SetKind(OpKind::AllGather);
    o.count = static_cast<int64_t>(rng() % 100000);  // mostly new shapes: slots are reused
    o.bytes = o.count * 2;
    o.dtype = "bfloat16";
    o.stream = "0x1";
    o.enqueue_ns = 1000 * i;
    o.state = OpStateValue::Of(OpState::Completed);
    o.gpu_ms = i % 5 == 0 ? 0.25 * i : -1;
    d.detail.ring.entries.push_back(o);
  }
  LoadedDump loaded;
  REQUIRE(ReadDumpBuffer(WriteDocument(d), ReadDepth::kFull, &loaded).usable);
  REQUIRE(loaded.detail);
  CHECK(loaded.detail->ring.entries == d.detail.ring.entries);
}

TEST_CASE("NCCL version codes read as people write them") {
  CHECK(NcclVersionText(22800) == "2.28.0");
  CHECK(NcclVersionText(21805) == "2.18.5");
  CHECK(NcclVersionText(20900) == "2.9.0");
  CHECK(NcclVersionText(2804) == "2.8.4");  // before 2.9: major*1000 + minor*100 + patch
  CHECK(NcclVersionText(0) == "?");
}
