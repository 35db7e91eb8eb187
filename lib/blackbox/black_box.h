// The black box: what the library already keeps about a process (the flight ring, each
// communicator's sequence state, which thread is inside which NCCL call, the interned call
// sites as text) lives in one node-local file mapping, written as the process goes. The ring
// is the mapping, not a copy. Another process on the host reads it after this one is gone
// without a word (SIGKILL, the OOM killer) and turns it into a `postmortem` dump (postmortem.h).
//
// Lifetime: created at start (under a hidden name, locked, then renamed into place, so that no
// reader ever sees it unlocked while its process lives), a POSIX record lock held for the life
// of the process (released by the kernel however the process ends; not inherited by forked
// children; also released when the application closes the descriptor, and taken again within a
// second: KeepLocked; an execve drops it for good: OwnerOf tells that from a death), removed at a
// normal exit. The file is the user's own, 0600; its space is
// reserved up front (a full /dev/shm is a line at start, never a SIGBUS on the hot path).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <sys/stat.h>

#include "common/kept_fd.h"
#include "record/comm_registry.h"
#include "record/op_record.h"
#include "record/thread_registry.h"

namespace ncclwatch {
namespace blackbox {

constexpr char kMagic[16] = "ncclwatch-bbox";
// 2: when the watchdog last mirrored op states, raw call sites, the module list.
// 3: the caretaker's record of the process seen stopped (Header::stop).
// 4: how the process ended, in its own word (Header::ending), and its namespaces (Header::ns).
//    A version 3 box reads as one with neither (its header's page is zero past StopMark).
constexpr uint32_t kLayoutVersion = 4;
constexpr uint32_t kOldestReadableLayout = 3;
constexpr size_t kCommRecords = 1024;
constexpr size_t kCallsiteBytes = 256 * 1024;
constexpr size_t kIdentityBytes = 64 * 1024;
constexpr size_t kRawCallsites = 1024;       // call sites kept as raw addresses
constexpr size_t kRawCallsiteFrames = 32;    // stacks::kMaxNativeFrames
constexpr size_t kModulesBytes = 128 * 1024;  // the loaded modules, as text

// A call site as captured (its return addresses, innermost first, ncclwatch's own frames
// included), written by the thread that interned it: frames for a process that died before its
// watchdog resolved the site to text. The host's caretaker symbolizes them with the modules.
struct RawCallsite {
  std::atomic<uint32_t> published;  // 1 once the rest is written
  uint16_t native_depth, python_depth;
  uint64_t ips[kRawCallsiteFrames];
};

// Where each part is in the file (offsets from its start), and the writer's struct sizes: a
// reader of another build refuses a layout it does not share.
struct Layout {
  char magic[16];
  uint32_t layout_version;
  uint32_t op_slot_bytes, comm_record_bytes, thread_slot_bytes;  // the writer's struct sizes
  uint64_t file_bytes;
  uint64_t ring_offset, ring_capacity;
  uint64_t comms_offset, comms_capacity;
  uint64_t threads_offset, threads_capacity;
  uint64_t sites_offset, sites_capacity;
  uint64_t identity_offset, identity_capacity;
  uint64_t raw_sites_offset, raw_sites_capacity;
  uint64_t modules_offset, modules_capacity;
};

// Written by the host's caretaker, never by the process: it saw the process stopped (SIGSTOP,
// a debugger, a frozen cgroup), so that its postmortem, if it is killed so, says it was.
struct StopMark {
  std::atomic<uint32_t> how;              // trace::StopKind
  std::atomic<int64_t> first_unix_ns;     // first seen stopped, this time (0: never)
  std::atomic<int64_t> first_mono_ns;
  std::atomic<int64_t> last_unix_ns;      // last seen stopped
  std::atomic<int64_t> last_mono_ns;
  std::atomic<int64_t> stand_in_mono_ns;  // its stand-in dump was written (0: not this time)
};

// How the process ended, marked by the process itself on its way out, before anything that may
// fail (an allocation under RLIMIT_AS, a dump directory it no longer reaches after setresuid or
// chroot): the mapping is written, never the file system. A box whose process is gone with a
// mark is no death without a word.
enum class EndingKind : uint32_t {
  kNone = 0,
  kExit = 1,       // exit() or a return from main
  kQuickExit = 2,  // _exit, _Exit, quick_exit
  kExec = 3,       // execve and its family: the process runs another program now
};
struct EndingMark {
  std::atomic<uint32_t> how;     // EndingKind, written last (release)
  std::atomic<int32_t> status;   // kExit, kQuickExit: the exit status
  std::atomic<uint32_t> record;  // 1: its exit record (or the operations in flight) was written
  char program[256];             // kExec: the program, cut
};

// The mount and PID namespaces of the process (the inode numbers of /proc/self/ns/mnt and
// ns/pid; 0 unknown): a box in a /dev/shm shared between containers (docker --ipc=host) is read
// only by a process of its own namespaces, which sees its pid and its dump directory.
struct Namespaces {
  uint64_t mnt = 0, pid = 0;
};
// This process's (read once).
Namespaces OwnNamespaces();
// Whether a box's namespaces are this process's own (unknown on either side: yes).
bool SameNamespaces(const Namespaces& a, const Namespaces& b);

// The first page of the file.
struct Header {
  Layout layout;
  int32_t pid;
  uint32_t uid;
  double default_deadline_s;
  std::atomic<int32_t> global_rank;
  std::atomic<int32_t> world_size;
  std::atomic<uint32_t> identity_bytes;  // length of the identity JSON (0 while rewritten)
  std::atomic<uint64_t> sites_bytes;     // bytes of call-site records published
  std::atomic<int64_t> alive_unix_ns;    // the watchdog's last poll: when it was last seen alive
  std::atomic<int64_t> alive_mono_ns;
  // The watchdog's last poll that mirrored op states into the ring (0: none yet): the states of
  // watched operations, and the communicators' completed counts, are as of then.
  std::atomic<int64_t> states_mono_ns;
  std::atomic<uint64_t> states_recorded;  // ops recorded when that poll began (ring indexes below)
  std::atomic<int64_t> final_dump_mono_ns;  // a dump of its own end (fatal signal, SIGTERM) was written
  std::atomic<uint64_t> dumps;              // dumps written so far
  std::atomic<uint32_t> modules_bytes;      // length of the modules text (0 while rewritten)
  StopMark stop;
  EndingMark ending;  // version 4
  Namespaces ns;      // version 4
};
static_assert(sizeof(Header) <= 4096, "the header is the file's first page");

// The file name of a process's black box; `prefix`es the reader matches.
std::string BoxFileName(uint32_t uid, int pid, const std::string& process_uid);
std::string BoxPrefix(uint32_t uid);
// The lock whose holder is the host's caretaker for this user (postmortem.h).
// One caretaker per user and namespaces: a box is converted where its pid and dump directory mean
// what they meant to its process.
std::string CaretakerLockName(uint32_t uid, const Namespaces& ns = OwnNamespaces());

// A box's lock: a write lock on its first byte, held by its process for its life; its release is
// how readers know the process is gone (and postmortem.cpp whether the pid is still that process).
// Taken: this box is ours (its creator's, or a dead owner's, now the caretaker's).
bool TakeBoxLock(int fd);
// Who holds it, asked without taking it: the holder's pid as this PID namespace numbers it, 0 when
// free, -1 when it cannot be asked.
pid_t BoxLockHolder(int fd);

class BlackBox {
 public:
  // Creates this process's black box in `dir` with room for `ring_capacity` ring slots.
  // Null with *why set when it cannot (a missing or unusable directory, no space).
  static std::unique_ptr<BlackBox> Create(const std::string& dir, uint64_t ring_capacity, int pid,
                                          const std::string& process_uid, double default_deadline_s,
                                          std::string* why);
  ~BlackBox();
  BlackBox(const BlackBox&) = delete;
  BlackBox& operator=(const BlackBox&) = delete;

