// The library's own threads (the watchdog, the Python helper) take little of the application's
// address space: a small stack (RLIMIT_STACK's 8 MiB is the default otherwise), sized for the
// deepest use measured (a dump: stacks unwound with libunwind, symbolized, written) with room
// to spare, plus the static TLS glibc carves out of it.
#pragma once

#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>

#include <cstddef>
#include <cstdlib>

#include "common/memory_room.h"

namespace ncclwatch {

// The watchdog's deepest measured use is 25 KiB (an on-demand dump: every thread's stack
// unwound and symbolized, the file written): twenty times that.
constexpr size_t kOwnThreadStackBytes = 512u << 10;

// Sets `attr`'s stack size to `bytes` plus the process's static TLS (never below
// PTHREAD_STACK_MIN).
inline void SetOwnThreadStack(pthread_attr_t* attr, size_t bytes = kOwnThreadStackBytes);

// An own thread's first allocation: one, given back, made only while there is address space
// (AddressSpaceRoom). An allocator's first use on a thread sets up that thread's cache, and
// jemalloc crashes (SIGSEGV) when it cannot, out of address space; once set up, an allocation
// that cannot be had fails. False: not made (the thread allocates nothing until it is).
inline bool WarmAllocator();

// Header-only: the stacks archive (linked without the core) uses them too.

// Every signal blocked, so that signals sent to the process go to the application's threads,
// except those the kernel raises on the instruction that caused them: SIGSEGV, SIGBUS, SIGFPE,
// SIGILL, SIGTRAP and SIGSYS (a seccomp filter's SECCOMP_RET_TRAP). Raised in a thread that
// blocks it, such a signal kills the whole process: the kernel unblocks it and resets it to its
// default action, skipping the handler the application set (and ours). Unblocked, it runs that
// handler on our thread as it would on the application's own: a SIGSYS handler that emulates a
// refused system call, a runtime's SIGSEGV handler that maps the page in. The price: one of them
// sent with kill() to the process may land on our thread (the kernel tries the main thread first)
// and run the same handler there.
inline void OwnThreadMask(sigset_t* mask) {
  sigfillset(mask);
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS}) sigdelset(mask, s);
}

// Starts one of the library's own threads on a small stack (SetOwnThreadStack), with
// OwnThreadMask's signals blocked except `also_unblocked` (0: none), detached when `detached`.
// The caller's mask is as it was on return. pthread_create's result.
inline int StartOwnThread(pthread_t* thread, void* (*main)(void*), void* arg, int also_unblocked, bool detached) {
  sigset_t mask, saved;
  OwnThreadMask(&mask);
  if (also_unblocked > 0) sigdelset(&mask, also_unblocked);
  pthread_sigmask(SIG_SETMASK, &mask, &saved);  // a new thread inherits its creator's mask
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  if (detached) pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  SetOwnThreadStack(&attr);
  const int rc = pthread_create(thread, &attr, main, arg);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  return rc;
}

inline void SetOwnThreadStack(pthread_attr_t* attr, size_t bytes) {
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

inline bool WarmAllocator() {
  if (!AddressSpaceRoom()) return false;
  void* volatile p = malloc(64);  // volatile: a pair of malloc and free is otherwise elided
  free(p);
  return p != nullptr;
}

}  // namespace ncclwatch
