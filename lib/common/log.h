// One-line messages on stderr, prefixed "ncclwatch:". Quiet unless something needs saying.
#pragma once

namespace ncclwatch {

enum class LogLevel { kQuiet = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Sets the "[rank N]" part of the prefix once the global rank is known.
void SetLogRank(int rank);

void LogWarn(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void LogInfo(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void LogDebug(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace ncclwatch
