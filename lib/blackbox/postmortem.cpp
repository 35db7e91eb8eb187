#include "blackbox/postmortem.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "blackbox/black_box.h"
#include "blackbox/elf_symbols.h"
#include "common/clock.h"
#include "common/timing.h"
#include "dump/dump_files.h"
#include "dump/dump_writer.h"
#include "dump/request_relay.h"
#include "format/display.h"
#include "format/dump_reader.h"
#include "record/flight_ring.h"

namespace ncclwatch {
namespace blackbox {
namespace {

using nlohmann::json;

// The time windows of common/timing.h (which says why), in the units this file counts in.
constexpr int64_t kFinalDumpMarginNs = static_cast<int64_t>(timing::Ns(timing::kFinalDumpMargin));
constexpr int64_t kLeftoverMinAgeS = std::chrono::duration_cast<std::chrono::seconds>(timing::kLeftoverMinAge).count();
constexpr int64_t kStoppedLookAfterNs = static_cast<int64_t>(timing::Ns(timing::kStoppedLookAfter));
// Bounds on what is read of another process's file.
constexpr uint64_t kMaxRingCapacity = uint64_t{1} << 24;
constexpr size_t kMaxKernelRecords = 200000;

struct FreeDeleter {
  void operator()(void* p) const { free(p); }
};

// A copy of a black box, checked: every part lies inside it, in the layout this build writes.
struct BoxCopy {
  std::unique_ptr<char, FreeDeleter> bytes;
  const Header* header = nullptr;
  template <typename T>
  T* At(uint64_t offset) const {
    return reinterpret_cast<T*>(bytes.get() + offset);
  }
};

bool Within(uint64_t offset, uint64_t count, uint64_t each, uint64_t total) {
  if (count > total || (each && count > total / each)) return false;
  return offset <= total && count * each <= total - offset;
}

// Reads and checks a box's layout: every part lies inside the file, in the layout this build
// writes.
bool ReadLayout(int fd, Layout* out, std::string* why) {
  struct stat st;
  if (fstat(fd, &st) != 0) return *why = strerror(errno), false;
  Layout& l = *out;
  if (static_cast<size_t>(st.st_size) < sizeof(Header) || pread(fd, &l, sizeof l, 0) != static_cast<ssize_t>(sizeof l))
    return *why = "too short to be a black box", false;
  if (std::memcmp(l.magic, kMagic, sizeof l.magic) != 0) return *why = "not a black box", false;
  const Layout mine = LayoutFor(l.ring_capacity);
  if (l.layout_version < kOldestReadableLayout || l.layout_version > kLayoutVersion || l.op_slot_bytes != mine.op_slot_bytes ||
      l.comm_record_bytes != mine.comm_record_bytes || l.thread_slot_bytes != mine.thread_slot_bytes)
    return *why = "written by another version of ncclwatch", false;
  const uint64_t total = l.file_bytes;
  if (total != static_cast<uint64_t>(st.st_size) || l.ring_capacity == 0 || l.ring_capacity > kMaxRingCapacity ||
      (l.ring_capacity & (l.ring_capacity - 1)) != 0 || !Within(l.ring_offset, l.ring_capacity, sizeof(OpSlot), total) ||
      l.comms_capacity != kCommRecords || !Within(l.comms_offset, l.comms_capacity, sizeof(CommRecord), total) ||
      l.threads_capacity != ThreadRegistry::kCapacity ||
      !Within(l.threads_offset, l.threads_capacity, sizeof(ThreadSlot), total) ||
      !Within(l.sites_offset, l.sites_capacity, 1, total) || !Within(l.identity_offset, l.identity_capacity, 1, total) ||
      l.raw_sites_capacity != kRawCallsites || !Within(l.raw_sites_offset, l.raw_sites_capacity, sizeof(RawCallsite), total) ||
      l.raw_sites_offset % alignof(RawCallsite) != 0 || !Within(l.modules_offset, l.modules_capacity, 1, total) ||
      l.ring_offset % alignof(OpSlot) != 0 || l.comms_offset % alignof(CommRecord) != 0 ||
      l.threads_offset % alignof(ThreadSlot) != 0)
    return *why = "its layout is damaged", false;
  return true;
}

bool ReadBox(int fd, BoxCopy* out, std::string* why) {
  Layout l;
  if (!ReadLayout(fd, &l, why)) return false;
  const uint64_t total = l.file_bytes;
  out->bytes.reset(static_cast<char*>(aligned_alloc(64, (total + 63) / 64 * 64)));
  if (!out->bytes) return *why = "out of memory", false;
  for (uint64_t done = 0; done < total;) {
    const ssize_t n = pread(fd, out->bytes.get() + done, total - done, static_cast<off_t>(done));
    if (n <= 0) return *why = n < 0 ? strerror(errno) : "shorter than its header says", false;
    done += static_cast<uint64_t>(n);
  }
  out->header = out->At<const Header>(0);
  return true;
}

// A live process's identity, read alone: its header and identity text, not its whole box (the
// caretaker looks at every live box of the host each poll).
bool ReadLiveIdentity(int fd, BoxIdentity* out, int* rank = nullptr) {
  Layout l;
  std::string why;
  if (!ReadLayout(fd, &l, &why)) return false;
  Header h;
  if (pread(fd, static_cast<void*>(&h), sizeof h, 0) != static_cast<ssize_t>(sizeof h)) return false;
  if (rank) *rank = h.global_rank.load();
  std::string text(std::min<uint64_t>(h.identity_bytes.load(), l.identity_capacity), '\0');
  return pread(fd, text.data(), text.size(), static_cast<off_t>(l.identity_offset)) == static_cast<ssize_t>(text.size()) &&
         ParseIdentity(text, out);
}

// The header of a box whose layout was checked (ReadLayout): its ending and namespaces.
bool ReadHeader(int fd, Header* h) {
  return pread(fd, static_cast<void*>(h), sizeof *h, 0) == static_cast<ssize_t>(sizeof *h);
}

// Whether a box is of this process's mount and PID namespaces: another container's (a /dev/shm
// shared with --ipc=host) numbers its pid and names its dump directory in its own terms, so it is
// left to a process of its own namespaces. A box that cannot say is taken as ours.
// The namespaces a header records: none (0, taken as ours) unless it is a black box of layout 4
// on (a damaged file is removed as one, not left as another namespace's).
Namespaces NamespacesOf(const Header& h) {
  const bool recorded = std::memcmp(h.layout.magic, kMagic, sizeof h.layout.magic) == 0 &&
                        h.layout.layout_version >= 4 && h.layout.layout_version <= kLayoutVersion;
  return recorded ? h.ns : Namespaces{};
}
bool OursByNamespace(int fd) {
  Header h;
  return !ReadHeader(fd, &h) || SameNamespaces(NamespacesOf(h), OwnNamespaces());
}

// How the process said it ended (EndingMark), read from its header.
struct Ending {
  EndingKind how = EndingKind::kNone;
  int status = 0;
  bool record = false;
  std::string program;
};
Ending EndingOf(const Header& h) {
  Ending e;
  const uint32_t how = h.ending.how.load(std::memory_order_acquire);
  if (how > static_cast<uint32_t>(EndingKind::kExec)) return e;
  e.how = static_cast<EndingKind>(how);
  e.status = h.ending.status.load();
  e.record = h.ending.record.load() != 0;
  e.program.assign(h.ending.program, strnlen(h.ending.program, sizeof h.ending.program));
  return e;
}
bool Exited(const Ending& e) { return e.how == EndingKind::kExit || e.how == EndingKind::kQuickExit; }

// A process gone without marking its box: what the kernel still says of its pid. A zombie not yet
// reaped (its parent has not waited) gives its exit status; else nothing (-1).
int ZombieStatus(int pid, uint64_t start_ticks) {
  if (pid <= 0 || start_ticks == 0) return -1;
  const ProcStat p = ReadProcStat(pid);
  return p.exists && p.ended && p.start_ticks == start_ticks ? p.exit_code : -1;
}

std::string ExitRecordDetail(const Ending& e) {
  return "exit status " + std::to_string(e.status) +
         " (its exit record could not be written by the process; written by its host from its black box)";
}

std::string ExitWord(const Ending& e) {
  return std::string(e.how == EndingKind::kQuickExit ? "left through _exit/quick_exit" : "exited") + " with status " +
         std::to_string(e.status);
}

std::string TextAt(const BoxCopy& box, uint64_t offset, uint64_t capacity, uint64_t length) {
  return std::string(box.At<const char>(offset), std::min(capacity, length));
}

// Where the process's dumps go (absolute), "" unknown.
std::string DumpDirOf(const BoxIdentity& id) {
  if (!id.dump_dir.empty()) return id.dump_dir;
  if (id.dump_fallback.empty()) return std::string();
  return id.cwd.empty() ? id.dump_fallback : id.cwd + "/" + id.dump_fallback;
}

// A later record of call site `into`'s id over an earlier one: the thread that interned it wrote
// its Python frames first (BoxKeeper::NameAtFirstSight), the watchdog the whole site later;
// what the later one lacks (its Python frames not named in time) the earlier one keeps.
void MergeCallsite(trace::Callsite&& later, trace::Callsite* into) {
  if (later.stack.python.empty() && !into->stack.python.empty()) {
    later.stack.python = std::move(into->stack.python);
    later.note = std::move(into->note);
    if (later.python_driven_from.empty()) later.python_driven_from = std::move(into->python_driven_from);
  }
  if (later.stack.native.empty()) later.stack.native = std::move(into->stack.native);
  *into = std::move(later);
}

// The call sites the process resolved, as the format's records (one per id).
std::vector<trace::Callsite> CallsitesOf(const BoxCopy& box) {
  std::vector<trace::Callsite> out;
  std::map<int64_t, size_t> at_id;
  const Layout& l = box.header->layout;
  const uint64_t used = std::min(box.header->sites_bytes.load(), l.sites_capacity);
  for (uint64_t at = 0; at + sizeof(uint32_t) <= used;) {
    uint32_t len;
    std::memcpy(&len, box.At<const char>(l.sites_offset + at), sizeof len);
    at += sizeof len;
    if (len > used - at) break;
    trace::LoadedDump one;
    const std::string_view text(box.At<const char>(l.sites_offset + at), len);
    at += len;
    if (trace::ReadDumpBuffer(text, trace::ReadDepth::kFull, &one).usable && one.detail)
      for (trace::Callsite c : one.detail->callsites) {
        auto [it, added] = at_id.emplace(c.id, out.size());
        if (added) out.push_back(std::move(c));
        else MergeCallsite(std::move(c), &out[it->second]);
      }
  }
  return out;
}

// Call sites its watchdog never resolved (it died first): symbolized here from their raw
// addresses and the modules it had loaded (the files are on this host), one pass over each
// module's symbol table. Own frames at the top go, as the process drops them itself.
void AddRawCallsites(const BoxCopy& box, const std::string& exe, std::vector<trace::Callsite>* sites) {
  const Layout& l = box.header->layout;
  const std::string text(box.At<const char>(l.modules_offset),
                         std::min<uint64_t>(box.header->modules_bytes.load(), l.modules_capacity));
  const std::vector<BoxModule> modules = ParseModules(text);
  auto module_of = [&](uint64_t ip) -> const BoxModule* {
    for (const BoxModule& m : modules)
      if (ip - 1 >= m.lo && ip - 1 < m.hi) return &m;
    return nullptr;
  };
  // Sites resolved whole, and sites whose Python frames alone were written (at first sight).
  std::set<int> have;
  std::map<int, const trace::Callsite*> python_only;
  std::set<int> moved;  // Python-only records that come back whole among `added`
  for (auto& c : *sites) {
    if (c.stack.native.empty()) python_only[static_cast<int>(c.id)] = &c;
    else have.insert(static_cast<int>(c.id));
  }
  const RawCallsite* raw = box.At<const RawCallsite>(l.raw_sites_offset);
  std::vector<trace::Callsite> added;
  std::map<const BoxModule*, std::vector<uint64_t>> wanted;  // module -> addresses in its own terms
  for (uint64_t id = 0; id < l.raw_sites_capacity; ++id) {
    const RawCallsite& r = raw[id];
    if (!r.published.load(std::memory_order_acquire) || have.count(static_cast<int>(id))) continue;
    trace::Callsite cs;
    cs.id = static_cast<int64_t>(id);
    auto named = python_only.find(static_cast<int>(id));
    const bool python_named = named != python_only.end();
    if (python_named) {
      cs = *named->second;
      moved.insert(static_cast<int>(id));
    }
    bool top = true;
    for (int i = 0; i < std::min<int>(r.native_depth, kRawCallsiteFrames); ++i) {
      const uint64_t ip = r.ips[i];
      const BoxModule* m = module_of(ip);
      if (top && m && m->own) continue;
      top = false;
      trace::NativeFrame f;
      f.ip = ip;
      if (m) {
        f.module = m->path.empty() ? exe : m->path;
        f.build_id = m->build_id;
        f.module_offset = ip - m->bias;
        f.offset = f.module_offset;  // until a symbol names it
        wanted[m].push_back(ip - 1 - m->bias);
      }
      cs.stack.native.push_back(std::move(f));
    }
    if (r.python_depth > 0 && !python_named)
      cs.note = "python frames not named: the process died before its watchdog named them";
    added.push_back(std::move(cs));
  }
  sites->erase(std::remove_if(sites->begin(), sites->end(),
                              [&](const trace::Callsite& c) {
                                return c.stack.native.empty() && moved.count(static_cast<int>(c.id));
                              }),
               sites->end());
  std::map<const BoxModule*, std::map<uint64_t, ElfFunction>> named;
  for (auto& [m, addresses] : wanted)
    named[m] = FunctionsAt(m->path.empty() ? exe : m->path, m->build_id, std::move(addresses));
  for (trace::Callsite& cs : added) {
    for (trace::NativeFrame& f : cs.stack.native) {
      const BoxModule* m = module_of(f.ip);
      if (!m) continue;
      const auto& functions = named[m];
      auto it = functions.find(f.ip - 1 - m->bias);
      if (it == functions.end()) continue;
      f.symbol = it->second.name;
      f.offset = f.ip - m->bias - it->second.start;
    }
    sites->push_back(std::move(cs));
  }
}

int64_t Int(const json& j, const char* key, int64_t fallback) {
  auto it = j.find(key);
  return it != j.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}
std::string Str(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

struct Converted {
  std::string dump;
  std::string problem;
};

// The stop its box records, if the process never ran again after its host last saw it stopped.
std::optional<trace::StopKind> RecordedStop(const Header& h) {
  const int64_t last = h.stop.last_mono_ns.load();
  const uint32_t how = h.stop.how.load();
  if (h.stop.first_mono_ns.load() == 0 || last == 0 || h.alive_mono_ns.load() > last ||
      how >= static_cast<uint32_t>(trace::StopKind::Count))
    return std::nullopt;
  return static_cast<trace::StopKind>(how);
}

std::optional<trace::StopRecord> StopRecordOf(const Header& h) {
  const std::optional<trace::StopKind> how = RecordedStop(h);
  if (!how) return std::nullopt;
  return trace::StopRecord{trace::StopKindName(*how), h.stop.first_unix_ns.load(), h.stop.last_unix_ns.load()};
}

// What its black box holds, as a dump of `reason` (postmortem, or a stopped process's stand-in)
// in the process's own dump directory; with `text`, put there instead (a reader's copy).
Converted WriteFromBox(const BoxCopy& box, const BoxIdentity& id, trace::DumpReason reason, const std::string& detail,
                       std::string* text = nullptr, int exit_status = -1) {
  const Header& h = *box.header;
  const Layout& l = h.layout;
  DumpInput in;
  in.reason = reason;
  in.detail = detail;
  in.exit_status = exit_status;
  in.stopped = StopRecordOf(h);
  in.identity.host = id.host;
  in.identity.pid = h.pid;
  in.identity.local_rank = id.local_rank;
  in.identity.job_id = id.job_id;
  in.identity.job_instance = id.job_instance;
  in.identity.process_uid = id.process_uid;
  in.identity.start_unix_ns = static_cast<uint64_t>(id.start_unix_ns);
  in.global_rank = h.global_rank.load();
  in.world_size = h.world_size.load();
  in.nccl_version = id.nccl_version;
  in.cuda_driver_version = id.cuda_driver_version;
  in.dump_seq = h.dumps.load();
  in.start_mono_ns = static_cast<uint64_t>(id.start_mono_ns);
  std::vector<std::unique_ptr<CommInfo>> comms;
  const CommRecord* records = box.At<const CommRecord>(l.comms_offset);
  for (size_t i = 0; i < l.comms_capacity; ++i)
    if (records[i].published.load(std::memory_order_acquire)) comms.push_back(CommInfoOf(records[i]));
  for (auto& c : comms) in.comms.push_back(c.get());

  std::unique_ptr<FlightRing> ring = FlightRing::View(box.At<OpSlot>(l.ring_offset), l.ring_capacity);
  const uint64_t ring_to = ring->recorded();
  const uint64_t ring_from = ring_to > ring->capacity() ? ring_to - ring->capacity() : 0;
  in.ring_capacity = ring->capacity();
  in.ring_recorded = ring->recorded();
  in.ring_overwritten = ring->overwritten();
  std::deque<std::string> names;  // InCall holds a pointer to its function's name
  const ThreadSlot* threads = box.At<const ThreadSlot>(l.threads_offset);
  OpSnapshot op;
  // Its last sign of life: the watchdog's last poll, or anything its threads did after it (an
  // operation issued, a call entered). The dump is as of then, not of this conversion.
  int64_t last_seen = h.alive_mono_ns.load() ? h.alive_mono_ns.load() : id.start_mono_ns;
  for (size_t i = 0; i < l.threads_capacity; ++i) {
    std::string name = ThreadRegistry::CallName(threads[i]);
    if (name.empty()) continue;
    // A call too short for the watchdog to have named it: the operation it was issuing says.
    const uint64_t index1 = threads[i].op_index1.load();
    if (!ThreadRegistry::CallNamed(threads[i]) && index1 && ring->Read(index1 - 1, &op))
      name = std::string("nccl") + trace::OpKindName(op.kind);
    names.push_back(std::move(name));
    in.in_nccl.push_back({threads[i].tid.load(), names.back().c_str(), threads[i].since_ns.load(), index1,
                          threads[i].creating.load()});
    last_seen = std::max(last_seen, static_cast<int64_t>(threads[i].since_ns.load()));
  }
  // The ring as the watchdog last saw it: an operation recorded after its last poll began was
  // enqueued by its thread, but what its GPU did with it is unknown, unless its call had not
  // returned (the thread inside NCCL says where it was).
  for (uint64_t i = ring_from; i < ring_to; ++i) {
    if (!ring->Read(i, &op)) continue;
    last_seen = std::max(last_seen, static_cast<int64_t>(op.enqueue_ns));
    bool in_call = false;
    for (const auto& call : in.in_nccl) in_call = in_call || call.op_index1 == i + 1;
    if (op.state == trace::OpState::Enqueued && i >= h.states_recorded.load() && !in_call) op.state = trace::OpState::Unknown;
    in.ring.push_back(op);
  }
  const int64_t alive_mono = h.alive_mono_ns.load();
  in.time_mono_ns = static_cast<uint64_t>(last_seen);
  in.time_unix_ns = static_cast<uint64_t>(alive_mono ? h.alive_unix_ns.load() + (last_seen - alive_mono)
                                                     : id.start_unix_ns + (last_seen - id.start_mono_ns));
  in.states_as_of_mono_ns = h.states_mono_ns.load();

  for (const OpSnapshot& o : in.ring) {
    const bool pending = o.state == trace::OpState::PendingLaunch || o.state == trace::OpState::Enqueued ||
                         o.state == trace::OpState::GpuReached || o.state == trace::OpState::Unknown;
    if (!pending) continue;
    InflightView v;
    v.op = o;
    v.age_s = last_seen > static_cast<int64_t>(o.enqueue_ns) ? (last_seen - static_cast<int64_t>(o.enqueue_ns)) / 1e9 : 0;
    v.deadline_s = h.default_deadline_s;
    v.stalled = v.age_s > v.deadline_s;
    for (const auto& call : in.in_nccl) v.host_blocked = v.host_blocked || call.op_index1 == o.index + 1;
    in.inflight.push_back(v);
  }
  in.callsites = CallsitesOf(box);
  AddRawCallsites(box, id.exe, &in.callsites);
  in.exe = id.exe;
  in.cwd = id.cwd;
  in.cmdline = id.cmdline;
  in.environment = id.environment;

  Converted result;
  if (text) {
    StreamDump(in, [&](std::string* piece) {
      text->append(*piece);
      return true;
    });
    return result;
  }
  if (id.dump_dir.empty() && id.dump_fallback.empty()) {
    result.problem = "its dump directory is not known";
    return result;
  }
  // Where the process itself would have written: relative paths (and the default directory,
  // NCCLWATCH_DIR unset) from its own working directory at start, not the caretaker's.
  // A tree the process's application removed (its working directory) is not created again.
  DumpDirectory dir(id.dump_dir, id.dump_fallback, 0, id.cwd, id.dump_anchor);
  result.dump = dir.Write(
      DumpFileStem(in), [&](const trace::TextSink& sink) { return StreamDump(in, sink); }, /*counted=*/false);
  if (result.dump.empty())
    result.problem = "no dump could be written in " + (id.dump_dir.empty() ? id.dump_fallback : id.dump_dir);
  return result;
}

int64_t AgeS(const struct stat& st) {
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return now.tv_sec - st.st_mtim.tv_sec;
}

// Opens `path` for the lock test: only this user's regular files, never through a link.
int OpenOwn(const std::string& path, struct stat* st) {
  const int fd = open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return -1;
  if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode) || st->st_uid != getuid()) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string Base(const std::string& name, const std::string& suffix) {
  return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0
             ? name.substr(0, name.size() - suffix.size())
             : std::string();
}

bool StartsWith(const std::string& s, const std::string& prefix) { return s.compare(0, prefix.size(), prefix) == 0; }

std::string Who(int rank, int pid, const std::string& host) {
  return "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + " on " + (host.empty() ? "this host" : host) + ")";
}

// Up to 4 KiB of a small file (/proc, cgroup files); "" when it cannot be read.
std::string SmallFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return std::string();
  char buf[4096];
  const ssize_t n = read(fd, buf, sizeof buf);
  close(fd);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// The header of a live box, mapped to mark it: the process never reads the mark, and no two
// caretakers mark at once (flock), but `ncclwatch run` may look too: the stand-in is claimed.
class MappedHeader {
 public:
  explicit MappedHeader(int fd)
      : base_(mmap(nullptr, sizeof(Header), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)) {}
  ~MappedHeader() {
    if (base_ != MAP_FAILED) munmap(base_, sizeof(Header));
  }
  MappedHeader(const MappedHeader&) = delete;
  MappedHeader& operator=(const MappedHeader&) = delete;
  Header* get() const { return base_ == MAP_FAILED ? nullptr : static_cast<Header*>(base_); }

