#include "blackbox/caretaker.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "blackbox/black_box.h"
#include "blackbox/postmortem.h"
#include "common/clock.h"
#include "common/fd_room.h"
#include "common/log.h"
#include "common/memory_room.h"

namespace ncclwatch {
namespace blackbox {

Caretaker::Caretaker(std::string box_dir, std::string relay_dir)
    : box_dir_(std::move(box_dir)), relay_dir_(std::move(relay_dir)) {}

bool Caretaker::Elected() {
  // The application closed the lock's descriptor (dropping the lock if we held it): open it again.
  if (lock_.kept() && !lock_.StillOurs()) tried_ = false;
  if (!tried_) {
    tried_ = true;
    const std::string path = box_dir_ + "/" + CaretakerLockName(getuid());
    int fd = open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != getuid())) {
      close(fd);
      fd = -1;
    }
    if (fd < 0) LogInfo("cannot use %s: black boxes of dead processes are left to others", path.c_str());
    else lock_.Keep(fd, "the host caretaker's lock");
  }
  return lock_.kept() && flock(lock_.fd(), LOCK_EX | LOCK_NB) == 0;
}

void Caretaker::Tend(const std::string& own_box, const std::string& job_instance) {
  if (box_dir_ == "none") return;
  // A pass allocates (paths, identities, the conversions): it runs when a box needs care, and
  // once every kWholePass, only with descriptors and address space to spare. The check before it
  // allocates nothing (the watchdog's steady path).
  constexpr uint64_t kWholePassNs = 60ull * 1000000000ull;
  const uint64_t now = MonoNs();
  if (!FdRoom(3) || !AddressSpaceRoom()) return;
  if (now < next_pass_ns_ && !BoxesNeedCare(box_dir_, own_box)) return;
  next_pass_ns_ = now + kWholePassNs;
  // Not the caretaker: the caretaker may be the process that is stopped (its lock held all the
  // while), so every process looks for stopped ones; a stop is said once, by whoever saw it.
  CaretakerPass pass;
  if (Elected()) pass = ConvertDeadBoxes(box_dir_, relay_dir_, own_box);
  else pass.converted = CareForStoppedBoxes(box_dir_, own_box);
  // Another job's ranks are converted too (their dumps go to their own directory), but this
  // job's output says only its own: a host shared by two jobs must not mix their stories.
  for (const auto& c : pass.converted)
    if (c.job_instance == job_instance && c.ended) LogWarn("%s", c.line.c_str());
    else LogInfo("%s", c.line.c_str());
}

}  // namespace blackbox
}  // namespace ncclwatch
