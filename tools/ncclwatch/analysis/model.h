// The analyzer's view of one dump: the trace format's typed records (lib/format/records.h),
// under the names the analysis code uses, plus where the dump came from.
#pragma once

#include <string>
#include <vector>

#include "format/records.h"

namespace ncclwatch {
namespace analysis {

using trace::kMaxRank;
using trace::kMaxSeq;
using trace::kUnknownRank;

using OpStateValue = trace::OpStateValue;
using OpRecord = trace::Op;
using P2pCounters = trace::P2pCounters;
using CommSummary = trace::CommSummary;
using InNcclThread = trace::InNcclThread;
using DumpTrigger = trace::Trigger;
using DumpSummary = trace::Summary;
using NativeFrame = trace::NativeFrame;
using PythonFrame = trace::PythonFrame;
using Stack = trace::Stack;
using Callsite = trace::Callsite;
using ThreadStack = trace::Thread;
using CommunicatorInfo = trace::Communicator;
using RingInfo = trace::Ring;
using Recovery = trace::Recovery;
using DumpDetail = trace::Detail;

struct Dump : trace::LoadedDump {
  std::string path;
  std::string file_name;
  // Reasons of the same process's later dumps that followed this one as part of a teardown
  // (a SIGABRT after the framework's ncclCommAbort, an exit after an NCCL error): this dump,
  // the state when the teardown began, is the evidence.
  std::vector<std::string> then;
  int attempt = 0;  // the attempt of the job it belongs to (DumpSet::attempts)

  // Unique in the job: process_uid, else host and pid (older dumps).
  std::string ProcessKey() const {
    return summary.process_uid.empty() ? "h:" + summary.host + ":" + std::to_string(summary.pid)
                                       : "u:" + summary.process_uid;
  }
};

}  // namespace analysis
}  // namespace ncclwatch
