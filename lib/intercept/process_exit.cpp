// _exit and _Exit end a process without exit()'s handlers, so a rank leaving through them (a
// multiprocessing child, os._exit) would leave no exit record and look dead. They are wrapped
// to write the same record as exit() does (ExitPath::OnQuickExit), then end the process as
// glibc's own _exit does. quick_exit too: glibc's calls its own _exit, which no wrapper sees, so
// it writes the record first, then runs the application's at_quick_exit handlers as it would. A
// process whose ncclwatch is not active (it never used NCCL, a forked child) goes straight
// through.
#include <dlfcn.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "runtime/runtime.h"

namespace {

[[noreturn]] void EndProcess(int status) {
  if (ncclwatch::Runtime* rt = ncclwatch::Runtime::IfActive()) rt->OnQuickExit(status);
  for (;;) syscall(SYS_exit_group, status);
}

// Resolved when the library loads: nothing to look up (or allocate) on the way out.
using QuickExit = void (*)(int);
const QuickExit g_quick_exit = reinterpret_cast<QuickExit>(dlsym(RTLD_NEXT, "quick_exit"));

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void _exit(int status) { EndProcess(status); }
__attribute__((visibility("default"))) void _Exit(int status) { EndProcess(status); }

__attribute__((visibility("default"))) void quick_exit(int status) noexcept {
  if (ncclwatch::Runtime* rt = ncclwatch::Runtime::IfActive()) rt->OnQuickExit(status);
  QuickExit real = g_quick_exit ? g_quick_exit : reinterpret_cast<QuickExit>(dlsym(RTLD_NEXT, "quick_exit"));
  if (real) real(status);  // the application's at_quick_exit handlers, then glibc's own _exit
  for (;;) syscall(SYS_exit_group, status);
}

}  // extern "C"