  OpSlot* ring() const;
  CommRecord* comms() const;
  size_t comms_capacity() const { return kCommRecords; }
  ThreadSlot* threads() const;

  // Who the process is, as JSON (postmortem.h reads it back). Not the hot path.
  void SetIdentity(const std::string& json);
  void SetRank(int rank, int world_size);
  // Each watchdog poll: alive now; op states mirrored as of `states_mono_ns`.
  void Alive(int64_t unix_ns, int64_t mono_ns, int64_t states_mono_ns, uint64_t states_recorded);
  void FinalDumpWritten(int64_t mono_ns);
  // How the process ends (EndingMark): async-signal-safe, no allocation, the mapping only.
  void MarkEnding(EndingKind how, int status, const char* program = nullptr);
  void MarkRecordWritten();
  // An execve that failed (the process goes on): no ending.
  void ClearEnding();
  void CountDump();
  // The raw addresses of call site `id` (stacks::NewCallsiteHook): the hot path, once per
  // distinct call site; no locks, allocation or I/O (the file's space is reserved).
  void RecordRawCallsite(int32_t id, const uintptr_t* ips, int native_depth, int python_depth);
  // The loaded modules (ModulesText), for symbolizing raw call sites after a death. One writer.
  void SetModules(const std::string& text);
  // Appends one resolved call site (its text); false when the area is full. One writer.
  bool AppendCallsite(const std::string& text);
  // The lock that says the process lives goes with any close of the file by this process: an
  // application that closes every descriptor drops it. Each check (watchdog thread, about once
  // a second) takes it again when the descriptor is no longer ours; false when it cannot.
  bool KeepLocked();
  // At a normal exit: the process left its own word; the file goes.
  void Remove();
  // Async-signal-safe, right before a signal ends the process: the file goes if the dump of that
  // end was written (else it stays, for the caretaker to convert).
  void RemoveIfFinalDumped();

