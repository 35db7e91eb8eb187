#include "dump/store_link.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "common/clock.h"
#include "common/log.h"
#include "common/own_thread.h"
#include "common/tcp_store.h"
#include "common/timing.h"
#include "dump/dump_files.h"
#include "dump/store_evidence.h"
#include "format/file_name.h"
#include "ncclwatch/trace_format.h"

namespace ncclwatch {

namespace {

std::string Env(const char* name) {
  const char* v = getenv(name);
  return v ? v : "";
}

constexpr const char* kMarkerPrefix = ".ncclwatch-host-";

int Ms(timing::Duration d) { return static_cast<int>(d.count()); }

// Whether a dump file name is one of `host`'s: rank<R>-<host>-<pid>-...
bool OfHost(const std::string& name, const std::string& host) {
  const size_t dash = name.find('-');
  return dash != std::string::npos && name.compare(dash + 1, host.size(), host) == 0 &&
         name.size() > dash + 1 + host.size() && name[dash + 1 + host.size()] == '-';
}

bool ReadSmallFile(const std::string& path, size_t max, std::string* out) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return false;
  out->clear();
  char buf[65536];
  bool ok = true;
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ok = n == 0;
      break;
    }
    if (out->size() + static_cast<size_t>(n) > max) {
      ok = false;
      break;
    }
    out->append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return ok;
}

}  // namespace

StoreSettings ReadStoreSettings(const std::string& mode, const std::string& address, uint64_t max_kb,
                                const std::string& host) {
  StoreSettings s;
  s.mode = mode;
  s.address = address;
  if (s.address.empty() && !Env("MASTER_ADDR").empty() && !Env("MASTER_PORT").empty()) {
    const std::string a = Env("MASTER_ADDR");
    s.address = (a.find(':') != std::string::npos ? "[" + a + "]" : a) + ":" + Env("MASTER_PORT");
  }
  s.prefix = store::JobPrefix(Env("TORCHELASTIC_RUN_ID"), Env("TORCHELASTIC_RESTART_COUNT"));
  s.host = trace::SafeHostName(host);
  s.max_dump_bytes = max_kb * 1024;
  const long world = strtol(Env("WORLD_SIZE").c_str(), nullptr, 10);
  const long local = strtol(Env("LOCAL_WORLD_SIZE").c_str(), nullptr, 10);
  s.multi_host = world > 0 && local > 0 && world > local;
  return s;
}

StoreLink::StoreLink(StoreSettings s, std::string dump_dir)
    : s_(std::move(s)), dump_dir_(std::move(dump_dir)) {
  marker_ = dump_dir_ + "/" + kMarkerPrefix + s_.host;
}

StoreLink::~StoreLink() {
  if (wake_fd_ >= 0) close(wake_fd_);
}

bool StoreLink::Start() {
  wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) return false;
  pthread_t t;
  if (StartOwnThread(&t, &StoreLink::Main, this, 0, /*detached=*/true) != 0) return false;
  std::lock_guard<std::mutex> lock(mu_);
  started_ = true;
  return true;
}

void* StoreLink::Main(void* self) {
  StoreLink* link = static_cast<StoreLink*>(self);
  if (WarmAllocator()) link->Run();
  std::lock_guard<std::mutex> lock(link->mu_);
  link->done_ = true;
  link->done_cv_.notify_all();
  return nullptr;
}

void StoreLink::Publish(const trace::DumpRequest& r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    // One that came through the store (written into the directory by this link), or published
    // already: not again.
    if (known_.size() >= 4096 || !known_.insert(r.request).second) return;
    if (outbox_.size() >= 4) return;  // a burst of requests: the first ones make the point
    outbox_.push_back(trace::WriteRequest(r));
  }
  uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!write(wake_fd_, &one, sizeof one);
}

bool StoreLink::Stop(bool clean, int wait_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!started_) return true;
  stop_ = true;
  clean_ = clean;
  uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!write(wake_fd_, &one, sizeof one);
  const bool ended = done_cv_.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return done_; });
  if (clean) unlink(marker_.c_str());  // auto's marker (kept until the end: another host's look may be later)
  return ended;
}

bool StoreLink::Woken(int ms) {
  pollfd p{wake_fd_, POLLIN, 0};
  const uint64_t end = MonoNs() + static_cast<uint64_t>(ms) * 1000000ull;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return true;
    }
    const uint64_t now = MonoNs();
    if (now >= end) return false;
    if (poll(&p, 1, static_cast<int>((end - now) / 1000000ull) + 1) > 0) {
      uint64_t v;
      (void)!read(wake_fd_, &v, sizeof v);
    }
  }
}

