#include "common/fd_room.h"

#include <poll.h>
#include <sys/resource.h>

namespace ncclwatch {

int FdLimit() {
  struct rlimit lim;
  if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY || lim.rlim_cur > (1u << 30))
    return 1 << 30;
  return static_cast<int>(lim.rlim_cur);
}

bool FdRoom(int need, int* free_out) {
  const int limit = FdLimit(), want = need + kFdReserve;
  // The kernel hands out the lowest free number: free ones are found from 0 up, a chunk of
  // numbers per poll() (POLLNVAL: not open). Past kScanned numbers with enough still above,
  // the rest is taken as free (an application with thousands open is far from a small limit).
  constexpr int kChunk = 64, kScanned = 4096;
  int free = 0, at = 0;
  while (at < limit && free < want) {
    if (at >= kScanned && limit - at >= want - free) {
      free = want;
      break;
    }
    struct pollfd p[kChunk];
    const int n = limit - at < kChunk ? limit - at : kChunk;
    for (int i = 0; i < n; ++i) p[i] = {at + i, 0, 0};
    if (poll(p, static_cast<nfds_t>(n), 0) < 0) {  // cannot tell: as if there were room
      free = want;
      break;
    }
    for (int i = 0; i < n; ++i) free += (p[i].revents & POLLNVAL) != 0;
    at += n;
  }
  if (free_out) *free_out = free;
  return free >= want;
}

}  // namespace ncclwatch
