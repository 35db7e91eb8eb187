// The signal mask ncclwatch's own threads start with (the watchdog, the GIL helper).
#pragma once

#include <signal.h>

namespace ncclwatch {

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

}  // namespace ncclwatch
