// The host's caretaker: one process per user, black-box directory and namespaces (mount, PID:
// containers sharing /dev/shm each have theirs), elected with flock on
// ncclwatch-caretaker-<uid>-<mnt ns>-<pid ns>.lock there, that converts the black boxes of
// processes gone without a word (postmortem.h: ConvertDeadBoxes) about once a second. The lock is held for the life of
// the process; the kernel hands it to the next one when this one ends.
#pragma once

#include <cstdint>
#include <string>

#include "common/kept_fd.h"

namespace ncclwatch {
namespace blackbox {

class Caretaker {
 public:
  // `box_dir`, `relay_dir`: where the boxes and the relay's files are ("none": no black boxes).
  Caretaker(std::string box_dir, std::string relay_dir);

  // Becomes the caretaker if none is, and then makes one pass. `own_box`: this process's box
  // file name ("" none), never touched. What it converted is said in one line each: a warning
  // for a process of `job_instance` that ended, otherwise at info level (another job's ranks,
  // whose dumps go to their own directory, and processes that re-executed themselves).
  // Watchdog thread.
  void Tend(const std::string& own_box, const std::string& job_instance);

 private:
  bool Elected();

  std::string box_dir_, relay_dir_;
  KeptFd lock_;  // flock held: this process is the host's caretaker
  bool tried_ = false;
  uint64_t next_pass_ns_ = 0;  // a whole pass at least this often, else only when BoxesNeedCare
};

}  // namespace blackbox
}  // namespace ncclwatch