 private:
  void* base_;
};

// The relay file a process opens (RequestRelay): the one of its dump directory's request file
// and its host, in `relay_dir`.
std::string RelayOf(const BoxIdentity& id, const std::string& relay_dir) {
  DumpDirectory dir(id.dump_dir, id.dump_fallback, 0, id.cwd);
  std::string request = dir.RequestPath();
  if (!request.empty() && request[0] != '/' && !id.cwd.empty()) request = id.cwd + "/" + request;
  return relay_dir + "/" + RelayFileName(request, id.host);
}

// When a live process was last seen running: its watchdog's last poll, else (it has not polled
// yet: stopped or killed in its first moments) its start.
int64_t LastSignOfLife(const Header& h, const BoxIdentity& id) {
  const int64_t alive = h.alive_mono_ns.load();
  return alive != 0 ? alive : id.start_mono_ns;
}

// A live process (its box locked) that cannot run: its stop is marked in its box; once a
// job-wide request written after its last sign of life waits for it, or it has been silent past
// its deadline, a stand-in dump is written for it from its box, once per stop. Nothing when it
// runs: its watchdog polled within a second, or /proc says it runs.
std::optional<Conversion> CareForStopped(int fd, const std::string& path, const BoxIdentity& id) {
  Header h;
  if (pread(fd, static_cast<void*>(&h), sizeof h, 0) != static_cast<ssize_t>(sizeof h)) return std::nullopt;
  const int64_t alive = LastSignOfLife(h, id);
  const int64_t now = static_cast<int64_t>(MonoNs());
  if (now - alive < kStoppedLookAfterNs) return std::nullopt;
  // The lock's holder as this process's PID namespace numbers it (the box's pid is its own).
  const pid_t holder = BoxLockHolder(fd);
  if (holder <= 0) return std::nullopt;
  const std::optional<trace::StopKind> how = StopOf(holder);
  if (!how) return std::nullopt;
  MappedHeader mapped(fd);
  Header* live = mapped.get();
  if (!live) return std::nullopt;
  StopMark& mark = live->stop;
  const int64_t unix_now = static_cast<int64_t>(UnixNs());
  if (mark.first_mono_ns.load() == 0 || live->alive_mono_ns.load() > mark.last_mono_ns.load()) {  // a new stop
    mark.stand_in_mono_ns.store(0);
    mark.first_unix_ns.store(unix_now);
    mark.first_mono_ns.store(now);
  }
  mark.how.store(static_cast<uint32_t>(*how));
  mark.last_unix_ns.store(unix_now);
  mark.last_mono_ns.store(now);
  if (mark.stand_in_mono_ns.load() != 0) return std::nullopt;  // said once a stop
  const bool past_deadline = h.default_deadline_s > 0 && now - alive >= static_cast<int64_t>(h.default_deadline_s * 1e9);
  bool asked = false;
  if (!past_deadline && !(id.dump_dir.empty() && id.dump_fallback.empty())) {
    DumpDirectory dir(id.dump_dir, id.dump_fallback, 0, id.cwd);
    const std::optional<trace::DumpRequest> r = dir.CurrentRequest();
    asked = r && (r->job_instance.empty() || id.job_instance.empty() || r->job_instance == id.job_instance) &&
            r->time_unix_ns > (h.alive_unix_ns.load() != 0 ? h.alive_unix_ns.load() : id.start_unix_ns);
  }
  int64_t unclaimed = 0;
  if ((!past_deadline && !asked) || !mark.stand_in_mono_ns.compare_exchange_strong(unclaimed, now)) return std::nullopt;
  Conversion c;
  c.box = path;
  c.stopped = true;
  c.pid = h.pid;
  c.rank = h.global_rank.load();
  c.job_instance = id.job_instance;
  const std::string who = Who(c.rank, h.pid, id.host) + " is " + trace::StopKindText(*how) + ": it answers no dump request";
  BoxCopy box;
  std::string why;
  if (!ReadBox(fd, &box, &why)) {
    c.line = who + "; its black box cannot be read (" + why + ")";
    return c;
  }
  Converted w = WriteFromBox(box, id, trace::DumpReason::Stopped,
                            trace::StopKindText(*how) + ", seen by its host; what its black box held at its last sign of life");
  c.dump = w.dump;
  c.line = w.dump.empty() ? who + "; no stand-in dump could be written (" + w.problem + ")"
                          : who + "; a stand-in dump from its black box is " + w.dump;
  return c;
}

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) out.push_back(e->d_name);
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::string IdentityJson(const BoxIdentity& id) {
  json j = {{"host", id.host},
            {"pid", id.pid},
            {"local_rank", id.local_rank},
            {"job_id", id.job_id},
            {"job_instance", id.job_instance},
            {"process_uid", id.process_uid},
            {"start_unix_ns", id.start_unix_ns},
            {"start_mono_ns", id.start_mono_ns},
            {"start_ticks", id.start_ticks},
            {"nccl_version", id.nccl_version},
            {"cuda_driver_version", id.cuda_driver_version},
            {"exe", id.exe},
            {"cwd", id.cwd},
            {"cmdline", id.cmdline},
            {"dump_dir", id.dump_dir},
            {"dump_fallback", id.dump_fallback},
            {"dump_anchor", id.dump_anchor},
            {"relay", id.relay}};
  json env = json::array();
  for (const auto& kv : id.environment) env.push_back({kv.first, kv.second});
  j["environment"] = env;
  std::string text = j.dump(-1, ' ', false, json::error_handler_t::replace);
  if (text.size() > kIdentityBytes) {  // a huge command line: the identity matters more
    j["cmdline"] = json::array({"<command line too long for the black box>"});
    j["environment"] = json::array();
    text = j.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  return text;
}

bool ParseIdentity(const std::string& text, BoxIdentity* out) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return false;
  out->host = Str(j, "host");
  out->pid = static_cast<int>(Int(j, "pid", 0));
  out->local_rank = static_cast<int>(Int(j, "local_rank", -1));
  out->job_id = Str(j, "job_id");
  out->job_instance = Str(j, "job_instance");
  out->process_uid = Str(j, "process_uid");
  out->start_unix_ns = Int(j, "start_unix_ns", 0);
  out->start_mono_ns = Int(j, "start_mono_ns", 0);
  out->start_ticks = static_cast<uint64_t>(std::max<int64_t>(Int(j, "start_ticks", 0), 0));
  out->nccl_version = static_cast<int>(Int(j, "nccl_version", 0));
  out->cuda_driver_version = static_cast<int>(Int(j, "cuda_driver_version", 0));
  out->exe = Str(j, "exe");
  out->cwd = Str(j, "cwd");
  out->dump_dir = Str(j, "dump_dir");
  out->dump_fallback = Str(j, "dump_fallback");
  out->dump_anchor = Str(j, "dump_anchor");
  out->relay = Str(j, "relay");
  if (auto it = j.find("cmdline"); it != j.end() && it->is_array())
    for (const auto& a : *it)
      if (a.is_string()) out->cmdline.push_back(a.get<std::string>());
  if (auto it = j.find("environment"); it != j.end() && it->is_array())
    for (const auto& kv : *it)
      if (kv.is_array() && kv.size() == 2 && kv[0].is_string() && kv[1].is_string())
        out->environment.emplace_back(kv[0].get<std::string>(), kv[1].get<std::string>());
  return true;
}

std::string FindOomLine(const std::vector<std::string>& records, int pid) {
  const std::string killed = "Killed process " + std::to_string(pid) + " ";
  const std::string task = ",pid=" + std::to_string(pid) + ",";
  std::string found;
  for (const std::string& r : records) {
    std::string message = r.substr(r.find(';') == std::string::npos ? 0 : r.find(';') + 1);
    message = message.substr(0, message.find('\n'));
    if (message.find(killed) != std::string::npos) return message;  // the kill itself says the most
    if (found.empty() && message.find("oom-kill:") != std::string::npos && message.find(task) != std::string::npos)
      found = message;
  }
  return found;
}

std::string KernelOomLine(int pid) {
  const int fd = open("/dev/kmsg", O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return std::string();
  std::vector<std::string> records;
  char buf[8192];
  for (size_t i = 0; i < kMaxKernelRecords; ++i) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EPIPE) continue;  // overwritten while read: the next one follows
    if (n <= 0) break;
    std::string record(buf, static_cast<size_t>(n));
    if (record.find("Killed process") != std::string::npos || record.find("oom-kill:") != std::string::npos)
      records.push_back(std::move(record));
  }
  close(fd);
  return FindOomLine(records, pid);
}

