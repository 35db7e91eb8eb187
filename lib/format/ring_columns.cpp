#include "format/ring_columns.h"

#include <cstring>

namespace ncclwatch {
namespace trace {

namespace k = key;
using C = RingColumn;
using json = nlohmann::json;

namespace {

constexpr size_t Col(C c) { return static_cast<size_t>(c); }

// Differences in two's complement: any int64 values round-trip.
int64_t Minus(int64_t a, uint64_t b) { return static_cast<int64_t>(static_cast<uint64_t>(a) - b); }
int64_t Plus(uint64_t a, int64_t b) { return static_cast<int64_t>(a + static_cast<uint64_t>(b)); }

int64_t StateIndex(const OpStateValue& s) { return s.known ? static_cast<int64_t>(s.value) : -1; }

// The shape's identity: its fields, separated by a byte no field holds.
std::string ShapeKey(const Op& op) {
  std::string key;
  auto add = [&](const std::string& s) {
    key += s;
    key += '\x1f';
  };
  add(op.OpName());
  add(op.comm);
  add(std::to_string(op.count));
  add(std::to_string(op.bytes));
  add(op.dtype);
  add(op.redop);
  add(std::to_string(op.root));
  add(std::to_string(op.peer));
  add(op.stream);
  add(std::to_string(op.tid));
  add(std::to_string(op.callsite));
  if (op.comm_rank >= 0) add(std::to_string(op.comm_rank));
  return key;
}

void WriteShape(JsonWriter& w, const Op& op) {
  w.BeginObject();
  w.Field(k::kOp, op.OpName());
  w.Field(k::kComm, op.comm);
  w.Field(k::kCount, op.count);
  w.Field(k::kBytes, op.bytes);
  w.Field(k::kDtype, op.dtype);
  w.Key(k::kRedop);
  if (op.redop.empty()) w.Null();
  else w.String(op.redop);
  w.Field(k::kRoot, op.root);
  w.Field(k::kPeer, op.peer);
  w.Field(k::kStream, op.stream);
  w.Field(k::kTid, op.tid);
  w.Field(k::kCallsite, op.callsite);
  if (op.comm_rank >= 0) w.Field(k::kCommRank, op.comm_rank);
  w.EndObject();
}

}  // namespace

RingRowWriter::RingRowWriter() : slots_(static_cast<size_t>(kRingShapeSlots)) {}

void RingRowWriter::Row(JsonWriter& w, const Op& op) {
  std::string key = ShapeKey(op);
  auto it = slot_of_.find(key);
  int64_t slot;
  if (it != slot_of_.end()) {
    slot = it->second;
  } else {  // a new shape: defined here, in the next slot (replacing the one there, if any)
    slot = shapes_defined_++ % kRingShapeSlots;
    Slot& s = slots_[static_cast<size_t>(slot)];
    if (!s.key.empty()) slot_of_.erase(s.key);
    s = Slot{key, 0, 0, 0};
    slot_of_.emplace(std::move(key), slot);
    WriteShape(w, op);
  }
  Slot& s = slots_[static_cast<size_t>(slot)];
  int64_t v[kRingColumnCount] = {};
  v[Col(C::Shape)] = slot;
  v[Col(C::Seq)] = Minus(op.seq, s.seq);
  v[Col(C::EnqueueNs)] = Minus(op.enqueue_ns, enqueue_ns_);
  v[Col(C::GpuReachedMinusEnqueueNs)] = Minus(op.gpu_reached_ns, static_cast<uint64_t>(op.enqueue_ns));
  v[Col(C::CompletedMinusEnqueueNs)] = Minus(op.completed_ns, static_cast<uint64_t>(op.enqueue_ns));
  v[Col(C::State)] = StateIndex(op.state);
  v[Col(C::P2pSeq)] = Minus(op.p2p_seq, s.p2p_seq);
  v[Col(C::Group)] = Minus(op.group, s.group);
  v[Col(C::Result)] = op.result;
  s.seq = static_cast<uint64_t>(op.seq);
  s.p2p_seq = static_cast<uint64_t>(op.p2p_seq);
  s.group = static_cast<uint64_t>(op.group);
  enqueue_ns_ = static_cast<uint64_t>(op.enqueue_ns);
  const bool has_gpu_ms = op.gpu_ms >= 0;
  size_t end = kRingColumnCount;
  if (!has_gpu_ms)  // trailing zeros are left out
    for (end = Col(C::GpuMs); end > 1 && v[end - 1] == 0;) --end;
  w.BeginArray();
  for (size_t c = 0; c < end; ++c) {
    if (c == Col(C::GpuMs)) w.Double(op.gpu_ms);  // a value, never a difference
    else w.Int(v[c]);
  }
  w.EndArray();
}

RingRowReader::RingRowReader() {
  for (size_t c = 0; c < kRingColumnCount; ++c) at_[c] = static_cast<int>(c);  // the writer's order
}

void RingRowReader::Columns(const json& names) {
  if (!names.is_array()) return;
  for (int& a : at_) a = -1;
  for (size_t i = 0; i < names.size(); ++i)
    for (size_t c = 0; c < kRingColumnCount; ++c)
      if (names[i].is_string() && names[i].get<std::string>() == kRingColumnNames[c]) at_[c] = static_cast<int>(i);
}

void RingRowReader::DefineShape(const json& shape) {
  // Slots are defined in order: the vector grows to kRingShapeSlots only in a ring that
  // defines that many shapes (a reader is made per dump, most of them use a few slots).
  size_t index = static_cast<size_t>(shapes_defined_++ % kRingShapeSlots);
  if (index == slots_.size()) slots_.emplace_back();
  Slot& s = slots_[index];
  s = Slot{};
  if (shape.is_object()) s.shape = shape;
}

json RingRowReader::Row(const json& row) {
  auto get = [&](C c) -> int64_t {
    int i = at_[Col(c)];
    if (i < 0 || static_cast<size_t>(i) >= row.size()) return 0;
    const json& x = row[static_cast<size_t>(i)];
    if (x.is_number_integer()) return x.get<int64_t>();
    if (x.is_number_unsigned()) return static_cast<int64_t>(x.get<uint64_t>());
    return 0;
  };
  int64_t slot_index = get(C::Shape);
  bool known = slot_index >= 0 && static_cast<size_t>(slot_index) < slots_.size();
  static Slot unknown_slot;
  Slot& s = known ? slots_[static_cast<size_t>(slot_index)] : unknown_slot;
  json o = s.shape;  // null (becomes an object below) or op, comm, count, bytes, dtype, redop, root, peer, stream, tid, callsite
  int64_t seq = Plus(s.seq, get(C::Seq));
  int64_t p2p_seq = Plus(s.p2p_seq, get(C::P2pSeq));
  int64_t enqueue = Plus(enqueue_ns_, get(C::EnqueueNs));
  int64_t group = Plus(s.group, get(C::Group));
  if (known) {
    s.seq = static_cast<uint64_t>(seq);
    s.p2p_seq = static_cast<uint64_t>(p2p_seq);
    s.group = static_cast<uint64_t>(group);
  }
  enqueue_ns_ = static_cast<uint64_t>(enqueue);
  o[k::kSeq] = seq;
  o[k::kP2pSeq] = p2p_seq;
  o[k::kGroup] = group;
  o[k::kEnqueueNs] = enqueue;
  o[k::kGpuReachedNs] = Plus(static_cast<uint64_t>(enqueue), get(C::GpuReachedMinusEnqueueNs));
  o[k::kCompletedNs] = Plus(static_cast<uint64_t>(enqueue), get(C::CompletedMinusEnqueueNs));
  int64_t state = get(C::State);
  o[k::kState] = state >= 0 && state < static_cast<int64_t>(OpState::Count) ? OpStateName(static_cast<OpState>(state))
                                                                            : "unknown";
  o[k::kResult] = get(C::Result);
  int gpu_at = at_[Col(C::GpuMs)];
  if (gpu_at >= 0 && static_cast<size_t>(gpu_at) < row.size() && row[static_cast<size_t>(gpu_at)].is_number_float())
    o[k::kGpuMs] = row[static_cast<size_t>(gpu_at)];
  return o;
}

}  // namespace trace
}  // namespace ncclwatch
