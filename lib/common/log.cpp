#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>

namespace ncclwatch {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};
std::atomic<int> g_rank{-1};

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
  ssize_t ignored = write(STDERR_FILENO, line, len);
  (void)ignored;
}
}  // namespace

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