std::string HowItEnded(const std::string& oom_line, const std::optional<trace::StopKind>& stopped, int zombie_status) {
  if (zombie_status >= 0 && !stopped) {
    if (WIFSIGNALED(zombie_status)) {
      const char* abbrev = sigabbrev_np(WTERMSIG(zombie_status));
      const std::string sig = abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(WTERMSIG(zombie_status));
      return "ended without a word: killed by " + sig +
             (oom_line.empty() ? std::string(" (its kernel status, read before it was reaped)")
                               : " by the kernel's OOM killer (" + oom_line + ")");
    }
    if (WIFEXITED(zombie_status))
      return "ended without a word: exited with status " + std::to_string(WEXITSTATUS(zombie_status)) +
             " without an exit record (an exit past the C library: a raw exit_group system call)";
  }
  if (stopped)
    return "was " + trace::StopKindText(*stopped) + ", then killed while stopped" +
           (oom_line.empty() ? std::string(" (SIGKILL: its launcher's or a user's)")
                             : " by the kernel's OOM killer (" + oom_line + ")");
  if (!oom_line.empty()) return "killed by the kernel's OOM killer (" + oom_line + ")";
  // Nothing says which: an exit that bypasses the C library (a raw exit_group) leaves no more
  // than a SIGKILL does, once its parent has reaped it.
  return "ended without a word: SIGKILL, the OOM killer or a raw exit_group (no exit record; the cause is not known)";
}

