// A directory of dumps: every file's summary read in parallel, bad files reported one line
// each, and one dump selected per global rank (the latest) as the evidence for verdicts.
#pragma once

#include <cstdint>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "format/file_name.h"
#include "model/dump.h"

namespace ncclwatch {
namespace analysis {

// A file (or an option) the set could not use as it is, as data: render/ words it.
enum class ProblemKind : uint8_t {
  kUnreadable,         // the reader could not use it (message): skipped
  kReader,             // the reader's remark about a file it could use (message)
  kRankUnknown,        // no global rank (summary.rank -1, no full-size communicator): skipped
  kNoSuchAttempt,      // --attempt `number` of `count` attempts: the latest is used
  kSameDumpSeq,        // the same process and dump_seq as `other`: skipped
  kSameTimeClaim,      // claims rank `number` at the same time as `other`: skipped
  kLaterClaim,         // another process claims rank `number` with a later dump (`other`)
  kDetailsUnreadable,  // its details could not be read (message): not used
  kNewerVersion,       // written by a newer ncclwatch (message), as are `count` files in all: skipped
};

struct Problem {
  std::string file;  // file name (no directory), or the option
  ProblemKind kind = ProblemKind::kReader;
  std::string message;  // the trace reader's own words, where it has some
  std::string other;    // the other file
  int64_t number = 0, count = 0;
};

// Summaries already read, kept between loads of one directory (`ncclwatch run` loads the dump
// directory again as a job's dumps come in): a file whose name and inode are unchanged is not
// read again. Holds a copy of every summary of the directory.
class SummaryCache {
 public:
  SummaryCache();
  ~SummaryCache();
  size_t files() const { return entries_.size(); }

 private:
  friend class DumpSet;
  struct Entry;
  std::unordered_map<std::string, std::unique_ptr<Entry>> entries_;  // by file name
};

struct LoadOptions {
  unsigned threads = 0;  // 0: std::thread::hardware_concurrency()
  // Which attempt of the job to analyze (DumpSet::attempts, from 1 in start order); 0: the latest.
  int attempt = 0;
  // Called from the loading threads' coordinator as files complete (done, total).
  std::function<void(size_t, size_t)> progress;
  // Where summaries read by earlier loads of the same directory are kept (and this load's are
  // added); null: every file is read.
  SummaryCache* cache = nullptr;
  // Only the dumps of this job instance (equal, or it followed by "/": `ncclwatch run`'s id
  // before the launcher's), the others counted in DumpSet::other_jobs_files; "": every dump.
  std::string job_instance;
  // Dumps read elsewhere (full, no path: the postmortems of black boxes nobody converted), taken
  // as if they lay in the directory.
  std::vector<Dump> in_memory;
};

// Whether a dump's job instance is `wanted`'s (equal, or `wanted` followed by "/...").
bool OfJobInstance(const std::string& instance, const std::string& wanted);

// One attempt of a job in a reused directory (a torchrun restart, a Slurm requeue, a rerun
// into the default directory): dumps linked by a communicator id (random per attempt, equal on
// every member), a job instance or a process.
struct Attempt {
  int index = 0;               // from 1, in start order
  int64_t start_unix_ns = 0;   // earliest process start (wall clock)
  std::string job_instance;    // the launcher's id when the dumps carry one
  std::vector<int> ranks;      // global ranks with dumps
  size_t files = 0;
};

class DumpSet {
 public:
  DumpSet() = default;
  // Moves keep the process index valid (it points into the vectors' buffers); copies would not.
  DumpSet(DumpSet&&) = default;
  DumpSet& operator=(DumpSet&&) = default;
  DumpSet(const DumpSet&) = delete;
  DumpSet& operator=(const DumpSet&) = delete;

  // Reads DIR. False (with *error) only when the directory itself cannot be listed.
  bool Load(const std::string& dir, const LoadOptions& options, std::string* error);

  // Builds the set from dumps read elsewhere (a fuzzer, a tool holding dumps in memory);
  // Detail() then only returns details already present in them.
  void LoadFromDumps(std::vector<Dump> dumps);

  // The selected dumps: one per global rank, the latest (see docs/analysis.md).
  const std::vector<Dump>& dumps() const { return dumps_; }
  // Earlier dumps of the same ranks (summaries only), for history.
  const std::vector<Dump>& history() const { return history_; }
  const std::vector<Problem>& problems() const { return problems_; }
  // Global rank -> index in dumps(), or -1.
  int IndexOfRank(int rank) const;
  // Ranks whose dump file exists (by its name) but could not be used.
  const std::map<int, std::string>& unreadable_ranks() const { return unreadable_ranks_; }
  // Ranks whose latest dump answers an older job-wide request than the newest one the other
  // ranks answered: they did not answer it (stopped, wedged, at NCCLWATCH_MAX_DUMPS=1), and
  // their older dump is not mixed into the newer round (it is history). Rank -> that dump.
  struct Unanswered {
    std::string file;
    double behind_s = 0;  // taken this long before the newest round's first answer
  };
  const std::map<int, Unanswered>& unanswered_ranks() const { return unanswered_ranks_; }
  // max(summary.world_size, highest rank + 1, largest communicator size); 0 when no dump.
  int world_size() const { return world_size_; }
  size_t files_seen() const { return files_seen_; }
  // Files left out because they are another job's (LoadOptions::job_instance).
  size_t other_jobs_files() const { return other_jobs_files_; }
  uint64_t bytes_read() const { return bytes_read_; }
  // Files whose summary this load read (the others came from LoadOptions::cache).
  size_t files_read() const { return files_read_; }
  uint64_t detail_bytes_read() const { return detail_bytes_read_; }
  size_t details_read() const { return details_read_; }

