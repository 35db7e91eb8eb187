#include "dump/dump_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "common/fd_room.h"
#include "common/memory_room.h"
#include "common/log.h"
#include "format/display.h"
#include "format/file_name.h"

namespace ncclwatch {

bool MakeDirs(const std::string& path, std::string* why) {
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  std::vector<std::string> created;  // removed again when the whole path cannot be made
  auto fail = [&](int err) {
    *why = strerror(err);
    for (auto it = created.rbegin(); it != created.rend(); ++it) rmdir(it->c_str());
    return false;
  };
  if (!path.empty() && path[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    // 0755 whatever the umask: a dump directory is never writable by others (the umask can
    // only take more away).
    if (mkdir(cur.c_str(), 0755) == 0)
      created.push_back(cur);
    else if (errno != EEXIST)
      return fail(errno);
  }
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode))  // mkdir said EEXIST about a file
    return fail(ENOTDIR);
  if (access(path.c_str(), W_OK | X_OK) != 0) return fail(errno);
  return true;
}

namespace {

// The fallback in /tmp has a predictable name: it is used only when it is a real directory (not a
// link) owned by this user and writable by nobody else; another user's planted one is refused.
bool SafeSharedDir(const std::string& path, std::string* why) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return true;  // MakeDirs creates it, 0755
  if (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & (S_IWGRP | S_IWOTH))) {
    *why = "exists and is not a directory of this user writable by this user only";
    return false;
  }
  return true;
}

// Creates `path` for writing, exclusively and without following a link planted under its name
// (a temporary name is predictable); a leftover of this very pid (a crash) is replaced.
int CreateExclusive(const std::string& path, int mode = 0644) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0 && errno == EEXIST && unlink(path.c_str()) == 0)  // unlink removes a link, never its target
    fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  return fd;
}

// Hidden temp name beside `path`: readers select "rank*.json" and never see a partial file.
std::string TempPathFor(const std::string& path) {
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  return dir + "/.tmp-" + base + "-" + std::to_string(getpid());
}

}  // namespace

int WriteFileReplacing(const std::string& path, const std::string& content, int mode) {
  return WriteFileReplacingVia(path, TempPathFor(path), content, mode);
}

int WriteFileReplacingVia(const std::string& path, const std::string& tmp, const std::string& content, int mode) {
  int fd = CreateExclusive(tmp, mode);
  if (fd < 0) return errno;
  bool ok = write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size());
  int e = ok ? 0 : errno;
  if (close(fd) != 0 && e == 0) e = errno;
  if (e == 0 && rename(tmp.c_str(), path.c_str()) != 0) e = errno;
  if (e != 0) unlink(tmp.c_str());
  return e;
}

namespace {
std::string g_fail_writes_matching;  // test seam: a write to a path containing this fails like a full disk
int g_fail_writes_errno = 0;
}  // namespace

void FailWritesForTest(const std::string& path_part, int err) {
  g_fail_writes_matching = path_part;
  g_fail_writes_errno = err;
}

namespace {
// The temporary file of the dump being written, for a signal handler that gives up on it while
// the process ends (AbandonDumpInProgress): set before the file exists, cleared once renamed.
char g_tmp_in_progress[4096];
std::atomic<bool> g_tmp_in_progress_set{false};
std::atomic<bool> g_abandoned{false};

void SetTmpInProgress(const std::string& tmp) {
  g_tmp_in_progress_set.store(false);
  size_t n = std::min(tmp.size(), sizeof g_tmp_in_progress - 1);
  memcpy(g_tmp_in_progress, tmp.data(), n);
  g_tmp_in_progress[n] = '\0';
  g_tmp_in_progress_set.store(tmp.size() < sizeof g_tmp_in_progress);
}
}  // namespace

bool AbandonDumpInProgress() {
  // Flag first: a writer that creates its file after this sees the flag and removes it itself.
  g_abandoned.store(true);
  if (!g_tmp_in_progress_set.exchange(false)) return false;
  unlink(g_tmp_in_progress);
  return true;
}

