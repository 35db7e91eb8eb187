#include "common/own_thread.h"

#include "common/memory_room.h"

#include <limits.h>
#include <link.h>

#include <cstdlib>

namespace ncclwatch {

void SetOwnThreadStack(pthread_attr_t* attr, size_t bytes) {
  // glibc takes every module's static TLS (and the guard) from the stack's size.
  size_t tls = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* sum) {
        for (int i = 0; i < info->dlpi_phnum; ++i)
          if (info->dlpi_phdr[i].p_type == PT_TLS) *static_cast<size_t*>(sum) += info->dlpi_phdr[i].p_memsz + 64;
        return 0;
      },
      &tls);
  size_t size = bytes + tls + 64 * 1024;
  if (size < static_cast<size_t>(PTHREAD_STACK_MIN)) size = PTHREAD_STACK_MIN;
  size = (size + 4095) & ~static_cast<size_t>(4095);
  pthread_attr_setstacksize(attr, size);
}

bool WarmAllocator() {
  if (!AddressSpaceRoom()) return false;
  void* volatile p = malloc(64);  // volatile: a pair of malloc and free is otherwise elided
  free(p);
  return p != nullptr;
}

}  // namespace ncclwatch
