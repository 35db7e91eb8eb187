// The simulator's driver-call log, as bench_driver_calls and bench_graph_calls count it: the fake
// driver (NCCLWATCH_SIM_CUDA_LOG=1) writes one line per call to fd 2, which goes to a file of a
// temporary directory; the benchmark reads it between phases and subtracts a baseline.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

namespace bench {

class DriverCallLog {
 public:
  // Sets the library's environment for a one-rank run (dumps into the temporary directory, no
  // black box, no relay, no exit record, a 10 ms poll) and sends fd 2 to the log. `out()` is the
  // real stderr. False: not set up.
  bool Open(const char* name) {
    std::snprintf(dir_, sizeof dir_, "/tmp/ncclwatch-%s-XXXXXX", name);
    if (!mkdtemp(dir_)) return false;
    setvbuf(stdout, nullptr, _IOLBF, 0);
    setenv("NCCLWATCH_SIM_CUDA_LOG", "1", 1);
    setenv("NCCLWATCH_DIR", dir_, 1);
    setenv("NCCLWATCH_POLL_MS", "10", 0);
    setenv("NCCLWATCH_BLACKBOX_DIR", "none", 0);
    setenv("NCCLWATCH_RELAY_DIR", "none", 0);
    setenv("NCCLWATCH_EXIT_RECORD", "0", 0);
    path_ = std::string(dir_) + "/driver.log";
    out_ = fdopen(dup(2), "w");
    const int fd = open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    log_ = std::fopen(path_.c_str(), "r");
    if (!out_ || fd < 0 || !log_ || dup2(fd, 2) < 0) return false;
    close(fd);
    return true;
  }
  ~DriverCallLog() {
    if (!path_.empty()) unlink(path_.c_str());
    rmdir(dir_);
  }
  FILE* out() const { return out_; }

  // Driver calls logged since the last call, by function name, with "others:" before the name
  // of a call made by another thread than `tid` (the watchdog's).
  std::map<std::string, long> Drain(long tid) {
    std::map<std::string, long> calls;
    std::fflush(stderr);
    char line[256];
    std::clearerr(log_);
    while (std::fgets(line, sizeof line, log_)) {
      const char* p = std::strstr(line, "[sim-cuda] ");
      if (!p) continue;
      p += std::strlen("[sim-cuda] ");
      const char* end = std::strchr(p, ' ');
      const char* t = std::strstr(p, " tid ");
      const bool mine = t && std::atol(t + 5) == tid;
      calls[(mine ? "" : "others:") + std::string(p, end ? static_cast<size_t>(end - p) : std::strlen(p))]++;
    }
    return calls;
  }

 private:
  char dir_[64] = "";
  std::string path_;
  FILE* out_ = nullptr;
  FILE* log_ = nullptr;
};

// Calls added per unit (`with` - `base`, divided by `per`), on the calling thread and on others,
// with each call's figure where it is not 0 ("cuEventRecord +2.00, ...").
struct AddedCalls {
  double mine = 0, others = 0;
  std::string detail;
};

inline AddedCalls Added(std::map<std::string, long> with, std::map<std::string, long> base, double per) {
  AddedCalls c;
  for (auto& [name, count] : with) base[name] += 0;
  for (auto& [name, count] : base) {
    const double added = static_cast<double>(with[name] - count) / per;
    (name.compare(0, 7, "others:") == 0 ? c.others : c.mine) += added;
    if (added > 0.005 || added < -0.005) {
      char part[96];
      std::snprintf(part, sizeof part, "%s %+.2f, ", name.c_str(), added);
      c.detail += part;
    }
  }
  if (c.detail.size() > 2) c.detail.resize(c.detail.size() - 2);
  return c;
}

}  // namespace bench