int RemoveStaleTemporaries(const std::string& dir, const std::string& host, int min_age_s) {
  DIR* d = opendir(dir.c_str());
  if (!d) return 0;
  const std::string own_host = trace::SafeHostName(host);
  int removed = 0;
  const time_t now = time(nullptr);
  while (dirent* e = readdir(d)) {
    // .tmp-rank<R>-<host>-<pid>-<seq>-<reason>.json-<writer pid>
    const std::string name = e->d_name;
    if (name.rfind(".tmp-", 0) != 0) continue;
    const std::string base = name.substr(5, name.rfind('-') - 5);
    if (!trace::IsDumpFileName(base)) continue;
    const size_t h = base.find('-') + 1, p = base.find('-', h);
    const long writer = strtol(name.c_str() + name.rfind('-') + 1, nullptr, 10);
    // Only this host's processes can be known dead here; a live pid (or a reused one) keeps it.
    if (p == std::string::npos || base.compare(h, p - h, own_host) != 0 || writer <= 0) continue;
    if (kill(static_cast<pid_t>(writer), 0) == 0 || errno != ESRCH) continue;
    struct stat st;
    const std::string path = dir + "/" + name;
    if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != getuid() ||
        now - st.st_mtime < min_age_s)
      continue;
    if (unlink(path.c_str()) == 0) ++removed;
  }
  closedir(d);
  return removed;
}

int WriteFileNoReplace(const std::string& path, const ContentWriter& produce) {
  if (g_fail_writes_errno != 0 && path.find(g_fail_writes_matching) != std::string::npos) return g_fail_writes_errno;
  std::string tmp = TempPathFor(path);
  SetTmpInProgress(tmp);
  if (g_abandoned.load()) return ECANCELED;
  int fd = CreateExclusive(tmp);
  if (fd < 0) return errno;
  int e = 0;
  bool produced = produce([&](std::string* piece) {
    if (g_abandoned.load()) {  // the process is ending without this dump: stop, leave nothing
      e = ECANCELED;
      return false;
    }
    const char* p = piece->data();
    size_t left = piece->size();
    while (left > 0) {
      ssize_t n = write(fd, p, left);
      if (n < 0) {
        if (errno == EINTR) continue;
        e = errno;
        return false;
      }
      p += n;
      left -= static_cast<size_t>(n);
    }
    piece->clear();
    return true;
  });
  if (e == 0 && !produced) e = EIO;
  if (e == 0 && g_abandoned.load()) e = ECANCELED;
  if (e != 0) {
    close(fd);
    unlink(tmp.c_str());
    g_tmp_in_progress_set.store(false);
    return e;
  }
  fdatasync(fd);  // the node may be torn down right after a hang dump
  close(fd);
  if (renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) == 0) {
    g_tmp_in_progress_set.store(false);
    return 0;
  }
  e = errno;
  if (e == EINVAL || e == ENOSYS) {  // file system without RENAME_NOREPLACE: link is no-replace too
    e = link(tmp.c_str(), path.c_str()) == 0 ? 0 : errno;
  }
  unlink(tmp.c_str());
  g_tmp_in_progress_set.store(false);
  return e;
}

namespace {
ContentWriter WholeContent(const std::string& content) {
  return [&content](const trace::TextSink& sink) {
    std::string copy = content;
    return sink(&copy);
  };
}
}  // namespace

int WriteFileNoReplace(const std::string& path, const std::string& content) {
  return WriteFileNoReplace(path, WholeContent(content));
}

