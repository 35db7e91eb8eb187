#include "dump/request_relay.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/log.h"
#include "common/timing.h"
#include "format/request.h"

namespace ncclwatch {

std::string RelayFileName(const std::string& shared_request_path, const std::string& host) {
  // FNV-1a: a short stable name; the uid keeps users apart in a directory all of them share.
  uint64_t h = 1469598103934665603ull;
  for (char c : shared_request_path + '\0' + host) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  char name[96];
  snprintf(name, sizeof name, "ncclwatch-relay-%u-%016llx", static_cast<unsigned>(getuid()),
           static_cast<unsigned long long>(h));
  return name;
}

RequestRelay::RequestRelay(std::string relay_dir, std::string host)
    : relay_dir_(std::move(relay_dir)), host_(std::move(host)) {}

RequestRelay::~RequestRelay() = default;  // closing the lock's descriptor releases it: another rank takes over

void RequestRelay::Leave() {
  // The store's keys of this host first (bounded: a slow store is left to end with the process).
  if (link_ && !link_->Stop(/*clean=*/true, static_cast<int>(timing::kStoreLeaveWait.count())))
    (void)link_.release();  // its thread still runs: it and its object end with the process
  link_.reset();
  // The watcher tidies the node-local directory at a normal exit. A rank still running keeps
  // the old lock and may take it over; one starting later makes a new one: two watchers at
  // worst, until the job ends, never none. A rank whose watcher was killed takes the watch
  // over to tidy it (the last one to leave does): a job whose watcher died leaves nothing.
  if (usable_ && !watcher_ && lock_fd_.StillOurs()) watcher_ = flock(lock_fd_.fd(), LOCK_EX | LOCK_NB) == 0;
  // Not while the lock file there is another one than it holds (a later process made it again:
  // the watch is that one's now).
  struct stat st;
  const std::string lock_path = relay_path_ + ".lock";
  const bool lock_there = watcher_ && stat(lock_path.c_str(), &st) == 0;
  const bool ours = lock_there && st.st_dev == lock_fd_.dev() && st.st_ino == lock_fd_.ino();
  if (watcher_ && lock_fd_.StillOurs() && (ours || (!lock_there && errno == ENOENT))) {
    unlink(relay_path_.c_str());
    if (ours) unlink(lock_path.c_str());
  }
  lock_fd_.Close();
  watcher_ = false;
  usable_ = false;
}

bool RequestRelay::Open(const std::string& shared_request_path) {
  tried_ = true;
  if (relay_dir_ == "none") return false;
  std::string absolute = shared_request_path;
  if (absolute.empty() || absolute[0] != '/') {
    char cwd[4096];
    if (getcwd(cwd, sizeof cwd)) absolute = std::string(cwd) + "/" + absolute;
  }
  const std::string base = relay_dir_ + "/" + RelayFileName(absolute, host_);
  const std::string lock_path = base + ".lock";
  // Never through a link, and only our own file: the directory is usually world-writable.
  const int fd = open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  struct stat st;
  const char* problem = nullptr;
  if (fd < 0)
    problem = strerror(errno);
  else if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != getuid())
    problem = "not a file of this user";
  if (problem) {
    LogWarn("NCCLWATCH_RELAY_DIR: cannot use %s (%s); this process reads the job-wide dump request in the "
            "dump directory itself",
            lock_path.c_str(), problem);
    if (fd >= 0) close(fd);
    return false;
  }
  lock_fd_.Keep(fd, "the request relay's lock");
  relay_path_ = base;
  return true;
}

std::optional<trace::DumpRequest> RequestRelay::Poll(DumpDirectory* shared, const std::string& own_instance,
                                              uint64_t own_start_unix_ns) {
  // The application closed the lock's descriptor (and so dropped a watch we held): opened again.
  if (usable_ && !lock_fd_.StillOurs()) {
    watcher_ = false;
    tried_ = false;
  }
  if (!tried_) usable_ = Open(shared->RequestPath());
  if (usable_ && !watcher_) watcher_ = flock(lock_fd_.fd(), LOCK_EX | LOCK_NB) == 0;
  // The host's watcher links to the launcher's store (one link a host, for the process's life).
  if (usable_ && watcher_ && !link_ && store_.mode != "off" && !store_.address.empty() &&
      (store_.mode == "on" || store_.multi_host)) {
    const std::string request_path = shared->RequestPath();
    const size_t slash = request_path.rfind('/');
    store_.instance = own_instance;
    link_ = std::make_unique<StoreLink>(store_, slash == std::string::npos ? "." : request_path.substr(0, slash));
    if (!link_->Start()) {
      LogInfo("NCCLWATCH_STORE: cannot start the store's thread; this host's ranks use the dump directory only");
      store_.mode = "off";
      link_.reset();
    }
  }
  if (!usable_ || watcher_) {
    ++shared_checks_;
    std::optional<trace::DumpRequest> r = shared->PollRequest(own_instance, own_start_unix_ns);
    // This host's request goes to the other hosts through the store (theirs, written here by
    // the link, are not sent back).
    if (r && link_) link_->Publish(*r);
    // Relayed before it is served here, so the host's other ranks dump as soon as this one.
    if (r && usable_) {
      // The user's own, as its lock: the host's other users have no business reading it.
      int e = WriteFileReplacing(relay_path_, trace::WriteRequest(*r), 0600);
      if (e != 0) LogInfo("cannot relay the job-wide dump request to %s: %s", relay_path_.c_str(), strerror(e));
    }
    return r;
  }
  return relay_watch_.Poll(relay_path_, own_instance, own_start_unix_ns, /*own_files_only=*/true);
}

}  // namespace ncclwatch