  // The full dump of dumps()[index], read on first use; null when unreadable. Problems met
  // while reading it are added to problems().
  const trace::Detail* Detail(size_t index);
  // The full dump of dumps()[index] with its ring and call sites joined with those of the same
  // process's other dumps (read in full here): a mid-run snapshot holds operations that the
  // process's later exit record (its last 64) no longer does. One entry per operation, the
  // latest dump's wins; oldest first. For the timeline and the slow-rank findings.
  const trace::Detail* JoinedDetail(size_t index);
  // Frees the full dump of dumps()[index] (read again on the next Detail): for passes over
  // every rank that keep one full dump in memory at a time.
  void DropDetail(size_t index) {
    if (index < dumps_.size() && dumps_[index].OnDisk()) dumps_[index].detail.reset();
  }


  // Whether the process that wrote `d` completed `op` (a collective by its sequence number, a
  // Send/Recv by its p2p one) in one of its later dumps (the chosen attempt's, evidence or
  // history): an operation in flight in `d` that did finish.
  bool CompletedLater(const Dump& d, const trace::Op& op) const;
  // A stall dump whose stall a later dump of its process saw end (its operation completed, or
  // the communicator it was creating created): the stall recovered.
  bool StallRecovered(const Dump& d) const;
  // The same, or for a collective, any member's dump shows it completed (a collective
  // completes only once every member is in it: the job went on).
  bool StallOver(const Dump& d) const;
  // Whether every stall of the process that sent a request (summary.answered of a peer_request dump)
  // recovered: its answers then show a moment of a job that went on, not a hang.
  bool RequestFromRecoveredStall(const trace::AnsweredRequest& t) const;
  // Python frames of thread `tid` from the latest earlier dump of the process of `d` that shows
  // it in the same state (no operation issued or completed since, the same NCCL calls in
  // progress) and has them, where `d` has none for it (the thread held the GIL at `d`'s dump);
  // empty when there is none. *file: that dump's file name.
  std::vector<trace::PythonFrame> EarlierPythonFrames(const Dump& d, int64_t tid, std::string* file);
  // The recovery record of (comm, seq) in the later dumps of the process of `d`, if any.
  const trace::Recovery* RecoveryOf(const Dump& d, const std::string& comm, int64_t seq) const;

  // Two launches (or more) that share a communicator and repeat the same RANK numbers (an RL
  // trainer's RANK 0-3 and a rollout engine's RANK 0-1, both in one weight-sync communicator):
  // their processes are told apart by host, pid and process uid, and each one's global rank
  // here is its rank in the shared communicator (`comm`). Empty when the dumps hold one launch.
  struct Launch {
    std::string world_comm;    // the launch's own world communicator (size world_size)
    int world_size = 0;
    int first_rank = 0;        // its RANK 0 is rank first_rank of `comm`
  };
  struct SharedLaunches {
    std::string comm;          // the communicator they share
    int comm_size = 0;
    std::vector<Launch> launches;  // by first_rank
  };
  const SharedLaunches& shared_launches() const { return shared_launches_; }
  // Rank r of the shared communicator: its launch (index in shared_launches().launches) and
  // the RANK it was started with; false when the dumps hold one launch or r is not in one.
  bool LaunchOf(int rank, int* launch, int* launch_rank) const;

  // Attempts found in the directory; the analysis uses chosen_attempt() only.
  const std::vector<Attempt>& attempts() const { return attempts_; }
  int chosen_attempt() const { return chosen_attempt_; }

 private:
  void Select(std::vector<Dump> usable, int attempt);
  void SeparateLaunches(std::vector<Dump>* usable);
  std::vector<Dump> SplitAttempts(std::vector<Dump> usable, int wanted);
  void MarkGoneBeforeTeardown();
  void LeaveOutUnanswered();
  void ComputeWorldSize();
  void IndexProcesses();
  // Every dump of the process of `d` (evidence and history), in dump_seq order.
  const std::vector<const Dump*>& DumpsOfProcess(const Dump& d) const;
  void AddProblem(std::string file, ProblemKind kind, std::string message = {}, std::string other = {},
                  int64_t number = 0, int64_t count = 0);

  std::string dir_;
  std::vector<Dump> dumps_;
  std::vector<Dump> history_;
  std::vector<Problem> problems_;
  std::unordered_map<int, size_t> by_rank_;
  // Process key -> its dumps; rebuilt by Select (pointers into dumps_ and history_).
  std::unordered_map<std::string, std::vector<const Dump*>> by_process_;
  std::map<int, std::string> unreadable_ranks_;
  std::map<int, Unanswered> unanswered_ranks_;
  int world_size_ = 0;
  SharedLaunches shared_launches_;
  std::vector<Attempt> attempts_;
  int chosen_attempt_ = 0;
  size_t files_seen_ = 0;
  size_t other_jobs_files_ = 0;
  size_t files_read_ = 0;
  uint64_t bytes_read_ = 0;
  uint64_t detail_bytes_read_ = 0;
  size_t details_read_ = 0;
};

using trace::RankFromFileName;  // format/file_name.h

}  // namespace analysis
}  // namespace ncclwatch
