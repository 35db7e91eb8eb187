// Keeps this process's black box up to date, from the watchdog thread: its heartbeat, the names
// of the NCCL calls its threads are in, the loaded modules, each new call site (its raw frames
// from the hot path on, resolved to text here: after a SIGKILL nobody can), its lock (the
// application may close the descriptor), and who the process is (where its dumps go, its
// host's relay: what a caretaker needs to write its postmortem).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "blackbox/black_box.h"
#include "blackbox/postmortem.h"
#include "common/config.h"
#include "common/process_info.h"
#include "dump/request_relay.h"
#include "record/thread_registry.h"

namespace ncclwatch {
namespace blackbox {

class BoxKeeper {
 public:
  // Writes the identity and the modules now, and takes new call sites' raw frames from here on:
  // a process killed before the first tick has its call sites' frames. `relay`: the host's
  // relay (its file's path goes into the identity once it has one).
  BoxKeeper(BlackBox* box, ThreadRegistry* threads, const RequestRelay* relay, BoxIdentity identity);
  // A forked child's mapping is its parent's box: no call site goes into it.
  static void ForgetInChild();
  // A new call site with Python frames (stacks::NewPythonCallsiteHook, on the thread that
  // interned it, once per call site): its Python frames named now and written into the box, so
  // that a process killed before its watchdog's next tick keeps its Python line (its native
  // frames are in the box as raw addresses already). Left to Tend when the GIL is not had soon.
  void NameAtFirstSight(int32_t id);

  // Each tick: `poll_ns`/`poll_recorded`, the watchdog's last poll that mirrored op states.
  void Tend(uint64_t now_ns, uint64_t poll_ns, uint64_t poll_recorded);
  // A dump was written into `dir` (any thread): counted, and where its postmortem goes too.
  void DumpWritten(const std::string& dir);

 private:
  void WriteModules();
  void WriteIdentity();  // id_mu_ held

  BlackBox* box_;
  ThreadRegistry* threads_;
  const RequestRelay* relay_;
  std::mutex id_mu_;
  std::mutex sites_mu_;  // the box's call-site area has one writer at a time
  BoxIdentity identity_;  // under id_mu_
  size_t sites_next_ = 0;  // call sites resolved into the box so far
  int site_retries_ = 0;
  bool full_logged_ = false;
  uint64_t modules_generation_ = 0;  // of the modules written into the box
  uint64_t next_modules_check_ns_ = 0;   // dl_iterate_phdr takes the loader lock: not every tick
};

// Who this process is, for its box: the identity, the process's start and versions, and where
// its dumps go (`start_dir`: the working directory that relative paths were resolved against).
BoxIdentity DescribeProcess(const ProcessIdentity& id, const Config& config, uint64_t start_mono_ns, int nccl_version,
                            int cuda_driver_version, const std::string& start_dir);

}  // namespace blackbox
}  // namespace ncclwatch
