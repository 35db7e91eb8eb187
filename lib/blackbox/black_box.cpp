#include "blackbox/black_box.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <new>

#include "common/log.h"

namespace ncclwatch {
namespace blackbox {
namespace {

constexpr size_t kPage = 4096;
size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

namespace {
struct flock BoxLockRange() {
  struct flock lock{};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  lock.l_len = 1;
  return lock;
}
}  // namespace

bool TakeBoxLock(int fd) {
  struct flock lock = BoxLockRange();
  return fcntl(fd, F_SETLK, &lock) == 0;
}

pid_t BoxLockHolder(int fd) {
  struct flock lock = BoxLockRange();
  if (fcntl(fd, F_GETLK, &lock) != 0) return -1;
  return lock.l_type == F_UNLCK ? 0 : lock.l_pid;
}

std::string BoxPrefix(uint32_t uid) { return "ncclwatch-box-" + std::to_string(uid) + "-"; }

std::string BoxFileName(uint32_t uid, int pid, const std::string& process_uid) {
  return BoxPrefix(uid) + std::to_string(pid) + "-" + process_uid;
}

std::string CaretakerLockName(uint32_t uid, const Namespaces& ns) {
  return "ncclwatch-caretaker-" + std::to_string(uid) + "-" + std::to_string(ns.mnt) + "-" + std::to_string(ns.pid) + ".lock";
}

namespace {
uint64_t NamespaceInode(const char* path) {
  struct stat st;
  return stat(path, &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}
}  // namespace

Namespaces OwnNamespaces() {
  static const Namespaces own{NamespaceInode("/proc/self/ns/mnt"), NamespaceInode("/proc/self/ns/pid")};
  return own;
}

bool SameNamespaces(const Namespaces& a, const Namespaces& b) {
  return (a.mnt == 0 || b.mnt == 0 || a.mnt == b.mnt) && (a.pid == 0 || b.pid == 0 || a.pid == b.pid);
}

Layout LayoutFor(uint64_t ring_capacity) {
  Layout h;
  std::memset(&h, 0, sizeof h);
  std::memcpy(h.magic, kMagic, sizeof h.magic);
  h.layout_version = kLayoutVersion;
  h.op_slot_bytes = sizeof(OpSlot);
  h.comm_record_bytes = sizeof(CommRecord);
  h.thread_slot_bytes = sizeof(ThreadSlot);
  size_t at = RoundUp(sizeof(Header), kPage);
  h.identity_offset = at;
  h.identity_capacity = kIdentityBytes;
  at = RoundUp(at + kIdentityBytes, kPage);
  h.ring_offset = at;
  h.ring_capacity = ring_capacity;
  at = RoundUp(at + ring_capacity * sizeof(OpSlot), kPage);
  h.comms_offset = at;
  h.comms_capacity = kCommRecords;
  at = RoundUp(at + kCommRecords * sizeof(CommRecord), kPage);
  h.threads_offset = at;
  h.threads_capacity = ThreadRegistry::kCapacity;
  at = RoundUp(at + ThreadRegistry::kCapacity * sizeof(ThreadSlot), kPage);
  h.sites_offset = at;
  h.sites_capacity = kCallsiteBytes;
  at = RoundUp(at + kCallsiteBytes, kPage);
  h.raw_sites_offset = at;
  h.raw_sites_capacity = kRawCallsites;
  at = RoundUp(at + kRawCallsites * sizeof(RawCallsite), kPage);
  h.modules_offset = at;
  h.modules_capacity = kModulesBytes;
  h.file_bytes = RoundUp(at + kModulesBytes, kPage);
  return h;
}

std::unique_ptr<BlackBox> BlackBox::Create(const std::string& dir, uint64_t ring_capacity, int pid,
                                           const std::string& process_uid, double default_deadline_s,
                                           std::string* why) {
  const uint32_t uid = getuid();
  const std::string name = BoxFileName(uid, pid, process_uid);
  const std::string hidden = dir + "/." + name;
  const Layout layout = LayoutFor(ring_capacity);
  auto fail = [&](const char* step, int err, int fd) -> std::unique_ptr<BlackBox> {
    *why = std::string(step) + " " + hidden + ": " + strerror(err);
    if (fd >= 0) {
      unlink(hidden.c_str());
      close(fd);
    }
    return nullptr;
  };
  const int fd = open(hidden.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return fail("cannot create", errno, -1);
  if (!TakeBoxLock(fd)) return fail("cannot lock", errno, fd);
  // Reserved now: a page first touched on the hot path must never find the file system full.
  if (int e = posix_fallocate(fd, 0, static_cast<off_t>(layout.file_bytes))) return fail("cannot reserve space for", e, fd);
  void* base = mmap(nullptr, layout.file_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return fail("cannot map", errno, fd);

  std::unique_ptr<BlackBox> box(new BlackBox);
  box->base_ = static_cast<char*>(base);
  box->bytes_ = layout.file_bytes;
  Header* h = new (base) Header;
  h->layout = layout;
  h->pid = pid;
  h->uid = uid;
  h->default_deadline_s = default_deadline_s;
  h->global_rank.store(-1);
  h->world_size.store(-1);
  h->ns = OwnNamespaces();
  OpSlot* slots = box->ring();
  for (uint64_t i = 0; i < ring_capacity; ++i) new (&slots[i]) OpSlot;
  CommRecord* comms = box->comms();
  for (size_t i = 0; i < kCommRecords; ++i) new (&comms[i]) CommRecord;
  ThreadSlot* threads = box->threads();
  for (size_t i = 0; i < ThreadRegistry::kCapacity; ++i) new (&threads[i]) ThreadSlot;
  // Visible under its real name only now, complete and locked.
  box->path_ = dir + "/" + name;
  if (rename(hidden.c_str(), box->path_.c_str()) != 0) {
    const int e = errno;
    munmap(base, layout.file_bytes);
    box->base_ = nullptr;
    return fail("cannot rename", e, fd);
  }
  if (!box->fd_.Keep(fd, "the black box's lock")) {
    *why = "cannot identify " + box->path_;
    unlink(box->path_.c_str());
    return nullptr;  // the destructor unmaps it
  }
  return box;
}

BlackBox::~BlackBox() {
  if (base_) munmap(base_, bytes_);
}

bool BlackBox::KeepLocked() {
  if (fd_.StillOurs() || removed_.load()) return true;
  // The same file again (never another one put in its place), locked again.
  const int fd = open(path_.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  struct stat st;
  const bool same = fd >= 0 && fstat(fd, &st) == 0 && st.st_dev == fd_.dev() && st.st_ino == fd_.ino();
  if (same && TakeBoxLock(fd) && fd_.Keep(fd, "the black box's lock")) {
    LogInfo("black box %s: locked again", path_.c_str());
    return true;
  }
  if (fd >= 0) close(fd);
  if (!relock_failed_) LogInfo("black box %s: cannot lock it again yet (retried each second)", path_.c_str());
  relock_failed_ = true;
  return false;
}

OpSlot* BlackBox::ring() const { return reinterpret_cast<OpSlot*>(base_ + header()->layout.ring_offset); }
CommRecord* BlackBox::comms() const { return reinterpret_cast<CommRecord*>(base_ + header()->layout.comms_offset); }
ThreadSlot* BlackBox::threads() const { return reinterpret_cast<ThreadSlot*>(base_ + header()->layout.threads_offset); }

void BlackBox::SetIdentity(const std::string& json) {
  Header* h = header();
  const size_t n = std::min(json.size(), static_cast<size_t>(h->layout.identity_capacity));
  h->identity_bytes.store(0, std::memory_order_release);
  std::memcpy(base_ + h->layout.identity_offset, json.data(), n);
  h->identity_bytes.store(static_cast<uint32_t>(n), std::memory_order_release);
}

void BlackBox::SetRank(int rank, int world_size) {
  header()->global_rank.store(rank, std::memory_order_relaxed);
  header()->world_size.store(world_size, std::memory_order_relaxed);
}

void BlackBox::Alive(int64_t unix_ns, int64_t mono_ns, int64_t states_mono_ns, uint64_t states_recorded) {
  header()->states_mono_ns.store(states_mono_ns, std::memory_order_relaxed);
  header()->states_recorded.store(states_recorded, std::memory_order_relaxed);
  header()->alive_unix_ns.store(unix_ns, std::memory_order_relaxed);
  header()->alive_mono_ns.store(mono_ns, std::memory_order_release);
}

void BlackBox::FinalDumpWritten(int64_t mono_ns) { header()->final_dump_mono_ns.store(mono_ns, std::memory_order_release); }

void BlackBox::MarkEnding(EndingKind how, int status, const char* program) {
  EndingMark& e = header()->ending;
  size_t n = 0;
  if (program)
    for (; program[n] && n + 1 < sizeof e.program; ++n) e.program[n] = program[n];
  e.program[n] = '\0';
  e.status.store(status, std::memory_order_relaxed);
  e.how.store(static_cast<uint32_t>(how), std::memory_order_release);
}

void BlackBox::MarkRecordWritten() { header()->ending.record.store(1, std::memory_order_release); }

void BlackBox::ClearEnding() { header()->ending.how.store(static_cast<uint32_t>(EndingKind::kNone), std::memory_order_release); }

void BlackBox::CountDump() { header()->dumps.fetch_add(1, std::memory_order_relaxed); }

bool BlackBox::AppendCallsite(const std::string& text) {
  Header* h = header();
  const uint64_t used = h->sites_bytes.load(std::memory_order_relaxed);
  const uint32_t len = static_cast<uint32_t>(text.size());
  if (used + sizeof len + len > h->layout.sites_capacity) return false;
  char* at = base_ + h->layout.sites_offset + used;
  std::memcpy(at, &len, sizeof len);
  std::memcpy(at + sizeof len, text.data(), len);
  h->sites_bytes.store(used + sizeof len + len, std::memory_order_release);
  return true;
}

void BlackBox::RecordRawCallsite(int32_t id, const uintptr_t* ips, int native_depth, int python_depth) {
  const Layout& l = header()->layout;
  if (id < 0 || static_cast<uint64_t>(id) >= l.raw_sites_capacity) return;
  auto* site = reinterpret_cast<RawCallsite*>(base_ + l.raw_sites_offset) + id;
  const int depth = std::min<int>(std::max(native_depth, 0), static_cast<int>(kRawCallsiteFrames));
  site->native_depth = static_cast<uint16_t>(depth);
  site->python_depth = static_cast<uint16_t>(std::max(python_depth, 0));
  for (int i = 0; i < depth; ++i) site->ips[i] = ips[i];
  site->published.store(1, std::memory_order_release);
}

void BlackBox::SetModules(const std::string& text) {
  Header* h = header();
  const size_t n = std::min(text.size(), static_cast<size_t>(h->layout.modules_capacity));
  h->modules_bytes.store(0, std::memory_order_release);
  std::memcpy(base_ + h->layout.modules_offset, text.data(), n);
  h->modules_bytes.store(static_cast<uint32_t>(n), std::memory_order_release);
}

std::string ModulesText(const std::vector<BoxModule>& modules) {
  std::string out;
  char line[160];
  for (const BoxModule& m : modules) {
    snprintf(line, sizeof line, "%llx %llx %llx %d %s ", static_cast<unsigned long long>(m.bias),
             static_cast<unsigned long long>(m.lo), static_cast<unsigned long long>(m.hi), m.own ? 1 : 0,
             m.build_id.empty() ? "-" : m.build_id.c_str());
    if (out.size() + strlen(line) + m.path.size() + 1 > kModulesBytes) break;  // the first ones matter most
    out += line;
    out += m.path;
    out += '\n';
  }
  return out;
}

std::vector<BoxModule> ParseModules(const std::string& text) {
  std::vector<BoxModule> out;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) break;  // cut short: its last line is not whole
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    unsigned long long bias, lo, hi;
    int own, used = 0;
    char id[130];
    if (sscanf(line.c_str(), "%llx %llx %llx %d %129s %n", &bias, &lo, &hi, &own, id, &used) < 5 || used <= 0) continue;
    BoxModule m;
    m.bias = bias;
    m.lo = lo;
    m.hi = hi;
    m.own = own != 0;
    m.build_id = std::strcmp(id, "-") == 0 ? "" : id;
    m.path = line.substr(static_cast<size_t>(used));
    out.push_back(std::move(m));
  }
  return out;
}

ProcStat ReadProcStat(int pid) {
  ProcStat out;
  char path[64], text[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", pid);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  const ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return out;
  text[n] = '\0';
  // "pid (comm) state ...": the command may hold spaces and parentheses; the last ')' ends it.
  const char* at = strrchr(text, ')');
  char state = 0;
  unsigned long long start = 0;
  // Fields 3 (state) to 22 (starttime): the 18 between are skipped.
  if (!at || sscanf(at + 1, " %c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu", &state,
                    &start) != 2)
    return out;
  out.exists = true;
  out.state = state;
  out.ended = state == 'Z' || state == 'X';
  out.start_ticks = start;
  // Field 52, exit_code (Linux 3.5 on): 50 fields after the state (field 3).
  const char* p = at + 1;
  int field = 2;
  while (*p && field < 52) {
    while (*p == ' ') ++p;
    if (!*p) break;
    if (++field == 52) {
      out.exit_code = atoi(p);
      break;
    }
    while (*p && *p != ' ') ++p;
  }
  return out;
}

BoxOwner OwnerOf(int pid, uint64_t start_ticks, const struct stat& box) {
  if (start_ticks == 0 || pid <= 0) return BoxOwner::kGone;
  const ProcStat p = ReadProcStat(pid);
  if (!p.exists || p.ended || p.start_ticks != start_ticks) return BoxOwner::kGone;
  // The same process: it maps its box for as long as it runs the program that made it.
  char path[64], line[1024];
  snprintf(path, sizeof path, "/proc/%d/maps", pid);
  FILE* maps = fopen(path, "re");
  if (!maps) return BoxOwner::kRunning;  // cannot tell: a live process is never declared dead
  bool mapped = false;
  while (!mapped && fgets(line, sizeof line, maps)) {
    unsigned dev_major = 0, dev_minor = 0;
    unsigned long long inode = 0;
    mapped = sscanf(line, "%*s %*s %*s %x:%x %llu", &dev_major, &dev_minor, &inode) == 3 && inode == box.st_ino &&
             dev_major == major(box.st_dev) && dev_minor == minor(box.st_dev);
  }
  fclose(maps);
  return mapped ? BoxOwner::kRunning : BoxOwner::kReexecuted;
}

void BlackBox::Remove() {
  if (!removed_.exchange(true)) unlink(path_.c_str());
}

void BlackBox::RemoveIfFinalDumped() {
  if (header()->final_dump_mono_ns.load(std::memory_order_acquire) != 0) Remove();
}

}  // namespace blackbox
}  // namespace ncclwatch
