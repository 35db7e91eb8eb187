// Where dumps go and how they get there: atomically (temp file + no-replace rename), never
// overwriting another dump, at most NCCLWATCH_MAX_DUMPS per process, into a directory that
// falls back to a writable default when the configured one is not.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include <functional>

#include "format/request.h"
#include "format/trace_writer.h"
#include <vector>

namespace ncclwatch {

// Creates `path` and its missing parents, 0755 whatever the umask (never writable by others);
// true when it is then a directory this process can write. *why: strerror of what failed.
bool MakeDirs(const std::string& path, std::string* why);

// Produces a file's content in pieces, each handed to the sink (which writes it out and clears
// it): a dump is written in bounded memory. False: stop (the sink failed or the producer did).
using ContentWriter = std::function<bool(const trace::TextSink& sink)>;

// Change detection over one request file (the shared one, or a host's relay): a request is
// returned once per change of the file. A request of another job instance (both known) or
// written before `own_start_unix_ns` (left in a reused directory by an earlier attempt) is seen
// and ignored. `own_files_only`: a file not owned by this user is ignored (a world-writable
// node-local directory).
class RequestFileWatch {
 public:
  std::optional<trace::DumpRequest> Poll(const std::string& path, const std::string& own_instance, uint64_t own_start_unix_ns,
                                   bool own_files_only = false);

 private:
  int64_t seen_mtime_ns_ = -1;  // identity of the file last seen
  off_t seen_size_ = -1;
  ino_t seen_ino_ = 0;
  bool no_room_said_ = false;  // a request seen while no descriptor was free: said once
};

class DumpDirectory {
 public:
  // `base`: the directory relative paths are taken from, fixed once (the working directory at
  // start: a job that changes directory later still writes where it started); "": the current one.
  // What of each directory exists now (its deepest existing directory, its anchor) must still
  // exist when a dump is written: a tree the application removed meanwhile (its working
  // directory, a run directory) is never created again, the next directory is used, and one line
  // says so. `start_anchor`: the first directory's anchor as it was at the process's start (a
  // host's caretaker writing for a dead process; "": as now); the base is then the fallback's.
  DumpDirectory(std::string configured, std::string fallback_name, uint64_t max_dumps, std::string base = "",
                std::string start_anchor = "");
  // The first directory's anchor (the configured one's, else the fallback's), for the black box.
  const std::string& start_anchor() const { return configured_.empty() ? anchors_[1] : anchors_[0]; }

  // Writes `content` as `<dir>/<stem>.json`. Returns the path, or "" (with one line logged)
  // when the per-process bound is reached or nothing could be written. At the bound
  // (NCCLWATCH_MAX_DUMPS >= 2) the process keeps its first dump and its latest ones: the oldest
  // other dump it wrote is removed to make room, so recovered stalls never crowd out the
  // evidence of the latest episode. `counted`: false for the exit record (one per process).
  std::string Write(const std::string& stem, const std::string& content, bool counted = true);
  // The same, streamed: `content` may be called again for a fallback directory.
  std::string Write(const std::string& stem, const ContentWriter& content, bool counted = true);
  uint64_t written() const { return written_; }
  // True when no further dump can be written (NCCLWATCH_MAX_DUMPS < 2 and reached); the first
  // such answer logs one line.
  bool LimitReached();
  const std::string& path() const { return dir_; }

  // The job-wide dump request (docs/trace-format.md).
  bool WriteRequest(const trace::DumpRequest& r);
  // A request whose file changed since the last call, if any (RequestFileWatch's rules).
  std::optional<trace::DumpRequest> PollRequest(const std::string& own_instance = "", uint64_t own_start_unix_ns = 0);
  // The request file as it is now (whoever wrote it), if there is one that parses; its
  // time_unix_ns is the file's modification time when the request does not carry one.
  std::optional<trace::DumpRequest> CurrentRequest();
  // Where the job-wide request file is (or will be).
  std::string RequestPath();
  // The same into `out`: no allocation once `out` has held it (the watchdog's polls).
  void RequestPathInto(std::string* out);

 private:
  // Makes the first usable directory from the candidate `next_candidate_` on (configured,
  // ./fallback, /tmp/fallback-uid); `first_error` says why an earlier one was left. `quiet`:
  // the caller says what happened.
  bool EnsureDirectory(std::string first_error = "", bool quiet = false);
  int WriteUnique(const std::string& stem, const ContentWriter& content, std::string* path);
  bool LimitReachedLocked();  // mu_ held
  // A relative candidate `c` under base_ (the start's working directory); "" and absolute as they are.
  std::string FromBase(const std::string& c) const {
    return base_.empty() || c.empty() || c[0] == '/' ? c : base_ + "/" + c;
  }

  std::string configured_;
  std::string fallback_name_;
  std::string base_;
  std::string anchors_[3];  // per candidate (configured, fallback, /tmp): what must exist ("" none)
  std::string dir_;
  bool dir_ready_ = false;
  size_t dir_index_ = 0;       // which candidate dir_ is
  size_t next_candidate_ = 0;  // where EnsureDirectory starts looking
  uint64_t max_dumps_;
  uint64_t written_ = 0;
  std::vector<std::string> kept_;  // counted dumps of this process still on disk, oldest first
  bool limit_logged_ = false;
  std::mutex mu_;
  RequestFileWatch request_watch_;
  // RequestPath's answers before the directory is made, computed once (they never change):
  // the first candidate's directory and request path, then the fallbacks'.
  std::string request_dirs_[3], request_paths_[3];
  std::string poll_path_;  // PollRequest's (watchdog thread)
};

// Writes `content` to `path` atomically, replacing it (a temporary file created exclusively,
// never through a link, then renamed) with permissions `mode`. errno-style result.
int WriteFileReplacing(const std::string& path, const std::string& content, int mode = 0644);
// The same through the temporary path `tmp` the caller keeps (allocates nothing).
int WriteFileReplacingVia(const std::string& path, const std::string& tmp, const std::string& content, int mode);

// Writes `content` to `path` atomically without replacing an existing file. errno-style
// result: 0, or the error of the failing step (EEXIST when `path` exists).
int WriteFileNoReplace(const std::string& path, const std::string& content);
int WriteFileNoReplace(const std::string& path, const ContentWriter& content);

// Async-signal-safe, for a signal handler whose process ends before the dump being written is
// done: removes its temporary file, and no dump file is created from then on. True when a dump
// was being written (the first call only).
bool AbandonDumpInProgress();

// Removes the temporary files of dumps that processes of `host` left in `dir` when they died
// while writing them (SIGKILL mid-dump): their writer's pid is gone and they are at least
// `min_age_s` old. Files of other hosts are left alone (nothing here can tell whether their
// writer lives). Returns how many were removed.
int RemoveStaleTemporaries(const std::string& dir, const std::string& host, int min_age_s = 10);

// Test seam: WriteFileNoReplace to a path containing `path_part` fails with `err` (0: never),
// as on a full disk.
void FailWritesForTest(const std::string& path_part, int err);

}  // namespace ncclwatch
