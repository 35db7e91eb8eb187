#include "common/process_info.h"

#include <sys/random.h>
#include <unistd.h>

#include <cstdio>
#include <ctime>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

extern char** environ;

namespace ncclwatch {
namespace {

int FirstIntEnv(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    const char* v = getenv(n);
    if (!v || !*v) continue;
    char* end = nullptr;
    long x = strtol(v, &end, 10);
    if (end && *end == '\0' && x >= 0 && x < (1L << 30)) return static_cast<int>(x);
  }
  return -1;
}

std::string FirstStringEnv(std::initializer_list<const char*> names) {
  for (const char* n : names) {
    const char* v = getenv(n);
    if (v && *v) return v;
  }
  return "";
}

std::string SafeFileComponent(const std::string& s) {
  std::string out;
  for (char c : s) out += (isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return out.empty() ? "job" : out;
}

}  // namespace

ProcessIdentity ReadProcessIdentity() {
  ProcessIdentity id;
  id.env_rank = FirstIntEnv({"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK", "PMIX_RANK"});
  id.local_rank = FirstIntEnv({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"});
  id.env_world_size = FirstIntEnv({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE"});
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "unknown");
  id.host = host;
  id.pid = static_cast<int>(getpid());
  id.job_id = FirstStringEnv({"SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid"});
  auto env = [](const char* n) -> std::string {
    const char* v = getenv(n);
    return v ? v : "";
  };
  if (!env("TORCHELASTIC_RUN_ID").empty())
    id.job_instance = "torchelastic:" + env("TORCHELASTIC_RUN_ID") + ":" + env("TORCHELASTIC_RESTART_COUNT");
  else if (!env("SLURM_JOB_ID").empty())
    id.job_instance = "slurm:" + env("SLURM_JOB_ID") + "." + env("SLURM_STEP_ID") + ":" +
                      (env("SLURM_RESTART_COUNT").empty() ? "0" : env("SLURM_RESTART_COUNT"));
  else if (!env("PMIX_NAMESPACE").empty())
    id.job_instance = "pmix:" + env("PMIX_NAMESPACE");
  else if (!env("OMPI_MCA_orte_ess_jobid").empty())
    id.job_instance = "ompi:" + env("OMPI_MCA_orte_ess_jobid");
  uint64_t uid = 0;
  if (getrandom(&uid, sizeof uid, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof uid))
    uid = (static_cast<uint64_t>(id.pid) << 32) ^ static_cast<uint64_t>(clock());  // no entropy yet: still distinct here
  char hex[24];
  snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(uid));
  id.process_uid = hex;
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  id.start_unix_ns = static_cast<uint64_t>(now.tv_sec) * 1000000000ull + static_cast<uint64_t>(now.tv_nsec);
  return id;
}

std::string DefaultDumpDir(const ProcessIdentity& id) {
  return "ncclwatch-" + SafeFileComponent(id.job_id.empty() ? "job" : id.job_id);
}

std::vector<std::pair<std::string, std::string>> RelevantEnvironment() {
  static const char* kPrefixes[] = {"NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "NCCLWATCH_",
                                    "OMPI_COMM_WORLD_", "PMI_", "PMIX_RANK"};
  static const char* kExact[] = {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_MAX_CONNECTIONS", "RANK",
                                 "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                 "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                                 "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_LOCALID",
                                 "SLURM_NODEID", "SLURM_NTASKS", "LD_PRELOAD"};
  std::vector<std::pair<std::string, std::string>> out;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = strchr(*e, '=');
    if (!eq) continue;
    std::string name(*e, eq - *e);
    bool keep = false;
    for (const char* p : kPrefixes) keep = keep || name.compare(0, strlen(p), p) == 0;
    for (const char* x : kExact) keep = keep || name == x;
    if (keep) out.emplace_back(name, eq + 1);
  }
  return out;
}

std::string ExecutablePath() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, n) : std::string();
}

std::vector<std::string> CommandLine() {
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  size_t start = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i] == '\0') {
      args.push_back(all.substr(start, i - start));
      start = i + 1;
    }
  }
  return args;
}

std::string WorkingDirectory() {
  char buf[4096];
  return getcwd(buf, sizeof buf) ? std::string(buf) : std::string();
}

}  // namespace ncclwatch
