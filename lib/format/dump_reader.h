// The one reader of the trace format: the summary alone (streaming, stops after `summary`,
// reads the file in chunks) or the whole dump, into the typed records of records.h. Tolerant:
// a missing or mistyped key reads as absent; never throws on bad input: every problem becomes
// one line. Only regular files are read (a FIFO or device named like a dump is refused, never
// waited on).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "format/records.h"

namespace ncclwatch {
namespace trace {

enum class ReadDepth {
  kSummary,  // format, version, summary; stop parsing right after summary
  kFull,     // every top-level key
};

// A partially or fully parsed dump document: the top-level keys that were read completely.
struct DumpDocument {
  nlohmann::json top = nlohmann::json::object();
  bool not_an_object = false;  // the input does not start with a JSON object
  bool stopped_early = false;  // kSummary: parsing stopped after summary on purpose
  bool syntax_error = false;
  bool truncated = false;      // the syntax error is the end of the input
  bool too_large = false;      // reading stopped at a memory bound (string, array, bytes)
  uint64_t error_byte = 0;
  std::string error_text;      // short description of the syntax error
  std::string duplicate_key;   // a key given twice in one object (reading stopped there)
  uint64_t bytes_read = 0;     // bytes taken from the file (or buffer)
  uint64_t input_size = 0;     // size of the file (or buffer)
  std::string io_error;        // the file could not be opened or read
};

// Result of reading one dump. `usable` means the summary was read and understood; `problem`
// (one line, no file name) says what went wrong: why the dump is unusable, or, for a usable
// dump, what part could not be read.
struct ReadResult {
  bool usable = false;
  std::string problem;
  bool newer_version = false;  // not usable: written by a newer ncclwatch (the problem says so)
  uint64_t bytes_read = 0;
  uint64_t file_size = 0;
};

// Low level: parse into a document, keeping the completed top-level keys.
DumpDocument ParseDocumentFromFile(const std::string& path, ReadDepth depth);
// Memory per file, whatever its size in bytes: the values kept are estimated as they are read and
// reading stops (too_large) past the bound. Running out of memory below it gives the file up
// (a problem, never an exception).
constexpr uint64_t kMaxValueMemory = uint64_t{256} << 20;
DumpDocument ParseDocumentFromBuffer(std::string_view bytes, ReadDepth depth, uint64_t memory_bound = kMaxValueMemory);

// Checks format/version and converts. With kFull, also fills dump->detail (possibly partial,
// with dump->detail_problem set).
ReadResult InterpretDocument(const DumpDocument& doc, ReadDepth depth, LoadedDump* dump);

// The summary pass (kSummary) reads a dump ncclwatch wrote with ScanSummary (summary_scan.h)
// and any other the generic way; both give the same records and result.
ReadResult ReadDumpFile(const std::string& path, ReadDepth depth, LoadedDump* dump);
// Off: ReadDumpFile reads every summary the generic way (tests compare the two; not for use
// while files are being read).
void UseSummaryScan(bool on);
ReadResult ReadDumpBuffer(std::string_view bytes, ReadDepth depth, LoadedDump* dump);

// Conversions from JSON, tolerant of missing or mistyped keys (they read as absent).
Op OpFromJson(const nlohmann::json& j);
Summary SummaryFromJson(const nlohmann::json& j);
Detail DetailFromJson(const nlohmann::json& top);

}  // namespace trace
}  // namespace ncclwatch
