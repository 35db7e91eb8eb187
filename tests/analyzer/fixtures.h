// Helpers for the analyzer tests: small hand-made dumps built as the trace format's typed
// records and written through its one writer, and running the command.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rules/attribution.h"
#include "model/dump_set.h"
#include "format/records.h"
#include "ncclwatch/trace_format.h"
#include "temp_dir.h"  // TempDir, shared with the other C++ tests

namespace ncclwatch {
namespace testing {

// Keys stay in insertion order, as the writer lays them out (summary before the ring).
using json = nlohmann::ordered_json;
using trace::Document;

std::string ReadFile(const std::string& path);

// Minimal operation / communicator / dump records; tests change fields as they need.
trace::Op Op(const std::string& comm, int64_t seq, const char* op, const char* state, double age_s = 600);
trace::Op P2pOp(const std::string& comm, const char* op, int peer, int64_t p2p_seq, const char* state);
trace::CommSummary Comm(const std::string& id, int size, int rank, int64_t enqueued, int64_t reached,
                        int64_t completed);
Document Dump(int rank, int world_size, std::vector<trace::CommSummary> comms, std::vector<trace::Op> in_flight = {},
              const char* reason = "peer_request");
// The dump as the writer writes it, as text and as a JSON object (for tests that break it).
std::string Text(const Document& dump);
json AsJson(const Document& dump);
std::string DumpFileName(const Document& dump);

// Writes the dumps into a TempDir, loads and attributes them.
analysis::Report Analyze(const TempDir& dir, const std::vector<Document>& dumps,
                         const analysis::LoadOptions& options = {});

struct CommandResult {
  int status = -1;
  std::string out;
  std::string err;
};
// `ncclwatch ARGS`; with memory_kib, under that cap on its address space (ulimit -v).
CommandResult RunCommand(const std::string& args, long memory_kib = 0);

}  // namespace testing
}  // namespace ncclwatch
