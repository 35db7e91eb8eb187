#include "common/process_info.h"
#include "common/redaction.h"

#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>

#include <cstdlib>
#include <cctype>
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

}  // namespace

std::string LauncherJobId() {
  return FirstStringEnv({"SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid"});
}

std::string HostName() {
  const std::string configured = FirstStringEnv({"NCCLWATCH_HOST"});
  if (!configured.empty()) return configured;
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0 || !host[0]) return "unknown";
  return host;
}

ProcessIdentity ReadProcessIdentity() {
  ProcessIdentity id;
  id.env_rank = FirstIntEnv({"RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK", "PMIX_RANK"});
  id.local_rank = FirstIntEnv({"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"});
  id.env_world_size = FirstIntEnv({"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE"});
  id.host = HostName();
  id.pid = static_cast<int>(getpid());
  id.job_id = LauncherJobId();
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

std::string DefaultDumpDir(const std::string& job_id, const std::string& unnamed) {
  std::string safe;
  for (char c : job_id) safe += (isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.') ? c : '_';
  return "ncclwatch-" + (safe.empty() ? unnamed : safe);
}

std::string DefaultDumpDir(const ProcessIdentity& id) { return DefaultDumpDir(id.job_id); }

std::vector<std::pair<std::string, std::string>> RelevantEnvironment() {
  // Exactly what docs/trace-format.md promises: a variable that is not listed there is not kept.
  static const char* kPrefixes[] = {"NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "NCCLWATCH_", "OMPI_COMM_WORLD_"};
  static const char* kExact[] = {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_MAX_CONNECTIONS", "RANK", "WORLD_SIZE",
                                 "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
                                 "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "SLURM_JOB_ID",
                                 "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID",
                                 "SLURM_NTASKS", "SLURM_RESTART_COUNT", "PMI_RANK", "PMI_SIZE", "PMIX_RANK",
                                 "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid", "LD_PRELOAD"};
  std::vector<std::pair<std::string, std::string>> out;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = strchr(*e, '=');
    if (!eq) continue;
    std::string name(*e, eq - *e);
    bool keep = false;
    for (const char* p : kPrefixes) keep = keep || name.compare(0, strlen(p), p) == 0;
    for (const char* x : kExact) keep = keep || name == x;
    if (keep) out.emplace_back(name, RedactValue(name, eq + 1));
  }
  return out;
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
  return RedactCommandLine(args);
}

std::string WorkingDirectory() {
  char buf[4096];
  return getcwd(buf, sizeof buf) ? std::string(buf) : std::string();
}

std::string UserPrivateDir(const std::string& dir, std::string* why, bool create) {
  struct stat st {};
  // Missing or unreadable: as it is, for its user to say why it cannot use it (one line each).
  if (lstat(dir.c_str(), &st) != 0) return dir;
  const uid_t uid = getuid();
  // Only its owner (this user) can write to it: nobody else can place or replace a file there.
  if (S_ISDIR(st.st_mode) && st.st_uid == uid && (st.st_mode & (S_IWGRP | S_IWOTH)) == 0) return dir;
  const std::string mine = dir + "/ncclwatch-" + std::to_string(uid);
  if (!create && lstat(mine.c_str(), &st) != 0) return mine;
  if (create && mkdir(mine.c_str(), 0700) != 0 && errno != EEXIST) {
    *why = mine + ": cannot create it (" + std::strerror(errno) + ")";
    return std::string();
  }
  if (lstat(mine.c_str(), &st) != 0) {
    *why = mine + ": " + std::strerror(errno);
    return std::string();
  }
  if (S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode)) {
    *why = mine + " is not a directory (a link or a file someone else put there): not used";
  } else if (st.st_uid != uid) {
    *why = mine + " belongs to user " + std::to_string(st.st_uid) + ", not to this one: not used";
  } else if ((st.st_mode & 077) != 0) {
    *why = mine + " is open to other users (mode " + std::to_string((st.st_mode >> 6) & 7) +
           std::to_string((st.st_mode >> 3) & 7) + std::to_string(st.st_mode & 7) + ", 700 expected): not used";
  } else {
    return mine;
  }
  return std::string();
}

}  // namespace ncclwatch
