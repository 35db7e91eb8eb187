#include "watchdog/setup_hangs.h"

#include <algorithm>
#include <cstdio>

#include "common/clock.h"
#include "record/comm_registry.h"

namespace ncclwatch {

uint64_t SetupWatch::Begin(const char* function, uint64_t id, int size, int rank, uint64_t since_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  PendingInit p;
  p.token = next_token_++;
  p.function = function;
  p.id = id;
  p.size = size;
  p.rank = rank;
  p.since_ns = since_ns;
  inits_.push_back(p);
  return p.token;
}

void SetupWatch::End(uint64_t token) {
  std::lock_guard<std::mutex> lock(mu_);
  inits_.erase(std::remove_if(inits_.begin(), inits_.end(), [&](const PendingInit& p) { return p.token == token; }),
               inits_.end());
}

std::vector<PendingInit> SetupWatch::Pending() {
  std::lock_guard<std::mutex> lock(mu_);
  return inits_;
}

std::optional<SetupHang> SetupWatch::Check(uint64_t now_ns, double deadline_s) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& p : inits_) {
    const double waited = ElapsedS(p.since_ns, now_ns);
    if (p.reported || waited < deadline_s) continue;
    p.reported = true;
    char line[256];
    snprintf(line, sizeof line, "%s blocked for %.1f s on comm %s (rank %d of %d)", p.function, waited,
             CommIdHex(p.id).c_str(), p.rank, p.size);
    return SetupHang{line, waited};
  }
  return std::nullopt;
}

}  // namespace ncclwatch
