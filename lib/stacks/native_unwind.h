// Native unwinding helpers shared by the call-site and thread-stack code (internal).
#pragma once

#define UNW_LOCAL_ONLY
#include <libunwind.h>

#include <cstdint>

namespace ncclwatch {
namespace stacks {
namespace detail {

// Walks the stack described by `context` with unw_step and stores up to `max` instruction
// pointers, innermost first. With `signal_frame`, `context` is the ucontext a signal handler
// received and frame 0 is the exact interrupted pc; otherwise it comes from unw_getcontext and
// every ip is a return address. Async-signal-safe: unlike unw_backtrace it never touches
// libunwind's per-thread trace cache (which is not reentrant: a handler using it could unmap
// it under an unw_backtrace interrupted on the same thread) and never allocates.
int UnwindContext(unw_context_t* context, bool signal_frame, uintptr_t* out, int max);
// The same, reading the words in [base, base + size) from `copy` (a copy of that memory taken
// earlier: another thread's stack while it waited) instead of the live memory. One caller at a
// time (stack captures are serialized).
int UnwindContextOverCopy(unw_context_t* context, bool signal_frame, uintptr_t* out, int max, uintptr_t base,
                          const void* copy, size_t size);

// Index of the first of `ips[0, count)` equal to `ip` among the first `window`, or -1.
int FindFrame(const uintptr_t* ips, int count, uintptr_t ip, int window);

// Copies `size` bytes of this process's memory at `address` into `out`; false where any of it is
// not readable. No fault, no file descriptor, errno kept (signal handlers use it too).
bool ReadOwnMemory(uintptr_t address, void* out, size_t size);

// Whether ReadOwnMemory copies in one step (process_vm_readv): memory another thread unmaps
// while it is read then fails the read. False where a seccomp filter refuses the call: a page
// unmapped between the check and the copy would fault, so memory a running thread may unmap
// (its Python frames' data stack) is not read.
bool OwnMemoryReadsAtomic();

}  // namespace detail
}  // namespace stacks
}  // namespace ncclwatch
