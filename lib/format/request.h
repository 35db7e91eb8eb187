// The job-wide dump request (docs/trace-format.md): one small JSON file in the dump directory,
// `dump-request.json`, that makes every rank of a job dump. Written by a rank that stalled or
// saw an abort, and by `ncclwatch dump`; read by every rank's watchdog. A dump that answers one
// records it as summary.answered (AnsweredRequest, format/records.h; JSON key `trigger`).
#pragma once

#include <cstdint>
#include <string>

namespace ncclwatch {
namespace trace {

struct DumpRequest {
  std::string request;      // unique id of this request ("<host>-<pid>-<n>")
  int origin_rank = -1;     // the rank that asked; -1 for `ncclwatch dump`
  std::string origin_host;
  std::string reason;       // DumpReasonName() of what made it ask (stall, abort, on_demand)
  std::string job_instance;  // the asker's job instance ("" unknown): other jobs ignore it
  int64_t time_unix_ns = 0;  // when it was written: processes started later ignore it
};

std::string WriteRequest(const DumpRequest& r);
// False when the text is not a request (being replaced, foreign, no id).
bool ParseRequest(const std::string& text, DumpRequest* out);

// Whether a request (or a dump's record of the one it answers, AnsweredRequest) was written by
// `ncclwatch dump`, which writes origin rank -1 with reason on_demand. A rank that has no rank
// yet (inside its first ncclCommInitRank) also writes -1, but with its own reason.
bool AskedByCommand(int origin_rank, const std::string& reason);

}  // namespace trace
}  // namespace ncclwatch
