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

#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "rules/attribution.h"
#include "model/dump_set.h"
#include "render/render_report.h"
#include "render/symbolize_debug.h"
#include "common/config.h"
#include "format/display.h"
#include "format/file_name.h"
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


namespace {

void RunHelp(std::FILE* out) {
  std::fprintf(out,
               "usage: ncclwatch run [options] -- COMMAND [ARGS...]\n\n"
               "Runs COMMAND with libncclwatch.so preloaded (prepended to LD_PRELOAD, so every\n"
               "process the command starts inherits it), a job-scoped dump directory, and the\n"
               "options below as NCCLWATCH_* variables. Returns COMMAND's exit status unchanged;\n"
               "while it runs, a hang's verdict is printed as soon as the ranks' dumps are in\n"
               "(the job goes on); at the end, the analysis again if anything changed, and one\n"
               "line on what was watched.\n\n"
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

std::set<std::string> DumpFiles(const std::string& dir) {
  std::vector<std::string> names;
  std::string error;
  trace::ListDumpFiles(dir, &names, &error);  // not there yet: none
  return {names.begin(), names.end()};
}

// The settings given with --timeout and --set, checked by the library's own parser before
// anything starts (every rank would print the same error otherwise, and use a default).
const std::map<std::string, std::string>* g_settings = nullptr;
const char* SettingLookup(const char* name) {
  auto it = g_settings->find(name);
  return it == g_settings->end() ? nullptr : it->second.c_str();
}

bool CheckSettings(const std::vector<std::pair<std::string, std::string>>& given) {
  std::set<std::string> known = {"NCCLWATCH_TIMEOUT", "NCCLWATCH_DIR"};
  for (const auto& kv : DescribeConfig(Config{})) known.insert(kv.first);
  std::map<std::string, std::string> settings(given.begin(), given.end());
  bool ok = true;
  for (const auto& kv : settings)
    if (!known.count(kv.first)) {
      std::fprintf(stderr, "ncclwatch run: unknown setting %s (the settings: README, `Configuration`)\n",
                   kv.first.c_str());
      ok = false;
    }
  g_settings = &settings;
  for (std::string e : ParseConfig(&SettingLookup).errors) {
    e = e.substr(0, e.find("; using"));  // the library would fall back; run refuses instead
    std::fprintf(stderr, "ncclwatch run: %s\n", e.c_str());
    ok = false;
  }
  g_settings = nullptr;
  return ok;
}

// The dumps of this run, watched while it runs: a hang's verdict as soon as its episode's dumps
// are in (every rank of the world answered, or a few seconds passed since the first).
class LiveWatch {
 public:
  LiveWatch(std::string dir, bool print) : dir_(std::move(dir)), print_(print), before_(DumpFiles(dir_)) {}

  void Poll() {
    std::set<std::string> now = DumpFiles(dir_);
    size_t fresh = 0;
    for (const auto& n : now) fresh += !before_.count(n);
    if (fresh == files_) {
      if (files_ > reported_files_ && episode_started_ &&
          std::chrono::steady_clock::now() - first_new_ > kEpisodeSettle)
        Report(false);
      return;
    }
    if (!episode_started_ || files_ == reported_files_) first_new_ = std::chrono::steady_clock::now();
    episode_started_ = true;
    files_ = fresh;
    analysis::DumpSet set = Load();
    if (AllRanksIn(set)) Report(false, &set);
  }

  // At the end: the analysis, unless one printed while the job ran already tells it (no dump
  // since, or the same verdicts). An analysis made while running that was not news (no hang:
  // a healthy job stopped by SIGTERM, say) is printed now.
  void Finish() {
    Poll();
    const bool news = files_ > printed_files_ && Report(true);
    if (!news && printed_files_ > 0 && print_) std::fprintf(stderr, "ncclwatch: no change since the report above\n");
    Summary();
  }

  size_t files() const { return files_; }

 private:
  static constexpr auto kEpisodeSettle = std::chrono::seconds(5);
  mutable analysis::SummaryCache cache_;

  // Each load reads only the dumps that came in since the last (the summaries read are kept).
  analysis::DumpSet Load() const {
    analysis::DumpSet set;
    analysis::LoadOptions options;
    options.cache = &cache_;
    std::string error;
    set.Load(dir_, options, &error);
    return set;
  }

  bool AllRanksIn(const analysis::DumpSet& set) const {
    int answered = 0;
    for (const auto& d : set.dumps()) answered += !before_.count(d.file_name);
    return set.world_size() > 0 && answered >= set.world_size();
  }

  // Analyzes the dumps in (`loaded`: already loaded by this poll); prints the report when it is
  // news. Returns whether it printed.
  bool Report(bool at_end, analysis::DumpSet* loaded = nullptr) {
    reported_files_ = files_;
    if (!print_) return false;
    analysis::DumpSet set = loaded ? std::move(*loaded) : Load();
    if (set.dumps().empty()) return false;
    analysis::Report report = analysis::Attribute(set);
    analysis::SymbolizeReport(&report);
    std::string key;
    for (const auto& v : report.verdicts) {
      key += analysis::CauseName(v.cause);
      for (int r : v.culprit_ranks) key += "," + std::to_string(r);
      key += ":" + std::to_string(v.seq) + ";";
    }
    if (key == last_key_) return false;  // the same story: no second copy
    if (!at_end && !report.Hang()) return false;  // while running, only hangs are news
    if (!at_end && StallsAllRecovered(set)) return false;  // over before it could be told: the end tells it
    last_key_ = key;
    printed_files_ = files_;
    analysis::ReportTextOptions options;
    options.style = analysis::Style(analysis::Style::ColorWanted(false));
    std::fflush(stdout);
    std::fprintf(stderr, "\nncclwatch: %s%zu dump(s) in %s:\n\n", at_end ? "" : "while the job runs, ", files_,
                 dir_.c_str());
    std::string text = analysis::RenderReportText(report, options);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return true;
  }

  // Every stall this run's dumps show has a later record of its completion (a loaded machine
  // can bring the recovery in before the episode's last dumps): no hang to tell while it runs.
  bool StallsAllRecovered(const analysis::DumpSet& set) const {
    int stalls = 0;
    for (const auto* list : {&set.dumps(), &set.history()})
      for (const auto& d : *list) {
        if (before_.count(d.file_name) || d.summary.reason != trace::DumpReasonName(trace::DumpReason::Stall)) continue;
        if (!set.StallOver(d)) return false;
        ++stalls;
      }
    return stalls > 0;
  }

  // One line on what was watched, so that a healthy run shows it was (and a job whose NCCL was
  // not intercepted says so).
  void Summary() const {
    if (!print_) return;
    analysis::DumpSet set = Load();
    std::set<std::string> processes;
    std::set<int64_t> versions;
    int64_t ops = 0;
    int stalls = 0, recovered = 0;
    for (const auto* list : {&set.dumps(), &set.history()})
      for (const auto& d : *list) {
        if (before_.count(d.file_name)) continue;
        processes.insert(d.ProcessKey());
        if (d.summary.nccl_version > 0) versions.insert(d.summary.nccl_version);
        stalls += d.summary.reason == trace::DumpReasonName(trace::DumpReason::Stall);
        recovered += set.StallRecovered(d);
      }
    for (const auto& d : set.dumps())
      if (!before_.count(d.file_name))
        for (const auto& c : d.summary.comms) ops += c.last_enqueued;
    if (processes.empty()) {
      std::fprintf(stderr,
                   "ncclwatch: no dump from this run in %s: no process used NCCL through ncclwatch, or "
                   "none had anything to report (NCCL linked statically? LD_PRELOAD cleared by the "
                   "launcher?)\n",
                   dir_.c_str());
      return;
    }
    std::string nccl;
    for (int64_t v : versions)
      nccl += (nccl.empty() ? "" : ", ") + trace::NcclVersionText(v);
    std::string stall_text = std::to_string(stalls) + " stall(s)";
    if (recovered > 0) stall_text += " (" + std::to_string(recovered) + " recovered)";
    std::fprintf(stderr, "ncclwatch: %zu process(es) watched (NCCL %s), %lld collectives issued, %s, "
                 "%zu dump(s) in %s\n",
                 processes.size(), nccl.empty() ? "?" : nccl.c_str(), static_cast<long long>(ops), stall_text.c_str(),
                 files_, dir_.c_str());
  }

  std::string dir_;
  bool print_;
  std::set<std::string> before_;
  size_t files_ = 0, reported_files_ = 0;  // dumps of this run in, and analyzed
  size_t printed_files_ = 0;                // dumps in when a report was last printed
  bool episode_started_ = false;
  std::chrono::steady_clock::time_point first_new_;
  std::string last_key_;
};

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
  if (!CheckSettings(settings)) return kExitBadInput;

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
  LiveWatch watch(dir, analyze && IsFirstTask());

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
  for (;;) {
    pid_t r = waitpid(child, &status, WNOHANG);
    if (r == child || (r < 0 && errno != EINTR)) break;
    watch.Poll();
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  g_child = -1;
  // Every rank of the job on this host may be gone, with no caretaker left to read their black
  // boxes: their postmortem dumps belong in the verdict.
  ConvertLeftBlackBoxes();
  watch.Finish();
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
