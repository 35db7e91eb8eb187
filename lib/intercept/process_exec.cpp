// execve and its family replace the process's program: the rank's NCCL ends there, and its black
// box (its lock dropped with the exec) would read as a death without a word once the new program
// ends. Each is wrapped to mark the box "replaced by exec of <program>" before the call, and to
// take the mark back when the call returns (it failed: the process goes on). glibc's exec*
// functions call execve inside the library, past any wrapper, so each is wrapped, not execve
// alone. A process whose ncclwatch is not active (it never used NCCL, a forked or vforked child)
// goes straight through.
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#include "runtime/runtime.h"

extern char** environ;

namespace {

template <typename Fn>
Fn Real(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_NEXT, name));
}

// Marks the box, makes the call, and unmarks it if the call returns (keeping its errno).
template <typename Call>
int Exec(const char* program, Call call) {
  ncclwatch::Runtime* rt = ncclwatch::Runtime::IfActive();
  if (rt) rt->MarkExec(program ? program : "?");
  const int result = call();
  if (rt) {
    const int e = errno;
    rt->ExecFailed();
    errno = e;
  }
  return result;
}

using ExecveFn = int (*)(const char*, char* const[], char* const[]);
using ExecvFn = int (*)(const char*, char* const[]);
using FexecveFn = int (*)(int, char* const[], char* const[]);
using ExecveatFn = int (*)(int, const char*, char* const[], char* const[], int);

// Resolved when the library loads: an exec from a vforked child (posix_spawn, Python's
// subprocess) must not take the loader's lock, which another thread of the parent may hold.
struct RealExec {
  ExecveFn execve = Real<ExecveFn>("execve");
  ExecvFn execv = Real<ExecvFn>("execv");
  ExecvFn execvp = Real<ExecvFn>("execvp");
  ExecveFn execvpe = Real<ExecveFn>("execvpe");
  FexecveFn fexecve = Real<FexecveFn>("fexecve");
  ExecveatFn execveat = Real<ExecveatFn>("execveat");
};
const RealExec g_real;

int NoFunction() {
  errno = ENOSYS;
  return -1;
}

// How many entries execl's arguments take, their NULL included; `ap` is left past the NULL.
size_t CountArgs(const char* first, va_list* ap) {
  size_t n = 1;
  for (const char* a = first; a; a = va_arg(*ap, const char*)) ++n;
  return n;
}

// execl's arguments, `first` up to the NULL, into an array on the stack for `run`; `ap` is left
// after the NULL (execle's environment follows it).
template <typename Run>
int WithArgv(const char* first, va_list* ap, Run run) {
  va_list count;
  va_copy(count, *ap);
  const size_t n = CountArgs(first, &count);
  va_end(count);
  const char* argv[n];
  argv[0] = first;
  for (size_t i = 1; i < n; ++i) argv[i] = va_arg(*ap, const char*);
  return run(const_cast<char* const*>(argv));
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int execve(const char* path, char* const argv[], char* const envp[]) noexcept {
  const auto real = g_real.execve ? g_real.execve : Real<ExecveFn>("execve");  // before our constructor
  return Exec(path, [&] { return real ? real(path, argv, envp) : NoFunction(); });
}

__attribute__((visibility("default"))) int execv(const char* path, char* const argv[]) noexcept {
  const auto real = g_real.execv ? g_real.execv : Real<ExecvFn>("execv");  // before our constructor
  return Exec(path, [&] { return real ? real(path, argv) : NoFunction(); });
}

__attribute__((visibility("default"))) int execvp(const char* file, char* const argv[]) noexcept {
  const auto real = g_real.execvp ? g_real.execvp : Real<ExecvFn>("execvp");  // before our constructor
  return Exec(file, [&] { return real ? real(file, argv) : NoFunction(); });
}

__attribute__((visibility("default"))) int execvpe(const char* file, char* const argv[], char* const envp[]) noexcept {
  const auto real = g_real.execvpe ? g_real.execvpe : Real<ExecveFn>("execvpe");  // before our constructor
  return Exec(file, [&] { return real ? real(file, argv, envp) : NoFunction(); });
}

__attribute__((visibility("default"))) int fexecve(int fd, char* const argv[], char* const envp[]) noexcept {
  const auto real = g_real.fexecve ? g_real.fexecve : Real<FexecveFn>("fexecve");  // before our constructor
  char program[48];
  snprintf(program, sizeof program, "/proc/self/fd/%d", fd);
  return Exec(program, [&] { return real ? real(fd, argv, envp) : NoFunction(); });
}

__attribute__((visibility("default"))) int execveat(int dirfd, const char* path, char* const argv[],
                                                    char* const envp[], int flags) noexcept {
  const auto real = g_real.execveat ? g_real.execveat : Real<ExecveatFn>("execveat");  // before our constructor
  return Exec(path, [&] { return real ? real(dirfd, path, argv, envp, flags) : NoFunction(); });
}

// The variadic ones, as glibc builds them: the arguments into an array on the stack (no
// allocation: exec is called from forked children and signal-handling code).
__attribute__((visibility("default"))) int execl(const char* path, const char* arg, ...) noexcept {
  va_list ap;
  va_start(ap, arg);
  const int rc = WithArgv(arg, &ap, [&](char* const* argv) { return execve(path, argv, environ); });
  va_end(ap);
  return rc;
}

__attribute__((visibility("default"))) int execlp(const char* file, const char* arg, ...) noexcept {
  va_list ap;
  va_start(ap, arg);
  const int rc = WithArgv(arg, &ap, [&](char* const* argv) { return execvp(file, argv); });
  va_end(ap);
  return rc;
}

__attribute__((visibility("default"))) int execle(const char* path, const char* arg, ...) noexcept {
  va_list ap;
  va_start(ap, arg);
  // The environment follows the arguments' NULL: read once they are.
  const int rc = WithArgv(arg, &ap, [&](char* const* argv) { return execve(path, argv, va_arg(ap, char* const*)); });
  va_end(ap);
  return rc;
}

}  // extern "C"
