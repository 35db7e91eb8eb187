// Where dumps go and how they get there: atomically (temp file + no-replace rename), never
// overwriting another dump, at most NCCLWATCH_MAX_DUMPS per process, into a directory that
// falls back to a writable default when the configured one is not.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

namespace ncclwatch {

struct PeerRequest {
  std::string request;  // "<host>-<pid>-<n>"
  int origin_rank = -1;
  std::string origin_host;
  std::string reason;
};

class DumpDirectory {
 public:
  DumpDirectory(std::string configured, std::string fallback_name, uint64_t max_dumps);

  // Writes `content` as `<dir>/<stem>.json`. Returns the path, or "" (with one line logged)
  // when the per-process bound is reached or nothing could be written.
  std::string Write(const std::string& stem, const std::string& content);
  uint64_t written() const { return written_; }
  // True once NCCLWATCH_MAX_DUMPS dumps were written; the first such answer logs one line.
  bool LimitReached();
  const std::string& path() const { return dir_; }

  // The job-wide dump request (docs/trace-format.md).
  bool WriteRequest(const PeerRequest& r);
  // A request whose file changed since the last call, if any.
  std::optional<PeerRequest> PollRequest();
  // Seconds since the request file was last written (by any rank); negative if there is none.
  double RequestAgeS();

 private:
  bool EnsureDirectory();
  bool LimitReachedLocked();  // mu_ held
  std::string RequestPath();

  std::string configured_;
  std::string fallback_name_;
  std::string dir_;
  bool dir_ready_ = false;
  uint64_t max_dumps_;
  uint64_t written_ = 0;
  bool limit_logged_ = false;
  std::mutex mu_;
  // Identity of the request file last seen (mtime, size, inode).
  int64_t seen_mtime_ns_ = -1;
  off_t seen_size_ = -1;
  ino_t seen_ino_ = 0;
};

// Writes `content` to `path` atomically without replacing an existing file. errno-style
// result: 0, or the error of the failing step (EEXIST when `path` exists).
int WriteFileNoReplace(const std::string& path, const std::string& content);

}  // namespace ncclwatch