std::vector<LeftBox> ReadDeadBoxes(const std::string& box_dir, const std::function<bool(const LeftBox&)>& wanted) {
  std::vector<LeftBox> out;
  if (box_dir.empty() || box_dir == "none") return out;
  const std::string prefix = BoxPrefix(getuid());
  for (const std::string& name : Names(box_dir)) {
    if (!StartsWith(name, prefix)) continue;  // hidden ones are being created: nothing in them
    const std::string path = box_dir + "/" + name;
    const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat st;
    // Whether its process holds its lock, asked without taking it.
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != getuid() || BoxLockHolder(fd) != 0) {
      close(fd);
      continue;
    }
    // A free lock without a death (the process re-locks its box, or re-executed itself: see
    // ConvertDeadBoxes): nothing left.
    BoxIdentity owner;
    LeftBox left;
    left.box = path;
    const bool known = ReadLiveIdentity(fd, &owner, &left.rank);
    Header head;
    const Ending ending = known && ReadHeader(fd, &head) ? EndingOf(head) : Ending{};
    // Another namespace's (a container sharing /dev/shm): its pid and dump directory are not ours.
    // A process that execs another program, or exited with its record out: nothing to tell.
    if ((known && (!SameNamespaces(NamespacesOf(head), OwnNamespaces()) ||
                   OwnerOf(owner.pid, owner.start_ticks, st) != BoxOwner::kGone)) ||
        ending.how == EndingKind::kExec || (Exited(ending) && ending.record)) {
      close(fd);
      continue;
    }
    // Whose it is, from its identity alone: a box the caller does not want (another job's; a
    // host keeps every job's) is not read whole.
    if (known) {
      left.pid = owner.pid;
      left.job_instance = owner.job_instance;
      left.dump_dir = DumpDirOf(owner);
    }
    if (wanted && !wanted(left)) {
      close(fd);
      continue;
    }
    BoxCopy box;
    if (!ReadBox(fd, &box, &left.problem)) {
      close(fd);
      out.push_back(std::move(left));
      continue;
    }
    close(fd);
    const Header& h = *box.header;
    BoxIdentity id;
    ParseIdentity(TextAt(box, h.layout.identity_offset, h.layout.identity_capacity, h.identity_bytes.load()), &id);
    left.pid = h.pid;
    left.rank = h.global_rank.load();
    left.job_instance = id.job_instance;
    left.dump_dir = DumpDirOf(id);
    const int64_t final_dump = h.final_dump_mono_ns.load();
    if (Exited(ending))
      WriteFromBox(box, id, trace::DumpReason::Exit, ExitRecordDetail(ending), &left.dump, ending.status);
    else if (!(final_dump && h.alive_mono_ns.load() - final_dump < kFinalDumpMarginNs))
      WriteFromBox(box, id, trace::DumpReason::Postmortem,
                   HowItEnded(KernelOomLine(h.pid), RecordedStop(h), ZombieStatus(h.pid, id.start_ticks)), &left.dump);
    out.push_back(std::move(left));
  }
  return out;
}


