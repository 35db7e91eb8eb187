// The duties the watchdog thread runs after each poll, each one saying when it is next due, as
// NCCL's RAS thread's timeout handlers do: one list says what runs on that thread and how often,
// and a duty that is not due costs one comparison.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "common/quietly.h"

namespace ncclwatch {

class TickSchedule {
 public:
  // Given the tick's time (monotonic ns), does its work and returns when it is next due:
  // `now` for every tick, kNever once it has nothing more to do.
  using Duty = std::function<uint64_t(uint64_t now_ns)>;
  static constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

  // Duties run in the order they were added. `name` says what failed, if one does (out of
  // memory): that duty is tried again at the next tick, the others run as usual.
  void Add(const char* name, Duty duty) { duties_.push_back({name, std::move(duty), 0}); }

  void Run(uint64_t now_ns) {
    for (Entry& e : duties_) {
      if (now_ns < e.due_ns) continue;
      Quietly(e.name, [&] { e.due_ns = e.duty(now_ns); });
    }
  }

  size_t size() const { return duties_.size(); }

 private:
  struct Entry {
    const char* name;
    Duty duty;
    uint64_t due_ns;
  };
  std::vector<Entry> duties_;
};

}  // namespace ncclwatch