  const std::string& path() const { return path_; }
  size_t bytes() const { return bytes_; }

 private:
  BlackBox() = default;
  Header* header() const { return reinterpret_cast<Header*>(base_); }

  std::string path_;
  std::atomic<bool> removed_{false};
  KeptFd fd_;  // holds the lock
  bool relock_failed_ = false;
  char* base_ = nullptr;
  size_t bytes_ = 0;
};

// A loaded module as the box keeps it: its load bias, the range its PT_LOAD segments cover,
// whether it is ncclwatch itself, its build id and path ("" the main program: see exe).
struct BoxModule {
  uint64_t bias = 0, lo = 0, hi = 0;
  bool own = false;
  std::string build_id, path;
};
std::string ModulesText(const std::vector<BoxModule>& modules);
std::vector<BoxModule> ParseModules(const std::string& text);

// What /proc/PID/stat says of a process: its start (clock ticks after boot, field 22: the same
// for the life of the pid, across an execve too), its state letter (T stopped, t traced, ...) and
// whether it has ended (a zombie).
struct ProcStat {
  bool exists = false, ended = false;
  char state = 0;
  uint64_t start_ticks = 0;
  // A zombie's exit status as waitpid would give it (field 52; -1 unknown): what a process that
  // ended without a record (a raw exit_group) said, while its parent has not reaped it yet.
  int exit_code = -1;
};
ProcStat ReadProcStat(int pid);

// Whose a black box is, once its lock is free: the lock goes with any close of the file by its
// process (an application that closes every descriptor) and with an execve (O_CLOEXEC), so a
// free lock alone does not mean the process is gone. `start_ticks`: the box's process's start
// (its identity's; 0 unknown: a free lock says gone, as boxes written before it was kept);
// `box`: the box file's stat.
enum class BoxOwner {
  kGone,        // the pid has ended (or is another process): the box is its last word
  kRunning,     // the same process, still running the program that maps the box
  kReexecuted,  // the same process, now another program image (execve): not a death
};
BoxOwner OwnerOf(int pid, uint64_t start_ticks, const struct stat& box);

// The layout for a ring of `ring_capacity` slots (what Create writes in the header).
Layout LayoutFor(uint64_t ring_capacity);

}  // namespace blackbox
}  // namespace ncclwatch