std::optional<trace::StopKind> StopOfState(char state) {
  switch (state) {
    case 'T': return trace::StopKind::Stopped;
    case 't': return trace::StopKind::Traced;
    default: return std::nullopt;
  }
}

bool CgroupFrozen(const std::string& proc_cgroup, const std::string& cgroup_root) {
  std::istringstream lines(proc_cgroup);
  std::string line;
  while (std::getline(lines, line)) {  // hierarchy:controllers:path
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), cgroup = line.substr(b + 1);
    if (cgroup.empty() || cgroup[0] != '/' || cgroup.find("/..") != std::string::npos) continue;
    if (controllers.empty()) {  // v2 (unified, or beside v1 under unified/)
      for (const char* mount : {"", "/unified"}) {
        const std::string events = SmallFile(cgroup_root + mount + cgroup + "/cgroup.events");
        if (("\n" + events).find("\nfrozen 1") != std::string::npos) return true;
      }
    } else if (("," + controllers + ",").find(",freezer,") != std::string::npos) {
      if (SmallFile(cgroup_root + "/freezer" + cgroup + "/freezer.state").rfind("FROZEN", 0) == 0) return true;
    }
  }
  return false;
}

std::optional<trace::StopKind> StopOf(int pid) {
  const ProcStat stat = ReadProcStat(pid);
  if (!stat.exists || stat.ended) return std::nullopt;
  if (auto how = StopOfState(stat.state)) return how;
  if (CgroupFrozen(SmallFile("/proc/" + std::to_string(pid) + "/cgroup"), "/sys/fs/cgroup")) return trace::StopKind::Frozen;
  return std::nullopt;
}