namespace {

bool IsDirectory(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// The deepest directory of `path` (itself or one above it) that exists now; "" none.
std::string DeepestExisting(std::string path) {
  while (!path.empty()) {
    if (IsDirectory(path)) return path;
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return std::string();
    path = slash == 0 ? (path == "/" ? std::string() : std::string("/")) : path.substr(0, slash);
  }
  return std::string();
}

}  // namespace

DumpDirectory::DumpDirectory(std::string configured, std::string fallback_name, uint64_t max_dumps, std::string base,
                             std::string start_anchor)
    : configured_(std::move(configured)), fallback_name_(std::move(fallback_name)), base_(std::move(base)), max_dumps_(max_dumps) {
  if (!configured_.empty()) anchors_[0] = start_anchor.empty() ? DeepestExisting(FromBase(configured_)) : start_anchor;
  if (configured_.empty() && !start_anchor.empty()) anchors_[1] = start_anchor;
  else if (!start_anchor.empty() && !base_.empty()) anchors_[1] = base_;
  else anchors_[1] = DeepestExisting(FromBase(fallback_name_));
  anchors_[2] = DeepestExisting("/tmp/" + fallback_name_);  // a chroot's /tmp is not created either
}

bool DumpDirectory::EnsureDirectory(std::string first_error, bool quiet) {
  if (dir_ready_) return true;
  const std::string shared = "/tmp/" + fallback_name_ + "-" + std::to_string(getuid());
  const std::string candidates[] = {FromBase(configured_), FromBase(fallback_name_), shared};
  for (size_t i = next_candidate_; i < 3; ++i) {
    const std::string& c = candidates[i];
    if (c.empty()) continue;
    std::string why;
    // A directory that existed at start and was removed since (the application's working
    // directory, its run directory) is not created again: its tree is the application's.
    if (!anchors_[i].empty() && !IsDirectory(anchors_[i])) {
      if (first_error.empty())
        first_error = "cannot write dump directory '" + trace::PrintableCut(c) + "': '" +
                      trace::PrintableCut(anchors_[i]) +
                      "', there when ncclwatch started, is gone (removed, or out of reach since: chroot); not created again";
      continue;
    }
    if ((c != shared || SafeSharedDir(c, &why)) && MakeDirs(c, &why) && (c != shared || SafeSharedDir(c, &why))) {
      if (!first_error.empty() && !quiet)
        LogWarn("%s; writing dumps to %s instead", first_error.c_str(), trace::PrintableCut(c).c_str());
      dir_ = c;
      dir_index_ = i;
      dir_ready_ = true;
      return true;
    }
    // The path cut, never the reason: a very long path would push it out of the line.
    if (first_error.empty()) first_error = "cannot write dump directory '" + trace::PrintableCut(c) + "': " + why;
  }
  if (!quiet) LogWarn("%s, and no fallback directory is writable; no dump written", first_error.c_str());
  next_candidate_ = 0;  // the next dump tries them all again: space may have been freed
  return false;
}

bool DumpDirectory::LimitReached() {
  std::lock_guard<std::mutex> lock(mu_);
  return LimitReachedLocked();
}

bool DumpDirectory::LimitReachedLocked() {
  if (max_dumps_ >= 2 || written_ < max_dumps_) return false;  // >= 2: older dumps make room
  if (!limit_logged_)
    LogWarn("NCCLWATCH_MAX_DUMPS=%llu reached; no further dumps from this process",
            static_cast<unsigned long long>(max_dumps_));
  limit_logged_ = true;
  return true;
}

std::string DumpDirectory::Write(const std::string& stem, const std::string& content, bool counted) {
  return Write(stem, WholeContent(content), counted);
}

std::string DumpDirectory::Write(const std::string& stem, const ContentWriter& content, bool counted) {
  std::lock_guard<std::mutex> lock(mu_);
  if (counted && LimitReachedLocked()) return "";
  if (!EnsureDirectory()) return "";
  if (counted && max_dumps_ >= 2 && kept_.size() >= max_dumps_) {
    if (!limit_logged_)
      LogWarn("NCCLWATCH_MAX_DUMPS=%llu reached; this process keeps its first dump and its latest ones",
              static_cast<unsigned long long>(max_dumps_));
    limit_logged_ = true;
    unlink(kept_[1].c_str());  // only a file this process wrote
    kept_.erase(kept_.begin() + 1);
  }
  // A directory that stops taking files (disk full, quota, I/O error, removed) hands the dump
  // to the next fallback directory at once: the evidence is written now or never. One line.
  std::string refused;  // the first directory's failure
  for (;;) {
    std::string path;
    int e = WriteUnique(stem, content, &path);
    if (e == 0) {
      if (!refused.empty()) LogWarn("%s; written to %s instead", refused.c_str(), path.c_str());
      ++written_;
      if (counted) kept_.push_back(path);
      return path;
    }
    if (e == ECANCELED) return "";  // abandoned by an ending signal, which said so
    if (refused.empty()) refused = "cannot write dump " + path + ": " + strerror(e);
    dir_ready_ = false;
    next_candidate_ = dir_index_ + 1;
    if (next_candidate_ >= 3 || !EnsureDirectory(refused, /*quiet=*/true)) {
      next_candidate_ = 0;  // the next dump tries them all again: space may have been freed
      LogWarn("%s, nor in a fallback directory; no dump written", refused.c_str());
      return "";
    }
  }
}

int DumpDirectory::WriteUnique(const std::string& stem, const ContentWriter& content, std::string* path) {
  int e = EEXIST;
  for (int attempt = 0; attempt < 100 && e == EEXIST; ++attempt) {
    *path = dir_ + "/" + stem + (attempt ? "-" + std::to_string(attempt) : "") + ".json";
    e = WriteFileNoReplace(*path, content);
  }
  return e;
}

bool DumpDirectory::WriteRequest(const trace::DumpRequest& r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!EnsureDirectory()) return false;
  // Replacing is intended here: the newest request wins; every rank serves each one once.
  return WriteFileReplacing(dir_ + "/" + trace::kDumpRequestFile, trace::WriteRequest(r)) == 0;
}

