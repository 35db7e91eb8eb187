// The one writer of the trace format (docs/trace-format.md): the library's dumps, the test
// generator and the test builders all write through it. Streaming: the text is produced in
// document order, summary first, so the summary stays readable alone (readers stop after it).
#pragma once

#include <functional>
#include <map>
#include <utility>
#include <vector>
#include <string>

#include "format/json_writer.h"
#include "format/records.h"

namespace ncclwatch {
namespace trace {

// Produces ring entries one at a time (oldest first) into *op; false when there are no more.
// Lets a writer of a big ring convert one entry at a time instead of holding them all.
using OpSource = std::function<bool(Op* op)>;

// Takes the text written so far (and clears it); called whenever it passes kSinkChunkBytes and
// at the end. False: the sink failed, stop writing.
using TextSink = std::function<bool(std::string* text)>;
constexpr size_t kSinkChunkBytes = 64 * 1024;

// The whole dump (one line, newline-terminated), streamed to `sink` in pieces of about
// kSinkChunkBytes: whatever the ring's size, the writer holds one piece. With `ring_entries`,
// the ring's entries come from it and doc.detail.ring.entries is not read. False if the sink
// failed.
bool WriteDocument(const Document& doc, const OpSource& ring_entries, const TextSink& sink);
// The same, as one string.
std::string WriteDocument(const Document& doc, const OpSource& ring_entries = nullptr);

// Pieces, for writers of other documents that embed them (tests, the request file).
void WriteOp(JsonWriter& w, const Op& op);
void WriteSummary(JsonWriter& w, const Summary& s);
void WriteStack(JsonWriter& w, const Stack& s);  // frames with their module path and build id

// Version 2's `modules`: each (path, build id) a dump's stacks name, once; frames refer to it
// by index.
class ModuleTable {
 public:
  void Add(const std::string& path, const std::string& build_id) {
    auto key = std::make_pair(path, build_id);
    if (index_.emplace(key, static_cast<int64_t>(list_.size())).second) list_.push_back(key);
  }
  int64_t IndexOf(const std::string& path, const std::string& build_id) const {
    auto it = index_.find(std::make_pair(path, build_id));
    return it == index_.end() ? -1 : it->second;
  }
  const std::vector<std::pair<std::string, std::string>>& list() const { return list_; }

 private:
  std::map<std::pair<std::string, std::string>, int64_t> index_;
  std::vector<std::pair<std::string, std::string>> list_;
};
void WriteStack(JsonWriter& w, const Stack& s, const ModuleTable* modules);

}  // namespace trace
}  // namespace ncclwatch