std::vector<Conversion> CareForStoppedBoxes(const std::string& box_dir, const std::string& own_box) {
  std::vector<Conversion> out;
  if (box_dir.empty() || box_dir == "none") return out;
  const std::string prefix = BoxPrefix(getuid());
  const int64_t now = static_cast<int64_t>(MonoNs());
  for (const std::string& name : Names(box_dir)) {
    if (!StartsWith(name, prefix) || name == own_box) continue;  // own: closing a descriptor drops its lock
    const std::string path = box_dir + "/" + name;
    struct stat st;
    const int fd = OpenOwn(path, &st);
    if (fd < 0) continue;
    Header h;
    BoxIdentity id;
    // A process whose watchdog has not polled yet is quiet since its start (its identity says).
    const bool read = pread(fd, static_cast<void*>(&h), sizeof h, 0) == static_cast<ssize_t>(sizeof h);
    const bool polled = read && h.alive_mono_ns.load() != 0;
    const bool quiet = read && (polled ? now - h.alive_mono_ns.load() >= kStoppedLookAfterNs
                                       : ReadLiveIdentity(fd, &id) && now - id.start_mono_ns >= kStoppedLookAfterNs);
    // Only a live box (its lock held; a dead one is the caretaker's) of a process gone quiet.
    if (quiet && SameNamespaces(NamespacesOf(h), OwnNamespaces()) && BoxLockHolder(fd) > 0 && (!polled || ReadLiveIdentity(fd, &id)))
      if (std::optional<Conversion> c = CareForStopped(fd, path, id)) out.push_back(std::move(*c));
    close(fd);
  }
  return out;
}

