// simlaunch: starts N ranks of a program on this machine, as torchrun would, against the
// simulated CUDA driver and NCCL. See `simlaunch --help` and docs/simulator.md.
#include <dirent.h>
#include <ftw.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifndef SIMLAUNCH_SIM_DIR
#define SIMLAUNCH_SIM_DIR ""
#endif

namespace {

constexpr int kGraceSeconds = 5;  // between SIGTERM and SIGKILL at --timeout

const char kUsage[] =
    "usage: simlaunch -n N [options] -- COMMAND [ARGS...]\n"
    "Starts N ranks of COMMAND with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK=0,\n"
    "MASTER_ADDR=127.0.0.1, NCCLWATCH_SIM_SESSION, NCCLWATCH_SIM_RUNDIR (a fresh directory) and\n"
    "the simulator directory first in LD_LIBRARY_PATH. LD_PRELOAD is passed on unchanged.\n"
    "\n"
    "  -n N              number of ranks (1..1024)\n"
    "  --timeout SEC     after SEC seconds: SIGTERM to every rank, SIGKILL 5 s later, exit 124\n"
    "  --env K=V         set K=V for every rank (repeatable; applied last)\n"
    "  --quiet           print nothing of simlaunch's own\n"
    "  --sim-dir DIR     directory of libnccl.so.2 / libcuda.so.1 (default: the build's)\n"
    "  --session NAME    session name (default: unique); [A-Za-z0-9] only\n"
    "  --keep-shm        do not remove /dev/shm/ncclsim-<session>-* at the end (for tests)\n"
    "  --hosts H         spread the ranks over H simulated hosts, in blocks of N/H (rounded up):\n"
    "                    NCCLWATCH_HOST=simhost<k>, LOCAL_RANK and LOCAL_WORLD_SIZE per host\n"
    "\n"
    "SIGINT and SIGTERM are forwarded to every rank. SIGUSR1 is the time limit now: SIGTERM,\n"
    "SIGKILL 5 s later and exit 124, as at --timeout (a test that has seen what it waited for ends\n"
    "the job as its time limit would, without waiting it out). One line per rank that exited\n"
    "non-zero or was killed. Exit status: 0 if every rank exited 0; 124 on --timeout (or SIGUSR1);\n"
    "else, for the first rank that failed, 128+signal if it was killed by a signal, or 1 if it\n"
    "exited non-zero.\n";

struct Rank {
  pid_t pid = -1;
  bool running = false;
  int status = 0;
};

double Now() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

bool Failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

// Removes /dev/shm/ncclsim-<session>-*: what ranks killed before their peers attached leave.
int RemoveSegments(const std::string& session) {
  const std::string prefix = "ncclsim-" + session + "-";
  int removed = 0;
  if (DIR* d = opendir("/dev/shm")) {
    while (struct dirent* e = readdir(d)) {
      if (strncmp(e->d_name, prefix.c_str(), prefix.size()) == 0 &&
          shm_unlink(("/" + std::string(e->d_name)).c_str()) == 0)
        ++removed;
    }
    closedir(d);
  }
  return removed;
}

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  remove(path);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 0;
  double timeout = 0;
  int hosts = 0;  // 0: one real host, NCCLWATCH_HOST left alone
  bool quiet = false, cleanup = true;  // cleanup: of /dev/shm
  std::string sim_dir = SIMLAUNCH_SIM_DIR, session;
  std::vector<std::string> envs;
  int cmd = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* what) -> std::string {
      if (i + 1 >= argc) {
        fprintf(stderr, "simlaunch: %s needs a value\n%s", what, kUsage);
        exit(2);
      }
      return argv[++i];
    };
    if (a == "--") {
      cmd = i + 1;
      break;
    } else if (a == "-n") {
      n = atoi(value("-n").c_str());
    } else if (a == "--timeout") {
      timeout = atof(value("--timeout").c_str());
    } else if (a == "--env") {
      std::string kv = value("--env");
      if (kv.find('=') == std::string::npos || kv[0] == '=') {
        fprintf(stderr, "simlaunch: --env expects K=V, got '%s'\n", kv.c_str());
        return 2;
      }
      envs.push_back(kv);
    } else if (a == "--quiet") {
      quiet = true;
    } else if (a == "--sim-dir") {
      sim_dir = value("--sim-dir");
    } else if (a == "--session") {
      session = value("--session");
    } else if (a == "--keep-shm") {
      cleanup = false;
    } else if (a == "--hosts") {
      hosts = atoi(value("--hosts").c_str());
    } else if (a == "-h" || a == "--help") {
      fputs(kUsage, stdout);
      return 0;
    } else {
      fprintf(stderr, "simlaunch: unknown option '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (n < 1 || n > 1024 || cmd < 0 || cmd >= argc || timeout < 0 || hosts < 0 || hosts > n) {
    fputs(kUsage, stderr);
    return 2;
  }
  if (session.empty()) {
    char buf[64];
    snprintf(buf, sizeof buf, "L%dx%lx", static_cast<int>(getpid()),
             static_cast<unsigned long>(static_cast<unsigned long long>(Now() * 1e6) & 0xffffffff));
    session = buf;
  }
  if (!std::all_of(session.begin(), session.end(), [](char c) { return isalnum(static_cast<unsigned char>(c)); })) {
    fprintf(stderr, "simlaunch: --session must be alphanumeric\n");
    return 2;
  }
  const char* tmp = getenv("TMPDIR");
  std::string rundir = std::string(tmp && *tmp ? tmp : "/tmp") + "/simlaunch-XXXXXX";
  if (!mkdtemp(rundir.data())) {
    fprintf(stderr, "simlaunch: mkdtemp %s: %s\n", rundir.c_str(), strerror(errno));
    return 2;
  }

  // Signals are taken synchronously with sigtimedwait; the ranks get the original mask back.
  sigset_t handled, original;
  sigemptyset(&handled);
  sigaddset(&handled, SIGCHLD);
  sigaddset(&handled, SIGINT);
  sigaddset(&handled, SIGTERM);
  sigaddset(&handled, SIGUSR1);
  sigprocmask(SIG_BLOCK, &handled, &original);

  const pid_t launcher = getpid();
  std::vector<Rank> ranks(n);
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("simlaunch: fork");
      break;
    }
    if (pid == 0) {
      // Own process group: a terminal's Ctrl-C reaches only simlaunch, which forwards it once.
      setpgid(0, 0);
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a killed launcher
      if (getppid() != launcher) _exit(127);
      sigprocmask(SIG_SETMASK, &original, nullptr);
      auto set = [](const char* k, const std::string& v) { setenv(k, v.c_str(), 1); };
      set("RANK", std::to_string(r));
      set("WORLD_SIZE", std::to_string(n));
      if (hosts > 0) {
        const int per_host = (n + hosts - 1) / hosts;
        set("NCCLWATCH_HOST", "simhost" + std::to_string(r / per_host));
        set("LOCAL_RANK", std::to_string(r % per_host));
        set("LOCAL_WORLD_SIZE", std::to_string(std::min(per_host, n - r / per_host * per_host)));
      } else {
        set("LOCAL_RANK", std::to_string(r));
        set("LOCAL_WORLD_SIZE", std::to_string(n));
      }
      set("GROUP_RANK", "0");
      set("MASTER_ADDR", "127.0.0.1");
      set("NCCLWATCH_SIM_SESSION", session);
      set("NCCLWATCH_SIM_RUNDIR", rundir);
      if (!sim_dir.empty()) {
        const char* old = getenv("LD_LIBRARY_PATH");
        set("LD_LIBRARY_PATH", old && *old ? sim_dir + ":" + old : sim_dir);
      }
      for (const std::string& kv : envs) {
        size_t eq = kv.find('=');
        set(kv.substr(0, eq).c_str(), kv.substr(eq + 1));
      }
      execvp(argv[cmd], argv + cmd);
      fprintf(stderr, "simlaunch: rank %d: cannot run %s: %s\n", r, argv[cmd], strerror(errno));
      _exit(127);
    }
    setpgid(pid, pid);  // also from here, so the group exists before any signal is sent
    ranks[r].pid = pid;
    ranks[r].running = true;
  }

  int running = static_cast<int>(std::count_if(ranks.begin(), ranks.end(), [](const Rank& k) { return k.running; }));
  int first_failure = -1;  // rank index, in the order failures were reaped
  bool timed_out = false, ended_early = false;
  const double started = Now();
  double deadline = timeout > 0 ? started + timeout : 0;
  double kill_at = 0;  // after the grace period: SIGKILL
  auto signal_all = [&](int sig) {
    for (const Rank& k : ranks)
      if (k.running) kill(k.pid, sig);
  };
  while (running > 0) {
    // Reap first: SIGCHLD may have been merged with an earlier one.
    for (;;) {
      int status = 0;
      pid_t pid = waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      for (int r = 0; r < n; ++r) {
        if (ranks[r].pid != pid || !ranks[r].running) continue;
        ranks[r].running = false;
        ranks[r].status = status;
        --running;
        if (Failed(status) && first_failure < 0) first_failure = r;
      }
    }
    if (running == 0) break;
    double now = Now(), wake = 1e9;
    if (deadline > 0 && !timed_out) {
      if (now >= deadline) {
        timed_out = true;
        if (!quiet) {
          std::string list;
          for (int r = 0; r < n; ++r)
            if (ranks[r].running) list += " " + std::to_string(r);
          if (ended_early)
            fprintf(stderr, "simlaunch: time limit ended by SIGUSR1 after %.1f s; still running: ranks%s\n",
                    now - started, list.c_str());
          else
            fprintf(stderr, "simlaunch: timeout after %g s; still running: ranks%s\n", timeout, list.c_str());
        }
        signal_all(SIGTERM);
        kill_at = now + kGraceSeconds;
      } else {
        wake = deadline - now;
      }
    }
    if (kill_at > 0) {
      if (now >= kill_at) {
        signal_all(SIGKILL);
        kill_at = 0;
      } else {
        wake = std::min(wake, kill_at - now);
      }
    }
    struct timespec ts;
    ts.tv_sec = static_cast<time_t>(std::min(wake, 3600.0));
    ts.tv_nsec = static_cast<long>((std::min(wake, 3600.0) - static_cast<double>(ts.tv_sec)) * 1e9);
    int sig = sigtimedwait(&handled, nullptr, &ts);
    if (sig == SIGINT || sig == SIGTERM) signal_all(sig);
    if (sig == SIGUSR1 && !timed_out) {  // the time limit, now
      deadline = Now();
      ended_early = true;
    }
  }

  for (int r = 0; r < n; ++r) {
    if (quiet || ranks[r].pid < 0 || !Failed(ranks[r].status)) continue;
    int st = ranks[r].status;
    if (WIFSIGNALED(st))
      fprintf(stderr, "simlaunch: rank %d killed by %s\n", r, SignalName(WTERMSIG(st)).c_str());
    else
      fprintf(stderr, "simlaunch: rank %d exited with code %d\n", r, WEXITSTATUS(st));
  }
  if (cleanup) {
    int removed = RemoveSegments(session);
    if (removed && !quiet) fprintf(stderr, "simlaunch: removed %d leftover shared-memory segment(s)\n", removed);
  }
  nftw(rundir.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
  if (timed_out) return 124;
  if (first_failure < 0) return std::any_of(ranks.begin(), ranks.end(), [](const Rank& k) { return k.pid < 0; }) ? 1 : 0;
  const int st = ranks[first_failure].status;
  return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : 1;
}
