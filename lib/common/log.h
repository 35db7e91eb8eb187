// One-line messages on stderr, prefixed "ncclwatch:". Quiet unless something needs saying.
#pragma once

#include <cstddef>

namespace ncclwatch {

enum class LogLevel { kQuiet = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Sets the "[rank N]" part of the prefix once the global rank is known.
void SetLogRank(int rank);

void LogWarn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void LogInfo(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void LogDebug(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Writes one whole line to stderr, if descriptor 2 is still the stderr the process started
// with, or a terminal, pipe or socket put in its place: a daemon that closed descriptor 2 and
// opened a file of its own there never gets a byte from us.
// A stderr pipe that nobody reads any more (EPIPE) raises no SIGPIPE in the calling thread (an
// application's thread, at its first NCCL call) and ends our lines for good. Async-signal-safe.
void WriteStderrLine(const char* line, size_t len);

}  // namespace ncclwatch
