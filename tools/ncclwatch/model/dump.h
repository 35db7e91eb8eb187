// The analyzer's view of one dump: the trace format's typed records (lib/format/records.h),
// by their own names, plus where the dump came from and how it relates to the others.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "format/records.h"

namespace ncclwatch {
namespace analysis {

struct RankShare;

// Below this, the framework did not abort because of a hang: an ncclCommAbort with only younger
// operations in flight is a shutdown (frameworks tear down with abort), not a timeout.
constexpr double kFrameworkTimeoutMinS = 1.0;

struct Dump : trace::LoadedDump {
  // The directory it was read from, shared by every dump of a set (131,072 copies of one path
  // cost 17 MB); null: a dump built in memory, never read again.
  std::shared_ptr<const std::string> dir;
  std::string file_name;
  bool OnDisk() const { return dir != nullptr; }
  std::string Path() const { return dir ? *dir + "/" + file_name : std::string(); }
  // Reasons of the same process's later dumps that followed this one as part of a teardown
  // (a SIGABRT after the framework's ncclCommAbort, an exit after an NCCL error): this dump,
  // the state when the teardown began, is the evidence.
  std::vector<std::string> then;
  // An exit record whose process aborted its communicators on its way out (a `finally:` with
  // dist.destroy_process_group()) with nothing waiting: the exit is the evidence, the abort
  // part of it.
  bool aborted_before_exit = false;
  // Its process aborted its communicators while it waited in a hang (the framework's watchdog:
  // PyTorch's ncclCommAbort) and then ended (exit, a signal, or without a word): the framework
  // ended it after the wait. It is no culprit on its own account, and its end no crash. How it
  // ended: the reason of its last dump, the exit status, the signal's detail as that dump says.
  struct FrameworkEnding {
    std::string reason;
    int64_t exit_status = -1;
    std::string detail;
  };
  trace::Boxed<FrameworkEnding> framework_ending;
  int attempt = 0;  // the attempt of the job it belongs to (DumpSet::attempts)
  // Its process answered no SIGTERM of the job's teardown that every other rank answered, and
  // this, its latest dump, is older than that teardown: the process was gone before it (killed
  // without a word, no black box); this dump is not what it did last.
  bool gone_before_teardown = false;
  std::string last_reason;        // of its process's latest dump (this one or one of `then`)
  int64_t last_time_unix_ns = 0;
  int64_t gone_gap_s = 0;  // how much older than the teardown
  // A recovery dump's list of stalls that completed (kept apart from `detail`, which passes
  // over every rank drop and read again).
  std::vector<trace::Recovery> recoveries;

  // Where it comes among its process's dumps: by dump_seq. A stand-in its host wrote while the
  // process was stopped carries the number of the process's next own dump, and comes first.
  std::pair<int64_t, int> WriteOrder() const {
    return {summary.dump_seq, summary.reason.Is(trace::DumpReason::Stopped) ? 0 : 1};
  }

  // Set when its process drives several ranks (several devices) and this dump is one rank's
  // share of the process's file (model/rank_split.h): summary.rank is that rank.
  std::shared_ptr<const RankShare> share;
  bool SharedProcess() const { return share != nullptr; }

  // Unique in the job: process_uid, else host and pid (older dumps); with the rank where the
  // process drives several (each rank's dumps are a history of their own).
  std::string ProcessKey() const {
    std::string key = summary.process_uid.empty() ? "h:" + summary.host + ":" + std::to_string(summary.pid)
                                                  : "u:" + summary.process_uid;
    return share ? key + "#" + std::to_string(summary.rank) : key;
  }
  // The process alone, whichever of its ranks.
  std::string ProcessOnlyKey() const {
    return summary.process_uid.empty() ? "h:" + summary.host + ":" + std::to_string(summary.pid)
                                       : "u:" + summary.process_uid;
  }
};

}  // namespace analysis
}  // namespace ncclwatch
