// Lock-free intern table for call-site keys (internal to lib/stacks).
//
// Layout: a dense array of entries (ids are their indices, handed out in insertion order) and
// an open-addressing hash index with twice as many cells, so probes stay short even when the
// entries are all used. A cell is a 64-bit word: 0 = empty, else (hash tag << 32 | entry id + 1).
// An inserter first writes its key into a fresh entry, then claims an empty cell with a CAS
// (release); a reader that loads the cell (acquire) therefore sees the whole key, so lookups
// never wait and never see a key being written. Entries are immutable once written. When two
// threads insert the same new key at the same moment, one wins the cell and the other's entry
// is never published (an id lost to the race, refused by Get); both return the winner's id.
#pragma once

#include <atomic>
#include <cstdint>

#include "stacks.h"

namespace ncclwatch {
namespace stacks {
namespace detail {

// Plain data without initializers: the process-wide table lives in zero-initialized static
// storage and must need no constructor (it can be used before static constructors run).
struct CallsiteKey {
  uint16_t native_depth;
  uint16_t python_depth;
  // 1: the Python frames are not the calling thread's (it had none) but those of the thread
  // driving it (stacks.h, Callsite::driven_from).
  uint16_t python_driven;
  uintptr_t ips[kMaxNativeFrames];
  uintptr_t py_code[kMaxPythonFrames];  // PyCodeObject*, innermost first
  // Where each frame is in its code: the last instruction's offset (PyFrame_GetLasti, Python
  // 3.11+; turned into a line at dump time), else the line number. See PythonApi::LineOf.
  int32_t py_position[kMaxPythonFrames];

  uint64_t Hash() const;
  bool operator==(const CallsiteKey& other) const;  // compares the used frames only
};

struct CallsiteEntry {
  std::atomic<uint32_t> published;  // 1 once `key` is complete and indexed
  CallsiteKey key;
};

class CallsiteTable {
 public:
  // `entries` holds `capacity` entries, `cells` 2 * capacity cells; capacity is a power of two.
  // Both must be zero-initialized (static storage is). constexpr so that the process-wide table
  // is constant-initialized: usable from any constructor, whatever the static init order.
  constexpr CallsiteTable(CallsiteEntry* entries, std::atomic<uint64_t>* cells, uint32_t capacity)
      : entries_(entries), cells_(cells), capacity_(capacity), cell_mask_(2 * capacity - 1) {}

  struct InternResult {
    int32_t id;     // -1: the table is full
    bool inserted;  // true when this call added the key
  };
  // Returns the id of `key`, adding it when new. Lock-free; never waits.
  InternResult Intern(const CallsiteKey& key);
  // Copies the key of a published entry; false for ids not (yet) published or lost to a race.
  bool Get(int32_t id, CallsiteKey* out) const;
  // Number of ids handed out (a few may be unpublished: being inserted, or lost to a race).
  uint32_t Size() const;
  static constexpr size_t BytesFor(uint32_t capacity) {
    return capacity * sizeof(CallsiteEntry) + 2 * capacity * sizeof(std::atomic<uint64_t>);
  }

 private:
  CallsiteEntry* entries_;
  std::atomic<uint64_t>* cells_;
  uint32_t capacity_;
  uint32_t cell_mask_;
  std::atomic<uint32_t> next_id_{0};
  static constexpr uint32_t kNoEntry = 0xffffffffu;
};

}  // namespace detail
}  // namespace stacks
}  // namespace ncclwatch
