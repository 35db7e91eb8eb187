// What the library leaves to a job's limits: the last descriptors under RLIMIT_NOFILE, and
// address space under RLIMIT_AS, are checked for without taking either.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "common/fd_room.h"
#include "common/memory_room.h"

using namespace ncclwatch;

namespace {

// Lowers the soft limit for the test's length (the hard one is left: it comes back).
struct SoftLimit {
  int resource;
  rlimit saved{};
  SoftLimit(int r, rlim_t soft) : resource(r) {
    getrlimit(r, &saved);
    rlimit lowered = saved;
    lowered.rlim_cur = soft;
    REQUIRE(setrlimit(r, &lowered) == 0);
  }
  ~SoftLimit() { setrlimit(resource, &saved); }
};

int HighestOpen() {
  int highest = -1;
  for (int fd = 0; fd < 4096; ++fd)
    if (fcntl(fd, F_GETFD) != -1) highest = fd;
  return highest;
}

}  // namespace

TEST_CASE("FdRoom counts the free descriptors under the soft limit and leaves the last kFdReserve") {
  const int limit = HighestOpen() + 1 + kFdReserve + 3;  // room for 3 more, and the reserve
  SoftLimit nofile(RLIMIT_NOFILE, static_cast<rlim_t>(limit));
  CHECK(FdLimit() == limit);
  int free = 0;
  CHECK(FdRoom(3, &free));
  CHECK(free >= 3 + kFdReserve);
  std::vector<int> taken;
  while (FdRoom(1)) {
    const int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    taken.push_back(fd);
  }
  FdRoom(0, &free);
  CHECK(free == kFdReserve);  // what the application still has, whatever we asked
  CHECK_FALSE(FdRoom(1));
  for (int fd : taken) close(fd);
  CHECK(FdRoom(1));
}

TEST_CASE("AddressSpaceRoom says whether a mapping of that size could be made, and keeps none") {
  CHECK(AddressSpaceRoom());
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return;  // a sanitizer's own mappings need the address space RLIMIT_AS would take away
#endif
  std::ifstream status("/proc/self/status");
  long vm_kib = 0;
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmSize:", 0) == 0) vm_kib = std::stol(line.substr(7));
  REQUIRE(vm_kib > 0);
  {
    SoftLimit as(RLIMIT_AS, static_cast<rlim_t>(vm_kib) * 1024 + (1u << 20));  // 1 MiB to spare
    CHECK_FALSE(AddressSpaceRoom(kAllocRoomBytes));
    CHECK(AddressSpaceRoom(64 * 1024));
    CHECK(AddressSpaceRoom(64 * 1024));  // the probe gave its mapping back
  }
  CHECK(AddressSpaceRoom());
}
