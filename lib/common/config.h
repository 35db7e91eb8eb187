// NCCLWATCH_* configuration: one table (NCCLWATCH_FOR_EACH_SETTING) drives parsing, the
// effective-config section of every dump and the README table. An invalid value gives one
// line naming the variable and the problem, and the default is used.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/log.h"
#include "ncclwatch/trace_format.h"

namespace ncclwatch {

// NCCLWATCH_TIMEOUT: "SECONDS" or "Op=SECONDS,...,default=SECONDS".
struct DeadlineSpec {
  double default_s = 60.0;
  // Fixed per-operation deadlines (0 = not set: the default and adaptive rules apply).
  double per_op_s[static_cast<int>(trace::OpKind::Count)] = {};
};

// The node-local directory (memory-backed) of the black boxes and the request relay by default;
// `ncclwatch` looks there too when the variables are unset.
constexpr const char* kNodeLocalDir = "/dev/shm";

// X(field, ENV_SUFFIX, kind, default, help). kind selects the parser.
#define NCCLWATCH_FOR_EACH_SETTING(X)                                                              \
  X(disable, DISABLE, Bool, false, "1: pure pass-through, nothing recorded")                     \
  X(dir, DIR, String, "", "dump directory (default ./ncclwatch-<job id>)")                      \
  X(ring, RING, Count, 4096, "flight-record entries per process (rounded up to a power of 2)")   \
  X(poll_ms, POLL_MS, Count, 100, "watchdog poll interval, ms")                                   \
  X(peer_poll_ms, PEER_POLL_MS, Count, 1000, "how often the job-wide dump request is checked, ms") \
  X(relay_dir, RELAY_DIR, String, kNodeLocalDir, "node-local directory where one process per host relays the request; none: off") \
  X(blackbox_dir, BLACKBOX_DIR, String, kNodeLocalDir, "node-local directory of each process's black box (read after a death without a word); none: off") \
  X(host, HOST, String, "", "this host's name in dumps and for the relay (default: the system's host name)") \
  X(store, STORE, String, "auto", "auto, on or off: the job-wide request and the dumps through the launcher's TCPStore (auto: when the dump directory is not shared across hosts)") \
  X(store_addr, STORE_ADDR, String, "", "the store's HOST:PORT (default MASTER_ADDR:MASTER_PORT)") \
  X(store_max_kb, STORE_MAX_KB, Count, 1024, "a dump published to the store is at most this large, compressed, KiB") \
  X(adaptive, ADAPTIVE, Multiplier, 20.0, "adaptive deadline = this x slowest healthy completion; 0 off") \
  X(adaptive_floor_s, ADAPTIVE_FLOOR, Seconds, 10.0, "the adaptive deadline is never below this, s") \
  X(adaptive_min_samples, ADAPTIVE_MIN_SAMPLES, Count, 3, "completions needed before adapting")  \
  X(gpu_timing, GPU_TIMING, Bool, false, "1: timing events, exact GPU durations (breaks overlap)") \
  X(graphs, GRAPHS, Bool, true, "watch operations captured into CUDA graphs at every replay (external event records)") \
  X(callsites, CALLSITES, Bool, true, "record the call-site stack of each operation")             \
  X(callsite_depth, CALLSITE_DEPTH, Count, 16, "native frames per call-site stack")               \
  X(stacks, STACKS, Bool, true, "native stacks of the main thread and the NCCL-calling threads in each dump") \
  X(python, PYTHON, Bool, true, "Python stacks in each dump when the process runs CPython")       \
  X(gil_timeout_ms, GIL_TIMEOUT_MS, Count, 2000, "bounded wait for the GIL at dump time, ms")     \
  X(signals, SIGNALS, Bool, true, "dump on SIGTERM/SIGINT and fatal signals, then chain")         \
  X(signal_wait_ms, SIGNAL_WAIT_MS, Count, 5000, "how long a signal waits for its dump, ms")        \
  X(dump_signal, DUMP_SIGNAL, Signal, "SIGUSR2", "on-demand dump signal; none to disable")         \
  X(stack_signal, STACK_SIGNAL, Signal, "SIGRTMIN+5", "signal used to sample thread stacks")       \
  X(max_dumps, MAX_DUMPS, Count, 8, "dumps per process at most (bounds disk use)")                \
  X(exit_record, EXIT_RECORD, Bool, true, "a small record of where the rank stopped at a normal exit") \
  X(cmdline, CMDLINE, Bool, true, "record the command line in dumps (secret-looking values redacted); 0: none") \
  X(job_instance, JOB_INSTANCE, String, "", "this attempt's id (default from the launcher's variables)") \
  X(run_id, RUN_ID, String, "", "set by ncclwatch run: its run's id, put before the job instance (one directory, one job)") \
  X(metrics, METRICS, String, "", "directory for a Prometheus textfile per process; empty: off")   \
  X(log, LOG, Level, "warn", "quiet, warn, info or debug")                                          \
  X(nccl_lib, NCCL_LIB, String, "libnccl.so.2", "NCCL library to look in when RTLD_NEXT fails")    \
  X(cuda_lib, CUDA_LIB, String, "libcuda.so.1", "CUDA driver library")

// Types and initial values per setting kind.
int DefaultSignal(const char* text);
LogLevel DefaultLevel(const char* text);
#define NCCLWATCH_SETTING_TYPE_Bool bool
#define NCCLWATCH_SETTING_TYPE_String std::string
#define NCCLWATCH_SETTING_TYPE_Count uint64_t
#define NCCLWATCH_SETTING_TYPE_Seconds double
#define NCCLWATCH_SETTING_TYPE_Multiplier double
#define NCCLWATCH_SETTING_TYPE_Signal int
#define NCCLWATCH_SETTING_TYPE_Level LogLevel
#define NCCLWATCH_SETTING_INIT_Bool(d) d
#define NCCLWATCH_SETTING_INIT_String(d) d
#define NCCLWATCH_SETTING_INIT_Count(d) d
#define NCCLWATCH_SETTING_INIT_Seconds(d) d
#define NCCLWATCH_SETTING_INIT_Multiplier(d) d
#define NCCLWATCH_SETTING_INIT_Signal(d) DefaultSignal(d)
#define NCCLWATCH_SETTING_INIT_Level(d) DefaultLevel(d)

struct Config {
#define NCCLWATCH_SETTING_FIELD(field, env, kind, def, help) \
  NCCLWATCH_SETTING_TYPE_##kind field = NCCLWATCH_SETTING_INIT_##kind(def);
  NCCLWATCH_FOR_EACH_SETTING(NCCLWATCH_SETTING_FIELD)
#undef NCCLWATCH_SETTING_FIELD
  DeadlineSpec timeout;  // NCCLWATCH_TIMEOUT, parsed separately (its own syntax)
};

using EnvLookup = const char* (*)(const char*);

struct ConfigResult {
  Config config;
  std::vector<std::string> errors;  // one line each, "NCCLWATCH_X='v': problem; using default D"
};

// With envp (the environment), NCCLWATCH_ variables that are no setting are named too.
ConfigResult ParseConfig(EnvLookup getenv_fn, const char* const* envp = nullptr);

// Pieces exposed for tests and for the tools.
bool ParseDeadlineSpec(const std::string& text, DeadlineSpec* out, std::string* error);
bool ParseSignal(const std::string& text, int* signo, std::string* error);
// Why `signo` may not serve as an on-demand dump or stack-sampling signal ("" when it may):
// terminating, fatal, job-control and process-machinery signals keep their own meaning.
std::string SignalNotTakenOver(int signo);
// The largest number of seconds any NCCLWATCH_ setting accepts.
constexpr double kMaxSettingSeconds = 1e7;
std::string SignalName(int signo);
// "key=value" lines of the effective settings (for dumps and --help).
std::vector<std::pair<std::string, std::string>> DescribeConfig(const Config& c);

}  // namespace ncclwatch
