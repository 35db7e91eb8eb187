#include "dump/dump_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/log.h"

namespace ncclwatch {
namespace {

bool MakeDirs(const std::string& path, std::string* why) {
  std::string cur;
  std::stringstream ss(path);
  std::string part;
  if (!path.empty() && path[0] == '/') cur = "/";
  while (std::getline(ss, part, '/')) {
    if (part.empty()) continue;
    cur += part + "/";
    if (mkdir(cur.c_str(), 0777) != 0 && errno != EEXIST) {
      *why = std::string(strerror(errno));
      return false;
    }
  }
  if (access(path.c_str(), W_OK | X_OK) != 0) {
    *why = std::string(strerror(errno));
    return false;
  }
  return true;
}

}  // namespace

int WriteFileNoReplace(const std::string& path, const std::string& content) {
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  // Hidden temp name: readers select "rank*.json" and never see a partial file.
  std::string tmp = dir + "/.tmp-" + base + "-" + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return errno;
  const char* p = content.data();
  size_t left = content.size();
  while (left > 0) {
    ssize_t n = write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      close(fd);
      unlink(tmp.c_str());
      return e;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  fdatasync(fd);  // the node may be torn down right after a hang dump
  close(fd);
  if (renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_NOREPLACE) == 0) return 0;
  int e = errno;
  if (e == EINVAL || e == ENOSYS) {  // file system without RENAME_NOREPLACE: link is no-replace too
    e = link(tmp.c_str(), path.c_str()) == 0 ? 0 : errno;
  }
  unlink(tmp.c_str());
  return e;
}

DumpDirectory::DumpDirectory(std::string configured, std::string fallback_name, uint64_t max_dumps)
    : configured_(std::move(configured)), fallback_name_(std::move(fallback_name)), max_dumps_(max_dumps) {}

bool DumpDirectory::EnsureDirectory() {
  if (dir_ready_) return true;
  std::string candidates[] = {configured_, fallback_name_, "/tmp/" + fallback_name_ + "-" + std::to_string(getuid())};
  std::string first_error;
  for (const std::string& c : candidates) {
    if (c.empty()) continue;
    std::string why;
    if (MakeDirs(c, &why)) {
      if (!first_error.empty()) LogWarn("%s; writing dumps to %s instead", first_error.c_str(), c.c_str());
      dir_ = c;
      dir_ready_ = true;
      return true;
    }
    if (first_error.empty()) first_error = "cannot write dump directory '" + c + "': " + why;
  }
  LogWarn("%s, and no fallback directory is writable; no dump written", first_error.c_str());
  return false;
}

bool DumpDirectory::LimitReached() {
  std::lock_guard<std::mutex> lock(mu_);
  return LimitReachedLocked();
}

bool DumpDirectory::LimitReachedLocked() {
  if (written_ < max_dumps_) return false;
  if (!limit_logged_)
    LogWarn("NCCLWATCH_MAX_DUMPS=%llu reached; no further dumps from this process",
            static_cast<unsigned long long>(max_dumps_));
  limit_logged_ = true;
  return true;
}

std::string DumpDirectory::Write(const std::string& stem, const std::string& content) {
  std::lock_guard<std::mutex> lock(mu_);
  if (LimitReachedLocked()) return "";
  if (!EnsureDirectory()) return "";
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string path = dir_ + "/" + stem + (attempt ? "-" + std::to_string(attempt) : "") + ".json";
    int e = WriteFileNoReplace(path, content);
    if (e == 0) {
      ++written_;
      return path;
    }
    if (e != EEXIST) {
      LogWarn("cannot write dump %s: %s", path.c_str(), strerror(e));
      dir_ready_ = false;  // try the fallbacks next time
      return "";
    }
  }
  return "";
}

bool DumpDirectory::WriteRequest(const PeerRequest& r) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!EnsureDirectory()) return false;
  nlohmann::ordered_json j;
  j["request"] = r.request;
  j["origin_rank"] = r.origin_rank;
  j["origin_host"] = r.origin_host;
  j["reason"] = r.reason;
  std::string path = dir_ + "/dump-request.json";
  std::string tmp = dir_ + "/.tmp-dump-request-" + std::to_string(getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << j.dump() << "\n";
    if (!f) return false;
  }
  // Replacing is intended here: the newest request wins; every rank serves each one once.
  return rename(tmp.c_str(), path.c_str()) == 0;
}

std::string DumpDirectory::RequestPath() {
  std::lock_guard<std::mutex> lock(mu_);
  return (dir_ready_ ? dir_ : (configured_.empty() ? fallback_name_ : configured_)) + "/dump-request.json";
}

double DumpDirectory::RequestAgeS() {
  struct stat st;
  if (stat(RequestPath().c_str(), &st) != 0) return -1;
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<double>(now.tv_sec - st.st_mtim.tv_sec) + (now.tv_nsec - st.st_mtim.tv_nsec) / 1e9;
}

std::optional<PeerRequest> DumpDirectory::PollRequest() {
  std::string path = RequestPath();
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return std::nullopt;
  int64_t mtime = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  if (mtime == seen_mtime_ns_ && st.st_size == seen_size_ && st.st_ino == seen_ino_) return std::nullopt;
  std::ifstream f(path);
  std::stringstream buf;
  buf << f.rdbuf();
  auto j = nlohmann::json::parse(buf.str(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;  // being replaced: retry next poll
  seen_mtime_ns_ = mtime;
  seen_size_ = st.st_size;
  seen_ino_ = st.st_ino;
  PeerRequest r;
  r.request = j.value("request", "");
  r.origin_rank = j.value("origin_rank", -1);
  r.origin_host = j.value("origin_host", "");
  r.reason = j.value("reason", "");
  if (r.request.empty()) return std::nullopt;
  return r;
}

}  // namespace ncclwatch
