// A bounded wait for a mutex, for the threads of ours that must never hang on a lock (the
// watchdog, a dump): they give up and say so instead.
#pragma once

#include <time.h>

#include <mutex>

namespace ncclwatch {

// Locks `m` within `ms` milliseconds (polling try_lock: TSan misreads timed locks). False if not.
inline bool LockWithin(std::mutex& m, int ms) {
  for (int waited = 0;; ++waited) {
    if (m.try_lock()) return true;
    if (waited >= ms) return false;
    timespec one_ms{0, 1000000};
    nanosleep(&one_ms, nullptr);
  }
}

}  // namespace ncclwatch
