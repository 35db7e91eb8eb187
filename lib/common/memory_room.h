// Out of memory, an allocation may crash rather than fail: jemalloc, preloaded by many jobs,
// dies with SIGSEGV when the address space is exhausted (RLIMIT_AS), where glibc returns NULL.
// So the watchdog's steady path never allocates, and the work that does (a dump, the host's
// caretaker, the metrics file, a request read) first asks for room: a mapping of that size,
// made and given back at once, never touched (two system calls, no memory used).
#pragma once

#include <sys/mman.h>

#include <cstddef>

namespace ncclwatch {

// Address space a dump (or an allocating duty) asks to be free before it starts (a dump of the
// default ring takes about 1.6 MiB more while it is written: README, Cost).
constexpr size_t kAllocRoomBytes = 2u << 20;

// True when `bytes` of address space can be mapped now. Async-signal-safe.
// Header-only: the stacks archive (linked without the core) uses it too.
inline bool AddressSpaceRoom(size_t bytes = kAllocRoomBytes) {
  void* p = mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return false;
  munmap(p, bytes);
  return true;
}

}  // namespace ncclwatch
