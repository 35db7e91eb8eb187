// Keeps this process's black box up to date, from the watchdog thread: its heartbeat, the names
// of the NCCL calls its threads are in, the loaded modules, each new call site resolved to text
// (after a SIGKILL nobody can), and its lock (the application may close the descriptor).
#pragma once

#include <cstddef>
#include <cstdint>

#include "blackbox/black_box.h"
#include "record/thread_registry.h"

namespace ncclwatch {
namespace blackbox {

class BoxKeeper {
 public:
  // Writes the modules now: a process killed before the first tick has its call sites' frames.
  BoxKeeper(BlackBox* box, ThreadRegistry* threads);

  // Each tick: `poll_ns`/`poll_recorded`, the watchdog's last poll that mirrored op states.
  void Tend(uint64_t now_ns, uint64_t poll_ns, uint64_t poll_recorded);

 private:
  void WriteModules();

  BlackBox* box_;
  ThreadRegistry* threads_;
  size_t sites_next_ = 0;  // call sites resolved into the box so far
  int site_retries_ = 0;
  bool full_logged_ = false;
  uint64_t modules_generation_ = 0;  // of the modules written into the box
  uint64_t next_modules_check_ns_ = 0;   // dl_iterate_phdr takes the loader lock: not every tick
};

}  // namespace blackbox
}  // namespace ncclwatch
