// The library's own threads (the watchdog, the Python helper) take little of the application's
// address space: a small stack (RLIMIT_STACK's 8 MiB is the default otherwise), sized for the
// deepest use measured (a dump: stacks unwound with libunwind, symbolized, written) with room
// to spare, plus the static TLS glibc carves out of it.
#pragma once

#include <pthread.h>

#include <cstddef>

namespace ncclwatch {

// The watchdog's deepest measured use is 25 KiB (an on-demand dump: every thread's stack
// unwound and symbolized, the file written): twenty times that.
constexpr size_t kOwnThreadStackBytes = 512u << 10;

// Sets `attr`'s stack size to `bytes` plus the process's static TLS (never below
// PTHREAD_STACK_MIN).
void SetOwnThreadStack(pthread_attr_t* attr, size_t bytes = kOwnThreadStackBytes);

// An own thread's first allocation: one, given back, made only while there is address space
// (AddressSpaceRoom). An allocator's first use on a thread sets up that thread's cache, and
// jemalloc crashes (SIGSEGV) when it cannot, out of address space; once set up, an allocation
// that cannot be had fails. False: not made (the thread allocates nothing until it is).
bool WarmAllocator();

}  // namespace ncclwatch
