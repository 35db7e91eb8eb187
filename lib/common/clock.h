// Clocks. Monotonic time orders events on one host; wall time is for humans only.
#pragma once
#include <cstdint>
#include <ctime>

namespace ncclwatch {

inline uint64_t MonoNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

inline uint64_t UnixNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

constexpr double NsToS(uint64_t ns) { return static_cast<double>(ns) / 1e9; }
// Seconds from `from` to `to`, 0 when `from` is not earlier (operations recorded after a
// poll read its clock have later timestamps than that poll's "now").
constexpr double ElapsedS(uint64_t from, uint64_t to) { return to > from ? NsToS(to - from) : 0.0; }

}  // namespace ncclwatch
