// The black box: what the library already keeps about a process (the flight ring, each
// communicator's sequence state, which thread is inside which NCCL call, the interned call
// sites as text) lives in one node-local file mapping, written as the process goes. The ring
// is the mapping, not a copy. Another process on the host reads it after this one is gone
// without a word (SIGKILL, the OOM killer) and turns it into a `postmortem` dump (postmortem.h).
//
// Lifetime: created at start (under a hidden name, locked, then renamed into place, so that no
// reader ever sees it unlocked while its process lives), a POSIX record lock held for the life
// of the process (released by the kernel however the process ends; not inherited by forked
// children), removed at a normal exit. The file is the user's own, 0600; its space is
// reserved up front (a full /dev/shm is a line at start, never a SIGBUS on the hot path).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "record/comm_registry.h"
#include "record/op_record.h"
#include "record/thread_registry.h"

namespace ncclwatch {
namespace blackbox {

constexpr char kMagic[16] = "ncclwatch-bbox";
constexpr uint32_t kLayoutVersion = 1;
constexpr size_t kCommRecords = 1024;
constexpr size_t kCallsiteBytes = 256 * 1024;
constexpr size_t kIdentityBytes = 64 * 1024;

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
};

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
  std::atomic<int64_t> final_dump_mono_ns;  // a dump of its own end (fatal signal, SIGTERM) was written
  std::atomic<uint64_t> dumps;              // dumps written so far
};

// The file name of a process's black box; `prefix`es the reader matches.
std::string BoxFileName(uint32_t uid, int pid, const std::string& process_uid);
std::string BoxPrefix(uint32_t uid);
// The lock whose holder is the host's caretaker for this user (postmortem.h).
std::string CaretakerLockName(uint32_t uid);

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
  void Alive(int64_t unix_ns, int64_t mono_ns);
  void FinalDumpWritten(int64_t mono_ns);
  void CountDump();
  // Appends one resolved call site (its text); false when the area is full. One writer.
  bool AppendCallsite(const std::string& text);
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
  int fd_ = -1;
  char* base_ = nullptr;
  size_t bytes_ = 0;
};

// The layout for a ring of `ring_capacity` slots (what Create writes in the header).
Layout LayoutFor(uint64_t ring_capacity);

}  // namespace blackbox
}  // namespace ncclwatch
