// Per-operation deadlines: fixed per-op values from NCCLWATCH_TIMEOUT, else the default until
// the job has history, then an adaptive deadline: NCCLWATCH_ADAPTIVE x the slowest healthy
// completion seen for the same op, communicator and size class, clamped to
// [NCCLWATCH_ADAPTIVE_FLOOR, default]. History can only tighten the default, never loosen it,
// so a stall is always reported well before a framework's 10-30 minute watchdog.
#pragma once

#include <cstdint>
#include <unordered_map>

#include "common/config.h"
#include "ncclwatch/trace_format.h"

namespace ncclwatch {

class DeadlinePolicy {
 public:
  DeadlinePolicy(const DeadlineSpec& spec, double adaptive_multiple, double floor_s, uint64_t min_samples)
      : spec_(spec), multiple_(adaptive_multiple), floor_s_(floor_s), min_samples_(min_samples) {}

  double DeadlineS(uint64_t comm_id, trace::OpKind kind, uint64_t bytes) const;
  // The deadline of what has no history and no per-operation value: a call blocked on the host,
  // a communicator's creation (setup_hangs.h), a dead process's operations (its black box).
  double DefaultS() const { return DefaultS(spec_); }
  static double DefaultS(const DeadlineSpec& spec) { return spec.default_s; }
  // A completion that was never reported as a stall.
  void RecordHealthy(uint64_t comm_id, trace::OpKind kind, uint64_t bytes, double seconds);

  // Size classes are powers of 4 bytes: 1 KiB and 3 KiB share one, 1 MiB and 4 MiB do not.
  static int SizeClass(uint64_t bytes);

 private:
  struct History {
    double slowest_s = 0;
    uint64_t samples = 0;
  };
  static uint64_t Key(uint64_t comm_id, trace::OpKind kind, uint64_t bytes);

  DeadlineSpec spec_;
  double multiple_;
  double floor_s_;
  uint64_t min_samples_;
  std::unordered_map<uint64_t, History> history_;
};

}  // namespace ncclwatch