std::string DumpDirectory::RequestPath() {
  std::string path;
  RequestPathInto(&path);
  return path;
}

void DumpDirectory::RequestPathInto(std::string* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (dir_ready_) {
    out->assign(dir_);
    out->append("/");
    out->append(trace::kDumpRequestFile);
    return;
  }
  if (request_dirs_[0].empty()) {
    request_dirs_[0] = FromBase(configured_.empty() ? fallback_name_ : configured_);
    request_dirs_[1] = FromBase(fallback_name_);
    request_dirs_[2] = "/tmp/" + fallback_name_ + "-" + std::to_string(getuid());
    for (int i = 0; i < 3; ++i) request_paths_[i] = request_dirs_[i] + "/" + trace::kDumpRequestFile;
  }
  // A configured directory that cannot be used (a file there, not writable) sends the job's
  // dumps, and its request, to the fallback: a rank that has not dumped yet looks there too.
  struct stat st;
  if (!configured_.empty() && stat(request_dirs_[0].c_str(), &st) == 0 &&
      (!S_ISDIR(st.st_mode) || access(request_dirs_[0].c_str(), W_OK | X_OK) != 0)) {
    for (int i = 1; i < 3; ++i)
      if (stat(request_dirs_[i].c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
        out->assign(request_paths_[i]);
        return;
      }
  }
  out->assign(request_paths_[0]);
}

namespace {

// The request file at `path` (a regular file, not a link, read without blocking), parsed; false
// where there is none or it is being replaced.
bool ReadRequestFile(const std::string& path, trace::DumpRequest* r) {
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[4096];
  ssize_t n = read(fd, buf, sizeof buf);
  close(fd);
  return n > 0 && trace::ParseRequest(std::string(buf, static_cast<size_t>(n)), r);
}

}  // namespace

std::optional<trace::DumpRequest> DumpDirectory::CurrentRequest() {
  const std::string path = RequestPath();
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  trace::DumpRequest r;
  if (!ReadRequestFile(path, &r)) return std::nullopt;
  if (r.time_unix_ns <= 0) r.time_unix_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return r;
}

std::optional<trace::DumpRequest> DumpDirectory::PollRequest(const std::string& own_instance, uint64_t own_start_unix_ns) {
  RequestPathInto(&poll_path_);
  return request_watch_.Poll(poll_path_, own_instance, own_start_unix_ns);
}

std::optional<trace::DumpRequest> RequestFileWatch::Poll(const std::string& path, const std::string& own_instance,
                                                  uint64_t own_start_unix_ns, bool own_files_only) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  if (own_files_only && st.st_uid != getuid()) return std::nullopt;
  int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if (mtime == seen_mtime_ns_ && st.st_size == seen_size_ && st.st_ino == seen_ino_) return std::nullopt;
  int free = 0;
  if (!FdRoom(1, &free)) {  // read at a later poll, once a descriptor is free again
    if (!no_room_said_)
      LogWarn("a job-wide dump request is in %s, but only %d descriptor(s) are free (RLIMIT_NOFILE %d): not answered "
              "until more are (ncclwatch leaves the last %d to the application)",
              path.c_str(), free, FdLimit(), kFdReserve);
    no_room_said_ = true;
    return std::nullopt;
  }
  if (!AddressSpaceRoom()) return std::nullopt;  // read once there is (a dump would not be written now)
  trace::DumpRequest r;
  if (!ReadRequestFile(path, &r)) return std::nullopt;  // being replaced: retry next poll
  seen_mtime_ns_ = mtime;
  seen_size_ = st.st_size;
  seen_ino_ = st.st_ino;
  if (!r.job_instance.empty() && !own_instance.empty() && r.job_instance != own_instance) return std::nullopt;
  if (r.time_unix_ns > 0 && static_cast<uint64_t>(r.time_unix_ns) < own_start_unix_ns) return std::nullopt;
  return r;
}

}  // namespace ncclwatch
