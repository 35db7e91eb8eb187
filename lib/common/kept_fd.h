// A file descriptor the library keeps open across the application's code (a lock it holds for
// the life of the process). The application may close every descriptor >= 3 (daemons,
// subprocess helpers, closefrom) and open files of its own, which then get the same numbers: a
// flock, a write or a close on the number would be on the application's file. So every use is
// preceded by StillOurs(): the number still names the file we opened (same device and inode);
// when it does not, it is forgotten, never closed (it is the application's now), one line says
// so, and the caller reopens or does without.
#pragma once

#include <sys/types.h>

namespace ncclwatch {

class KeptFd {
 public:
  KeptFd() = default;
  ~KeptFd() { Close(); }
  KeptFd(const KeptFd&) = delete;
  KeptFd& operator=(const KeptFd&) = delete;

  // Takes `fd`, just opened by us, and remembers which file it is; `what` names it in the line
  // said when it is lost (a string that lives as long as this). False (and `fd` closed) when it
  // cannot say which file it is. Any descriptor kept before is closed first (if still ours).
  bool Keep(int fd, const char* what);
  // The descriptor, -1 none. Use it only right after StillOurs() said true.
  int fd() const { return fd_; }
  bool kept() const { return fd_ >= 0; }
  // True when the descriptor is still the file Keep() took. Otherwise it is forgotten (one
  // line) and false: the application closed it, and its number may be its own file now.
  bool StillOurs();
  // The file it was opened on (valid once kept, also after it was forgotten).
  dev_t dev() const { return dev_; }
  ino_t ino() const { return ino_; }
  // Closes it when it is still ours; forgets it either way.
  void Close();

 private:
  int fd_ = -1;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
  const char* what_ = "";
};

}  // namespace ncclwatch