bool StoreLink::Detect() {
  if (s_.mode == "on") return true;
  if (!s_.multi_host) {
    LogDebug("NCCLWATCH_STORE=auto: the job runs on one host; the store is not used");
    return false;
  }
  std::string why;
  if (!MakeDirs(dump_dir_, &why) || WriteFileReplacing(marker_, s_.host + "\n", 0644) != 0) {
    LogDebug("NCCLWATCH_STORE=auto: cannot mark %s (%s); the store is not used", dump_dir_.c_str(), why.c_str());
    return false;
  }
  if (Woken(s_.detect_ms > 0 ? s_.detect_ms : Ms(timing::kStoreDetect))) return false;
  DIR* d = opendir(dump_dir_.c_str());
  if (!d) return false;
  std::string other;
  const std::string own = std::string(kMarkerPrefix) + s_.host;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n.rfind(kMarkerPrefix, 0) == 0 && n != own && n.find(".tmp") == std::string::npos) other = n.substr(strlen(kMarkerPrefix));
  }
  closedir(d);
  if (!other.empty()) {
    LogDebug("NCCLWATCH_STORE=auto: host %s writes in %s too (a shared directory); the store is not used", other.c_str(),
             dump_dir_.c_str());
    return false;
  }
  return true;
}

void StoreLink::Run() {
  if (!Detect()) return;
  std::string host;
  int port = 0;
  if (!store::ParseAddress(s_.address, &host, &port)) {
    LogWarn("NCCLWATCH_STORE: no store address (NCCLWATCH_STORE_ADDR, or MASTER_ADDR and MASTER_PORT); this host's "
            "ranks use the dump directory only");
    return;
  }
  store::Client c;
  std::string why;
  const int op_ms = Ms(timing::kStoreOpWait);
  int64_t slot = 0, live = 0, seq = 0;
  if (!c.Connect(host, port, Ms(timing::kStoreConnectWait), &why) || !c.Add(s_.prefix + "hosts", 1, &slot, op_ms) ||
      !c.Set(s_.prefix + "host/" + std::to_string(slot - 1), s_.host, op_ms) ||
      !c.Add(s_.prefix + "live", 1, &live, op_ms) || !c.Add(s_.prefix + "req_seq", 0, &seq, op_ms)) {
    LogWarn("NCCLWATCH_STORE: cannot use the launcher's store at %s (%s); this host's ranks use the dump directory only",
            s_.address.c_str(), why.empty() ? c.error().c_str() : why.c_str());
    return;
  }
  host_slot_ = slot - 1;
  next_request_ = seq + 1;
  linked_.store(true);
  LogInfo("linked to the launcher's store at %s (%s): the job-wide request and this host's dumps go through it",
          s_.address.c_str(), s_.prefix.c_str());
  const int idle_wait = s_.wait_ms > 0 ? s_.wait_ms : Ms(timing::kStoreWait);
  uint64_t scan_until = 0, last_scan = 0;
  for (;;) {
    std::vector<std::string> outbox;
    bool stop = false, clean = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      outbox.swap(outbox_);
      stop = stop_;
      clean = clean_;
    }
    for (const std::string& text : outbox) {
      if (!store::PublishRequest(&c, s_.prefix, text, &why, op_ms)) break;
      requests_.fetch_add(1);
    }
    if (!outbox.empty()) scan_until = MonoNs() + timing::Ns(timing::kStoreScanWindow);
    const uint64_t now = MonoNs();
    if (c.connected() && !stop && now < scan_until && now - last_scan >= timing::Ns(timing::kStoreScanInterval)) {
      last_scan = now;
      ScanAndPublish(&c);
    }
    if (stop) {
      if (clean && c.connected()) Clean(&c);
      // The load this host put on the store (docs: Kubernetes, the measured figures).
      LogInfo("the launcher's store: %llu queries, %llu bytes sent, %llu received, %llu dumps published",
              static_cast<unsigned long long>(c.requests()), static_cast<unsigned long long>(c.bytes_sent()),
              static_cast<unsigned long long>(c.bytes_received()),
              static_cast<unsigned long long>(published_dumps_.load()));
      linked_.store(false);
      return;
    }
    if (!c.connected()) break;
    const bool active = MonoNs() < scan_until;
    const std::string key = s_.prefix + "req/" + std::to_string(next_request_);
    switch (c.Wait(key, active ? Ms(timing::kStoreScanInterval) : idle_wait, wake_fd_)) {
      case store::Client::WaitResult::Ready: {
        std::string text;
        bool found = false;
        if (!c.Get(key, &text, &found, op_ms)) break;
        ++next_request_;
        trace::DumpRequest r;
        if (!found || !trace::ParseRequest(text, &r)) break;
        // Into this host's dump directory, as a shared one would have it: the host's watcher
        // relays it to its ranks, and a rank that stalls now sees this episode asked for. The
        // key's prefix is this job's and attempt's: the request is given this host's instance.
        if (!r.job_instance.empty() && !s_.instance.empty()) r.job_instance = s_.instance;
        bool known = false;
        {
          std::lock_guard<std::mutex> lock(mu_);
          known = !known_.insert(r.request).second;  // ours, back: already in the directory
        }
        if (!known) {
          std::string why;
          int e = MakeDirs(dump_dir_, &why) ? WriteFileReplacing(dump_dir_ + "/" + trace::kDumpRequestFile,
                                                                 trace::WriteRequest(r))
                                            : ENOENT;
          if (e != 0) LogInfo("cannot write the job-wide dump request in %s: %s", dump_dir_.c_str(), strerror(e));
          requests_in_.fetch_add(1);
        }
        scan_until = MonoNs() + timing::Ns(timing::kStoreScanWindow);
        break;
      }
      case store::Client::WaitResult::Woken: {
        uint64_t v;
        (void)!read(wake_fd_, &v, sizeof v);
        break;
      }
      case store::Client::WaitResult::TimedOut:
        break;
      case store::Client::WaitResult::Failed:
        break;
    }
    if (!c.connected()) break;
  }
  linked_.store(false);
  LogWarn("NCCLWATCH_STORE: the launcher's store at %s stopped answering (%s); this host's ranks use the dump "
          "directory only",
          s_.address.c_str(), c.error().c_str());
}

