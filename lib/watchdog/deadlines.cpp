#include "watchdog/deadlines.h"

#include <algorithm>

#include "record/comm_registry.h"

namespace ncclwatch {

int DeadlinePolicy::SizeClass(uint64_t bytes) {
  int log2 = 0;
  while (bytes > 1) {
    bytes >>= 1;
    ++log2;
  }
  return log2 / 2;
}

uint64_t DeadlinePolicy::Key(uint64_t comm_id, trace::OpKind kind, uint64_t bytes) {
  uint64_t parts[3] = {comm_id, static_cast<uint64_t>(kind), static_cast<uint64_t>(SizeClass(bytes))};
  return Fnv1a64(parts, sizeof parts);
}

double DeadlinePolicy::DeadlineS(uint64_t comm_id, trace::OpKind kind, uint64_t bytes) const {
  double fixed = spec_.per_op_s[static_cast<int>(kind)];
  if (fixed > 0) return fixed;
  double d = spec_.default_s;
  if (multiple_ <= 0) return d;
  auto it = history_.find(Key(comm_id, kind, bytes));
  if (it == history_.end() || it->second.samples < min_samples_) return d;
  double adaptive = std::max(floor_s_, multiple_ * it->second.slowest_s);
  return std::min(d, adaptive);
}

void DeadlinePolicy::RecordHealthy(uint64_t comm_id, trace::OpKind kind, uint64_t bytes, double seconds) {
  History& h = history_[Key(comm_id, kind, bytes)];
  h.slowest_s = std::max(h.slowest_s, seconds);
  ++h.samples;
}

}  // namespace ncclwatch
