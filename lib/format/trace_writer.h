// The one writer of the trace format (docs/trace-format.md): the library's dumps, the test
// generator and the test builders all write through it. Streaming: the text is produced in
// document order, summary first, so the summary stays readable alone (readers stop after it).
#pragma once

#include <functional>
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
void WriteStack(JsonWriter& w, const Stack& s);

}  // namespace trace
}  // namespace ncclwatch