void StoreLink::ScanAndPublish(store::Client* c) {
  DIR* d = opendir(dump_dir_.c_str());
  if (!d) return;
  std::map<std::string, std::pair<int64_t, int64_t>> here;  // name -> (size, mtime)
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (!trace::IsDumpFileName(n) || !OfHost(n, s_.host)) continue;
    struct stat st;
    if (stat((dump_dir_ + "/" + n).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    here[n] = {static_cast<int64_t>(st.st_size),
               static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000ll + st.st_mtim.tv_nsec};
  }
  closedir(d);
  const int op_ms = Ms(timing::kStoreOpWait);
  bool changed = false;
  int sent = 0;
  // Removed here (a process kept its first and latest dumps): removed there too.
  for (auto it = published_.begin(); it != published_.end();) {
    if (here.count(it->first)) {
      ++it;
      continue;
    }
    if (it->second.in_store && !c->Delete(s_.prefix + "dump/" + s_.host + "/" + it->first, op_ms)) return;
    changed = changed || it->second.in_store;
    it = published_.erase(it);
  }
  for (const auto& [name, facts] : here) {
    Published& p = published_[name];
    if (p.size == facts.first && p.mtime_ns == facts.second) continue;
    if (sent >= timing::kStorePublishPerScan) break;  // the rest at the next look
    p.size = facts.first;
    p.mtime_ns = facts.second;
    std::string text, value;
    if (!ReadSmallFile(dump_dir_ + "/" + name, timing::kStoreMaxDumpText, &text) || !store::EncodeDump(text, &value))
      continue;
    if (value.size() > s_.max_dump_bytes || value.size() > store::kMaxValue ||
        published_bytes_ + value.size() > timing::kStoreMaxHostBytes) {
      if (!bound_said_)
        LogWarn("NCCLWATCH_STORE: %s is not published (%zu bytes compressed; NCCLWATCH_STORE_MAX_KB=%llu, at most %zu "
                "MiB a host): it stays in %s",
                name.c_str(), value.size(), static_cast<unsigned long long>(s_.max_dump_bytes / 1024),
                timing::kStoreMaxHostBytes >> 20, dump_dir_.c_str());
      bound_said_ = true;
      continue;
    }
    if (!c->Set(s_.prefix + "dump/" + s_.host + "/" + name, value, op_ms)) return;
    published_bytes_ += value.size();
    p.in_store = true;
    changed = true;
    ++sent;
    published_dumps_.fetch_add(1);
  }
  if (!changed) return;
  std::string list;
  for (const auto& [name, p] : published_)
    if (p.in_store) list += name + "\n";
  c->Set(s_.prefix + "files/" + s_.host, list, op_ms);
}

void StoreLink::Clean(store::Client* c) {
  const int op_ms = Ms(timing::kStoreOpWait);
  for (const auto& [name, p] : published_)
    if (p.in_store && !c->Delete(s_.prefix + "dump/" + s_.host + "/" + name, op_ms)) return;
  int64_t live = 0, seq = 0, hosts = 0;
  if (!c->Delete(s_.prefix + "files/" + s_.host, op_ms) ||
      !c->Delete(s_.prefix + "host/" + std::to_string(host_slot_), op_ms) || !c->Add(s_.prefix + "live", -1, &live, op_ms))
    return;
  if (live <= 0) {  // the last host linked: the job's keys go too
    if (!c->Add(s_.prefix + "req_seq", 0, &seq, op_ms) || !c->Add(s_.prefix + "hosts", 0, &hosts, op_ms)) return;
    for (int64_t n = 1; n <= seq; ++n)
      if (!c->Delete(s_.prefix + "req/" + std::to_string(n), op_ms)) return;
    for (int64_t i = 0; i < hosts; ++i)
      if (!c->Delete(s_.prefix + "host/" + std::to_string(i), op_ms)) return;
    for (const char* k : {"req_seq", "hosts", "live"})
      if (!c->Delete(s_.prefix + k, op_ms)) return;
  }
}

}  // namespace ncclwatch
