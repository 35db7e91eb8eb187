// Setup hangs: a communicator creation call (ncclCommInitRank*) that has not returned past the
// default deadline (DeadlinePolicy::DefaultS) is a stall of its own, reported once per call and
// naming the communicator. The calls in progress are also what dumps show as `initializing`.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ncclwatch {

// A communicator creation call that has not returned.
struct PendingInit {
  uint64_t token = 0;
  const char* function = "";
  uint64_t id = 0;
  int size = 0, rank = -1;
  uint64_t since_ns = 0;
  bool reported = false;
};

struct SetupHang {
  std::string detail;  // one line naming the call, how long, the communicator
  double stuck_s = 0;
};

class SetupWatch {
 public:
  // Application threads, around the creation call (`since_ns`: when it began).
  uint64_t Begin(const char* function, uint64_t id, int size, int rank, uint64_t since_ns);
  void End(uint64_t token);
  // The calls in progress.
  std::vector<PendingInit> Pending();
  // The first call past `deadline_s` at `now_ns` not reported yet; each is reported once.
  std::optional<SetupHang> Check(uint64_t now_ns, double deadline_s);

 private:
  std::mutex mu_;
  std::vector<PendingInit> inits_;
  uint64_t next_token_ = 1;
};

}  // namespace ncclwatch
