// The calling thread's id, one definition for every part (header-only: the stack code, which
// links none of the core, uses it too).
#pragma once

#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

namespace ncclwatch {

// The kernel's id of the calling thread (what /proc/<pid>/task lists and tgkill takes). One
// system call and nothing else: async-signal-safe, usable in signal handlers.
inline pid_t CurrentTid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

}  // namespace ncclwatch
