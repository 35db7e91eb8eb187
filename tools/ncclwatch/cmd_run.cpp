// `ncclwatch run [options] -- COMMAND ...`: starts a job with libncclwatch.so preloaded, returns
// the job's exit status unchanged, and analyzes the dumps if any were written.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "subcommand.h"

// Set by tools/CMakeLists.txt; defaults for a build outside CMake.
#ifndef NCCLWATCH_LIBDIR_FROM_BINDIR
#define NCCLWATCH_LIBDIR_FROM_BINDIR "../lib"
#endif
#ifndef NCCLWATCH_MULTIARCH
#define NCCLWATCH_MULTIARCH ""
#endif

namespace ncclwatch {
namespace cli {

extern const Subcommand kAnalyzeCommand;

namespace {

void RunHelp(std::FILE* out) {
  std::fprintf(out,
               "usage: ncclwatch run [options] -- COMMAND [ARGS...]\n\n"
               "Runs COMMAND with libncclwatch.so preloaded (prepended to LD_PRELOAD, so every\n"
               "process the command starts inherits it), a job-scoped dump directory, and the\n"
               "options below as NCCLWATCH_* variables. Returns COMMAND's exit status unchanged;\n"
               "if dumps were written, runs `ncclwatch analyze` on them first.\n\n"
               "options:\n"
               "  --dir DIR          dump directory (default: ./ncclwatch-<SLURM_JOB_ID |\n"
               "                     TORCHELASTIC_RUN_ID | PMIX_NAMESPACE | start time>)\n"
               "  --timeout SPEC     NCCLWATCH_TIMEOUT: seconds, or AllGather=120,default=300\n"
               "  --set NAME=VALUE   any other setting, e.g. --set RING=8192 (NCCLWATCH_ prefix optional)\n"
               "  --lib PATH         libncclwatch.so to preload (default: next to this program)\n"
               "  --no-analyze       do not analyze the dumps afterwards\n\n"
               "launchers (one line each):\n"
               "  ncclwatch run -- torchrun --nproc-per-node 8 train.py\n"
               "  ncclwatch run -- deepspeed --num_gpus 8 train.py\n"
               "  ncclwatch run -- mpirun -np 16 -x LD_PRELOAD -x NCCLWATCH_DIR ./app\n"
               "  srun ncclwatch run -- python train.py   (every task agrees on the directory\n"
               "                     through SLURM_JOB_ID; only task 0 prints the analysis)\n");
}

std::string Dirname(const std::string& p) {
  size_t s = p.rfind('/');
  return s == std::string::npos ? "." : p.substr(0, s);
}

bool IsFile(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string FindLibrary(std::string* looked) {
  if (const char* env = getenv("NCCLWATCH_LIB")) return env;
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  std::string bindir = n > 0 ? Dirname(std::string(buf, n)) : ".";
  // The install tree this was configured for (bin/ and GNUInstallDirs' lib dir), the build tree
  // (bin/ beside lib/), the other usual lib dirs of a prefix, or the same directory.
  std::vector<std::string> dirs = {bindir + "/" NCCLWATCH_LIBDIR_FROM_BINDIR, bindir + "/../lib"};
  if (*NCCLWATCH_MULTIARCH) dirs.push_back(bindir + "/../lib/" NCCLWATCH_MULTIARCH);
  dirs.push_back(bindir + "/../lib64");
  dirs.push_back(bindir);
  for (size_t k = 0; k < dirs.size(); ++k) {
    if (std::find(dirs.begin(), dirs.begin() + k, dirs[k]) != dirs.begin() + k) continue;
    const std::string c = dirs[k] + "/libncclwatch.so";
    if (IsFile(c)) {
      char real[4096];
      return realpath(c.c_str(), real) ? std::string(real) : c;
    }
    *looked += (looked->empty() ? "" : ", ") + c;
  }
  return "";
}

std::string DefaultDir() {
  for (const char* v : {"SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE", "OMPI_MCA_orte_ess_jobid"}) {
    const char* id = getenv(v);
    if (id && *id) {
      std::string safe;
      for (const char* p = id; *p; ++p) safe += isalnum(static_cast<unsigned char>(*p)) || *p == '-' ? *p : '_';
      return "ncclwatch-" + safe;
    }
  }
  char stamp[32];
  time_t now = time(nullptr);
  strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime(&now));
  return std::string("ncclwatch-") + stamp + "-" + std::to_string(getpid());
}

int CountDumps(const std::string& dir) {
  int n = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (strncmp(e->d_name, "rank", 4) == 0 && strstr(e->d_name, ".json")) ++n;
    closedir(d);
  }
  return n;
}

pid_t g_child = -1;

void Forward(int sig) {
  if (g_child > 0) kill(g_child, sig);
}

// Only one task of a job prints the analysis (srun starts one `ncclwatch run` per task).
bool IsFirstTask() {
  for (const char* v : {"SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK"}) {
    const char* r = getenv(v);
    if (r && *r) return atoi(r) == 0;
  }
  return true;
}

int Run(int argc, char** argv) {
  std::string dir, lib;
  bool analyze = true;
  std::vector<std::pair<std::string, std::string>> settings;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (a == "--") {
      ++i;
      break;
    } else if (a == "--dir" || a == "--timeout" || a == "--set" || a == "--lib") {
      const char* v = value();
      if (!v) return UsageError("run", (a + " needs a value").c_str());
      if (a == "--dir") dir = v;
      else if (a == "--lib") lib = v;
      else if (a == "--timeout") settings.emplace_back("NCCLWATCH_TIMEOUT", v);
      else {
        const char* eq = strchr(v, '=');
        if (!eq || eq == v) return UsageError("run", "--set takes NAME=VALUE");
        std::string name(v, eq - v);
        for (auto& c : name) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
        if (name.rfind("NCCLWATCH_", 0) != 0) name = "NCCLWATCH_" + name;
        settings.emplace_back(name, eq + 1);
      }
    } else if (a == "--help" || a == "-h") {  // only before "--": after it, the words are the job's
      RunHelp(stdout);
      return kExitOk;
    } else if (a == "--no-analyze") {
      analyze = false;
    } else {
      return UsageError("run", ("unknown option '" + a + "' (the command goes after --)").c_str());
    }
  }
  if (i >= argc) return UsageError("run", "no command given: ncclwatch run [options] -- COMMAND ...");