bool BoxesNeedCare(const std::string& box_dir, const std::string& own_box) {
  if (box_dir.empty() || box_dir == "none") return false;
  char prefix[48];
  const int plen = snprintf(prefix, sizeof prefix, "ncclwatch-box-%u-", static_cast<unsigned>(getuid()));
  const int dir = open(box_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) return false;
  struct Entry {  // linux_dirent64
    uint64_t ino;
    int64_t off;
    unsigned short reclen;
    unsigned char type;
    char name[1];
  };
  alignas(8) char buf[2048];  // getdents64, not readdir: opendir allocates
  const int64_t now = static_cast<int64_t>(MonoNs());
  bool work = false;
  long n;
  while (!work && (n = syscall(SYS_getdents64, dir, buf, sizeof buf)) > 0) {
    for (long at = 0; at < n && !work;) {
      const Entry* e = reinterpret_cast<const Entry*>(buf + at);
      at += e->reclen;
      const char* name = e->name;
      if (name[0] == '.' && strncmp(name + 1, prefix, plen) == 0) {
        work = true;  // being created, or a leftover: the pass decides
        continue;
      }
      if (strncmp(name, prefix, plen) != 0 || own_box == name) continue;
      const int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
      if (fd < 0) continue;
      struct stat st;
      Header h;
      if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == getuid()) {
        const pid_t holder = BoxLockHolder(fd);
        if (holder == 0) {
          work = true;  // its process died (or is locking it again)
        } else if (holder > 0 && pread(fd, static_cast<void*>(&h), sizeof h, 0) == static_cast<ssize_t>(sizeof h)) {
          const int64_t alive = h.alive_mono_ns.load();
          work = alive == 0 || now - alive >= kStoppedLookAfterNs;  // not polled yet, or quiet
        }
      }
      close(fd);
    }
  }
  close(dir);
  return work;
}

