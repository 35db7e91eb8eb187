#include "common/process_info.h"

#include <sys/random.h>
#include <unistd.h>

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

bool NameLooksSecret(const std::string& name) {
  static const char* kSecretWords[] = {"token", "secret", "passw", "passphrase", "credential", "auth",
                                       "apikey", "api_key", "api-key", "key",   "cookie", "private",
                                       "signature", "session"};
  std::string lower;
  for (char c : name) lower += static_cast<char>(tolower(static_cast<unsigned char>(c)));
  for (const char* w : kSecretWords)
    if (lower.find(w) != std::string::npos) return true;
  return false;
}

bool ValueLooksSecret(const std::string& value) {
  static const char* kCredentialPrefixes[] = {"hf_", "ghp_", "gho_", "ghs_", "github_pat_", "glpat-",
                                              "sk-", "xoxb-", "xoxp-", "AKIA", "ASIA", "AIza"};
  for (const char* p : kCredentialPrefixes) {
    size_t n = strlen(p);
    if (value.size() < n + 16 || value.compare(0, n, p) != 0) continue;
    bool token_chars = true;
    for (size_t i = n; i < value.size() && token_chars; ++i) {
      unsigned char c = static_cast<unsigned char>(value[i]);
      token_chars = isalnum(c) || c == '_' || c == '-';
    }
    if (token_chars) return true;
  }
  return false;
}

namespace {

// scheme://user:password@host... -> scheme://user:<redacted>@host...
std::string RedactUrlPassword(const std::string& s) {
  size_t scheme = s.find("://");
  if (scheme == std::string::npos) return s;
  size_t start = scheme + 3;
  size_t end = s.find_first_of("/?#", start);
  size_t at = s.rfind('@', end == std::string::npos ? std::string::npos : end);
  if (at == std::string::npos || at < start) return s;
  size_t colon = s.find(':', start);
  if (colon == std::string::npos || colon > at) return s;
  return s.substr(0, colon + 1) + kRedacted + s.substr(at);
}

std::string RedactValue(const std::string& name, const std::string& value) {
  if (NameLooksSecret(name) || ValueLooksSecret(value)) return kRedacted;
  return RedactUrlPassword(value);
}

}  // namespace

std::vector<std::string> RedactCommandLine(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  out.reserve(args.size());
  bool next_is_secret = false;  // "--hf_token abc": the value follows its option
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (next_is_secret && a.compare(0, 2, "--") != 0) {
      out.push_back(kRedacted);
      next_is_secret = false;
      continue;
    }
    next_is_secret = false;
    size_t eq = a.find('=');
    if (i > 0 && eq != std::string::npos && eq > 0) {  // --x=v, -x=v, x=v (overrides like a.b.token=v)
      std::string name = a.substr(0, eq);
      out.push_back(name + "=" + RedactValue(name, a.substr(eq + 1)));
      continue;
    }
    if (i > 0 && a.size() > 1 && a[0] == '-' && NameLooksSecret(a)) next_is_secret = true;
    out.push_back(i > 0 && ValueLooksSecret(a) ? std::string(kRedacted) : RedactUrlPassword(a));
  }
  return out;
}

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
  return RedactCommandLine(args);
}

std::string WorkingDirectory() {
  char buf[4096];
  return getcwd(buf, sizeof buf) ? std::string(buf) : std::string();
}

}  // namespace ncclwatch