  std::string looked;
  if (lib.empty()) lib = FindLibrary(&looked);
  if (lib.empty() || !IsFile(lib)) {
    std::fprintf(stderr, "ncclwatch run: cannot find libncclwatch.so (looked in %s); pass --lib PATH\n",
                 lib.empty() ? looked.c_str() : lib.c_str());
    return kExitBadInput;
  }
  if (dir.empty()) dir = getenv("NCCLWATCH_DIR") && *getenv("NCCLWATCH_DIR") ? getenv("NCCLWATCH_DIR") : DefaultDir();

  const char* old = getenv("LD_PRELOAD");
  std::string preload = lib + (old && *old ? std::string(":") + old : std::string());
  setenv("LD_PRELOAD", preload.c_str(), 1);
  setenv("NCCLWATCH_DIR", dir.c_str(), 1);
  for (auto& kv : settings) setenv(kv.first.c_str(), kv.second.c_str(), 1);
  int dumps_before = CountDumps(dir);

  pid_t child = fork();
  if (child < 0) {
    std::fprintf(stderr, "ncclwatch run: fork failed: %s\n", strerror(errno));
    return kExitBadInput;
  }
  if (child == 0) {
    execvp(argv[i], argv + i);
    std::fprintf(stderr, "ncclwatch run: cannot run '%s': %s\n", argv[i], strerror(errno));
    _exit(127);
  }
  // The launcher's signals (Slurm, a terminal) reach the job as if we were not in between.
  g_child = child;
  struct sigaction sa {};
  sa.sa_handler = Forward;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int s : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2}) sigaction(s, &sa, nullptr);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  g_child = -1;

  int dumps = CountDumps(dir) - dumps_before;
  if (analyze && dumps > 0 && IsFirstTask()) {
    std::fflush(stdout);
    std::fprintf(stderr, "\nncclwatch: %d dump(s) written to %s; analysis:\n\n", dumps, dir.c_str());
    std::string d = dir;
    char name[] = "analyze";
    char* args[] = {name, &d[0], nullptr};
    kAnalyzeCommand.run(2, args);
    std::fflush(stdout);
  }
  if (WIFSIGNALED(status)) {
    // Die of the same signal, so whoever started us sees the job's own status.
    int sig = WTERMSIG(status);
    signal(sig, SIG_DFL);
    raise(sig);
    return 128 + sig;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace

extern const Subcommand kRunCommand = {"run", "start a job with ncclwatch preloaded, then analyze its dumps", &Run,
                                       &RunHelp};

}  // namespace cli
}  // namespace ncclwatch