CaretakerPass ConvertDeadBoxes(const std::string& box_dir, const std::string& relay_dir, const std::string& own_box) {
  CaretakerPass pass;
  if (box_dir.empty() || box_dir == "none") return pass;
  const uint32_t uid = getuid();
  const std::string prefix = BoxPrefix(uid);
  std::set<std::string> watched_relays;  // named by a live process
  // A live process that names no relay yet may be opening one right now (its lock file created,
  // not yet locked): the relay it opens is the one of its dump directory and host, which its
  // identity says, and that one is left alone. Only a process whose identity cannot be read yet
  // (its box being created) leaves every relay younger than kLeftoverMinAgeS alone. Any other
  // unwatched relay is a leftover however young (a job killed seconds after it started, the next
  // one gone before they age).
  bool someone_starting = false;
  for (const std::string& name : Names(box_dir)) {
    const bool hidden = StartsWith(name, "." + prefix);
    if (!hidden && !StartsWith(name, prefix)) continue;
    if (name == own_box) continue;  // closing any descriptor of it would drop our own lock
    const std::string path = box_dir + "/" + name;
    struct stat st;
    const int fd = OpenOwn(path, &st);
    if (fd < 0) continue;
    if (!TakeBoxLock(fd)) {  // alive: what it watches, and whether it can run
      BoxIdentity id;
      const bool known = !hidden && ReadLiveIdentity(fd, &id);
      if (known && !id.relay.empty()) watched_relays.insert(id.relay);
      else if (known && relay_dir != "none") watched_relays.insert(RelayOf(id, relay_dir));
      else someone_starting = true;
      if (known && OursByNamespace(fd))
        if (std::optional<Conversion> c = CareForStopped(fd, path, id)) pass.converted.push_back(std::move(*c));
      close(fd);
      continue;
    }
    if (!hidden && !OursByNamespace(fd)) {  // another container's dead: its own caretaker's
      close(fd);  // gives its lock back
      continue;
    }
    if (hidden) {  // killed while creating it: nothing in it yet
      if (AgeS(st) >= kLeftoverMinAgeS && unlink(path.c_str()) == 0) ++pass.removed_leftovers;
      close(fd);
      continue;
    }
    Conversion c;
    c.box = path;
    // A free lock without a death: the process closed the box's descriptor (it takes the lock
    // again itself), or it re-executed itself and its new program has a box of its own.
    BoxIdentity owner;
    Ending ending;
    if (ReadLiveIdentity(fd, &owner, &c.rank)) {
      Header head;
      if (ReadHeader(fd, &head)) ending = EndingOf(head);
      const BoxOwner now = OwnerOf(owner.pid, owner.start_ticks, st);
      if (now == BoxOwner::kRunning) {
        if (!owner.relay.empty()) watched_relays.insert(owner.relay);
        close(fd);  // gives its lock back
        continue;
      }
      // An execve: the process went on in another program (running now, or ended since), which
      // is no death of this one's.
      if (now == BoxOwner::kReexecuted || ending.how == EndingKind::kExec) {
        c.pid = owner.pid;
        c.job_instance = owner.job_instance;
        c.ended = false;
        c.line = "rank " + std::to_string(c.rank) + " (pid " + std::to_string(owner.pid) + ") " +
                 "re-executed itself" +
                 (ending.how == EndingKind::kExec ? " (exec of " + trace::PrintableCut(ending.program) + ")" : std::string()) +
                 ": removed the black box of its earlier program";
        unlink(path.c_str());
        close(fd);
        pass.converted.push_back(std::move(c));
        continue;
      }
    }
    BoxCopy box;
    std::string why;
    BoxIdentity id;
    if (!ReadBox(fd, &box, &why)) {
      c.line = "removed the black box " + path + ": " + why;
    } else {
      const Header& h = *box.header;
      ParseIdentity(TextAt(box, h.layout.identity_offset, h.layout.identity_capacity, h.identity_bytes.load()), &id);
      c.pid = h.pid;
      c.rank = h.global_rank.load();
      c.job_instance = id.job_instance;
      const int64_t final_dump = h.final_dump_mono_ns.load();
      const std::optional<trace::StopKind> stopped = RecordedStop(h);
      const std::string who = Who(c.rank, h.pid, id.host) +
                              (stopped ? " was " + trace::StopKindText(*stopped) + ", then ended without a word"
                                       : std::string(" ended without a word"));
      if (Exited(ending) && ending.record) {
        // Its box could not be removed (setresuid, chroot since): its record is out all the same.
        c.ended = false;
        c.line = Who(c.rank, h.pid, id.host) + " " + ExitWord(ending) + " and wrote its exit record: removed its black box";
      } else if (Exited(ending)) {
        // Its record could not be written (out of memory, a directory out of its reach): written
        // here, from its box, with the status it exited with.
        Converted w = WriteFromBox(box, id, trace::DumpReason::Exit, ExitRecordDetail(ending), nullptr, ending.status);
        c.dump = w.dump;
        const std::string said = Who(c.rank, h.pid, id.host) + " " + ExitWord(ending) + " without writing its exit record";
        c.line = w.dump.empty() ? said + "; it could not be written from its black box either (" + w.problem + ")"
                                : said + "; written from its black box: " + w.dump;
      } else if (final_dump && h.alive_mono_ns.load() - final_dump < kFinalDumpMarginNs) {
        c.line = Who(c.rank, h.pid, id.host) + " dumped at its end: removed its black box";
      } else {
        Converted w = WriteFromBox(box, id, trace::DumpReason::Postmortem,
                                   HowItEnded(KernelOomLine(h.pid), stopped, ZombieStatus(h.pid, id.start_ticks)));
        c.dump = w.dump;
        c.line = w.dump.empty() ? who + "; its black box could not be converted (" + w.problem + ")"
                                : who + "; its black box is now " + w.dump;
      }
    }
    unlink(path.c_str());
    close(fd);
    pass.converted.push_back(std::move(c));
  }
  if (relay_dir.empty() || relay_dir == "none") return pass;
  const std::string relay_prefix = "ncclwatch-relay-" + std::to_string(uid) + "-";
  const int64_t min_age_s = someone_starting ? kLeftoverMinAgeS : 0;
  const std::vector<std::string> relay_names = Names(relay_dir);
  for (const std::string& name : relay_names) {
    if (StartsWith(name, ".tmp-" + relay_prefix)) {
      // A relay being written (WriteFileReplacing: ".tmp-NAME-PID", renamed within microseconds)
      // by a process killed meanwhile: its writer is gone, or it is old.
      struct stat st;
      const std::string path = relay_dir + "/" + name;
      const int writer = atoi(name.substr(name.rfind('-') + 1).c_str());
      if (lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == uid &&
          (AgeS(st) >= kLeftoverMinAgeS || (writer > 0 && kill(writer, 0) != 0 && errno == ESRCH)) &&
          unlink(path.c_str()) == 0)
        ++pass.removed_leftovers;
      continue;
    }
    if (!StartsWith(name, relay_prefix)) continue;
    const std::string base = Base(name, ".lock");
    if (base.empty()) {
      // A relay without its lock file (a second watcher wrote it after the first left, then was
      // killed): nobody can be electing a watcher for it.
      if (name.find(".tmp") != std::string::npos || watched_relays.count(relay_dir + "/" + name) ||
          std::binary_search(relay_names.begin(), relay_names.end(), name + ".lock"))
        continue;
      struct stat st;
      const std::string path = relay_dir + "/" + name;
      if (lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == uid && AgeS(st) >= min_age_s &&
          unlink(path.c_str()) == 0)
        ++pass.removed_leftovers;
      continue;
    }
    if (watched_relays.count(relay_dir + "/" + base)) continue;
    const std::string lock_path = relay_dir + "/" + name;
    struct stat st;
    const int fd = OpenOwn(lock_path, &st);
    if (fd < 0) continue;
    // Nobody watches it (a watcher holds the flock for the life of its process) and it is not new.
    if (AgeS(st) >= min_age_s && flock(fd, LOCK_EX | LOCK_NB) == 0) {
      if (unlink((relay_dir + "/" + base).c_str()) == 0) ++pass.removed_leftovers;
      if (unlink(lock_path.c_str()) == 0) ++pass.removed_leftovers;
    }
    close(fd);
  }
  return pass;
}

}  // namespace blackbox
}  // namespace ncclwatch
