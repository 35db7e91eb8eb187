#include "common/memory_room.h"

#include <sys/mman.h>

namespace ncclwatch {

bool AddressSpaceRoom(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  munmap(p, bytes);
  return true;
}

}  // namespace ncclwatch
