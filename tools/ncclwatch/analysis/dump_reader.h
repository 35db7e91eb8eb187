// The analyzer reads dumps through the trace format's one reader (lib/format/dump_reader.h).
#pragma once

#include "format/dump_reader.h"
#include "model.h"

namespace ncclwatch {
namespace analysis {

using trace::DumpDocument;
using trace::InterpretDocument;
using trace::ParseDocumentFromBuffer;
using trace::ParseDocumentFromFile;
using trace::ReadDepth;
using trace::ReadDumpBuffer;
using trace::ReadDumpFile;
using trace::ReadResult;

}  // namespace analysis
}  // namespace ncclwatch
