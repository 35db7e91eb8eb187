#include "common/kept_fd.h"

#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"

namespace ncclwatch {

bool KeptFd::Keep(int fd, const char* what) {
  Close();
  what_ = what;
  struct stat st;
  if (fd < 0) return false;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return false;
  }
  fd_ = fd;
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  return true;
}

bool KeptFd::StillOurs() {
  if (fd_ < 0) return false;
  struct stat st;
  if (fstat(fd_, &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) return true;
  LogInfo("descriptor %d (%s) is no longer ours (the application closed it): left to the application", fd_, what_);
  fd_ = -1;
  return false;
}

void KeptFd::Close() {
  if (fd_ >= 0 && StillOurs()) close(fd_);
  fd_ = -1;
}

}  // namespace ncclwatch
