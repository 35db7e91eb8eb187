// Version 2's compact ring (docs/trace-format.md, "The ring"). What repeats from one operation
// to the next (op, communicator, count, bytes, dtype, redop, root, peer, stream, thread, call
// site) is a *shape*: an operation object with those keys, written once among the rows, the
// first time it is used. A row is an array of integers: its shape's slot, then differences and
// plain values (RingColumn). About 25 bytes an operation instead of 360. Both sides hold at most
// kRingShapeSlots shapes, whatever the ring's size.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/json_writer.h"
#include "format/records.h"

namespace ncclwatch {
namespace trace {

constexpr size_t kRingColumnCount = static_cast<size_t>(RingColumn::Count);

class RingRowWriter {
 public:
  RingRowWriter();
  // Writes `op` into the open `rows` array: its shape first if new, then its row. Ring entries
  // carry no age_s or deadline_s (those belong to in-flight operations, in the summary).
  void Row(JsonWriter& w, const Op& op);

 private:
  struct Slot {
    std::string key;  // the shape it holds ("" free)
    uint64_t seq = 0, p2p_seq = 0, group = 0;  // of the shape's last row
  };
  std::unordered_map<std::string, int64_t> slot_of_;
  std::vector<Slot> slots_;
  int64_t shapes_defined_ = 0;
  uint64_t enqueue_ns_ = 0;  // of the last row
};

// Reader side, fed in file order: turns rows back into version 1's operation objects as they
// are read (so a window of the newest can be kept, like version 1's entries).
class RingRowReader {
 public:
  RingRowReader();
  // The ring's `columns` header (positions by name; unknown names ignored).
  void Columns(const nlohmann::json& names);
  // A shape object among the rows.
  void DefineShape(const nlohmann::json& shape);
  // A row: the operation object it stands for (missing values read as 0, a shape never
  // defined as empty fields).
  nlohmann::json Row(const nlohmann::json& row);

 private:
  struct Slot {
    nlohmann::json shape;  // null until defined: no allocation per unused slot
    uint64_t seq = 0, p2p_seq = 0, group = 0;
  };
  int at_[kRingColumnCount];
  std::vector<Slot> slots_;  // grows as shapes are defined, up to kRingShapeSlots
  int64_t shapes_defined_ = 0;
  uint64_t enqueue_ns_ = 0;
};

}  // namespace trace
}  // namespace ncclwatch
