#include "common/log.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstdio>

namespace ncclwatch {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};
std::atomic<int> g_rank{-1};

// The stderr this process was started with, read when the library is loaded (before the
// application's main can close or replace descriptor 2).
struct StartStderr {
  bool open = false;
  dev_t dev = 0;
  ino_t ino = 0;
};
StartStderr g_start_stderr;
std::atomic<bool> g_stderr_gone{false};  // it broke (EPIPE): no more lines

__attribute__((constructor)) void NoteStartStderr() {
  struct stat st;
  if (fstat(STDERR_FILENO, &st) != 0) return;
  g_start_stderr.dev = st.st_dev;
  g_start_stderr.ino = st.st_ino;
  g_start_stderr.open = true;
}

// Descriptor 2 is a place for our lines: the stderr the process started with, or a terminal,
// pipe or socket put there since (a redirect to a log collector). A regular file that is not
// the one it started with may be the application's own data, opened where a daemon closed 2.
bool StderrIsForLines() {
  struct stat st;
  if (fstat(STDERR_FILENO, &st) != 0) return false;
  return (g_start_stderr.open && st.st_dev == g_start_stderr.dev && st.st_ino == g_start_stderr.ino) ||
         !S_ISREG(st.st_mode);
}

void Emit(LogLevel level, const char* fmt, va_list ap) {
  if (static_cast<int>(level) > g_level.load(std::memory_order_relaxed)) return;
  // One write() per line so lines of concurrent ranks/threads do not interleave.
  char line[1024];
  int n;
  int rank = g_rank.load(std::memory_order_relaxed);
  if (rank >= 0)
    n = snprintf(line, sizeof line, "ncclwatch[rank %d pid %d]: ", rank, static_cast<int>(getpid()));
  else
    n = snprintf(line, sizeof line, "ncclwatch[pid %d]: ", static_cast<int>(getpid()));
  if (n < 0) return;
  int m = vsnprintf(line + n, sizeof line - n - 1, fmt, ap);
  if (m < 0) return;
  size_t len = static_cast<size_t>(n) + static_cast<size_t>(m);
  if (len > sizeof line - 2) len = sizeof line - 2;
  line[len++] = '\n';
  WriteStderrLine(line, len);
}
}  // namespace

void WriteStderrLine(const char* line, size_t len) {
  if (g_stderr_gone.load(std::memory_order_relaxed) || !StderrIsForLines()) return;
  const int saved_errno = errno;
  // SIGPIPE blocked around the write; one that the write raises is taken back, unless one was
  // pending already (the application's own).
  sigset_t pipe_only, old, pending;
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  sigemptyset(&pending);
  const bool pending_before = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
  pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
  const ssize_t n = write(STDERR_FILENO, line, len);
  if (n < 0 && errno == EPIPE) {
    g_stderr_gone.store(true, std::memory_order_relaxed);
    const timespec none{0, 0};
    if (!pending_before) sigtimedwait(&pipe_only, nullptr, &none);
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  errno = saved_errno;
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }
void SetLogRank(int rank) { g_rank.store(rank); }

#define NCCLWATCH_DEFINE_LOG(fn, level) \
  void fn(const char* fmt, ...) {       \
    va_list ap;                         \
    va_start(ap, fmt);                  \
    Emit(level, fmt, ap);               \
    va_end(ap);                         \
  }
NCCLWATCH_DEFINE_LOG(LogWarn, LogLevel::kWarn)
NCCLWATCH_DEFINE_LOG(LogInfo, LogLevel::kInfo)
NCCLWATCH_DEFINE_LOG(LogDebug, LogLevel::kDebug)
#undef NCCLWATCH_DEFINE_LOG

}  // namespace ncclwatch

namespace ncclwatch {

void SayUnmonitored(const char* what) noexcept {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  // LogWarn formats into a buffer on the stack: no allocation here.
  LogWarn("out of memory (or an internal error) in %s: that work of ncclwatch is skipped and the job goes on; "
          "what it covered is unmonitored (said once)",
          what);
}

}  // namespace ncclwatch
