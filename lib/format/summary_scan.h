// The summary pass's fast path: format, version and summary read from a dump's first bytes
// straight into the records, without the generic JSON tree (at 131,072 ranks, building and
// converting that tree was most of the analysis). It takes only what it reads exactly as the
// generic reader (dump_reader.cpp) would: the dumps ncclwatch writes. On anything else (a key it
// does not know or given twice, a value out of range or of another type, an escape other than
// the simple ones, a byte outside ASCII, a summary not complete in `bytes`, ...) it returns
// false and the caller reads the file the generic way, which gives every problem its message.
#pragma once

#include <string_view>

#include "format/records.h"

namespace ncclwatch {
namespace trace {

// True: `version` and `summary` are what the generic summary pass reads from a file that starts
// with `bytes`, and that pass would have stopped after the summary, inside `bytes`, with no
// problem. False: `version` and `summary` are unchanged; *more (if given) says whether more of
// the file might make it true (the bytes ended before the summary did).
bool ScanSummary(std::string_view bytes, int* version, Summary* summary, bool* more = nullptr);

}  // namespace trace
}  // namespace ncclwatch
