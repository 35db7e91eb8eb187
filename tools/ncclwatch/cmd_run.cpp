// `ncclwatch run [options] -- COMMAND ...`: starts a job with libncclwatch.so preloaded, returns
// the job's exit status unchanged, and analyzes the dumps if any were written.
#include <dirent.h>
#include <fcntl.h>
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
#include <memory>
#include <set>
#include <thread>

#include "rules/attribution.h"
#include "model/dump_set.h"
#include "render/render_report.h"
#include "debuginfo/symbolize_debug.h"
#include "common/config.h"
#include "common/process_info.h"
#include "dump/dump_files.h"
#include "format/request.h"
#include "format/display.h"
#include "format/file_name.h"
#include "dump_dir.h"
#include "store_source.h"
#include "left_boxes.h"
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
               "line on what was watched. The dump directory is created and written before\n"
               "COMMAND starts (refused in one line when it cannot be); the job is named\n"
               "(NCCLWATCH_RUN_ID), so that only its own dumps are answered, read and reported,\n"
               "whatever else shares the directory. The settings (those of the environment and\n"
               "the options) are checked once before COMMAND starts: a bad one is refused in one\n"
               "line.\n\n"
               "options:\n"
               "  --dir DIR          dump directory (default: ./ncclwatch-<SLURM_JOB_ID |\n"
               "                     TORCHELASTIC_RUN_ID | PMIX_NAMESPACE | start time>)\n"
               "  --timeout SPEC     NCCLWATCH_TIMEOUT: seconds, or AllGather=120,default=300\n"
               "  --set NAME=VALUE   any other setting, e.g. --set RING=8192 (NCCLWATCH_ prefix optional)\n"
               "  --lib PATH         libncclwatch.so to preload (default: next to this program)\n"
               "  --no-analyze       do not analyze the dumps afterwards\n"
               "  --store HOST:PORT  hosts that do not share the dump directory (Kubernetes):\n"
               "                     the ranks carry the job-wide request and their dumps\n"
               "                     through the launcher's store (NCCLWATCH_STORE=on), and this\n"
               "                     command fetches the other hosts' dumps into its directory\n"
               "                     for the verdict (e.g. the c10d --rdzv-endpoint)\n"
               "  --store-job ID     the job in the store: torchrun's --rdzv-id (default none);\n"
               "                     it names the run, the same on every host\n\n"
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
  const std::string exe = ExecutablePath();
  std::string bindir = !exe.empty() ? Dirname(exe) : ".";
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

// The library's default directory for the job's id (the one rule, common/process_info.h); a job
// with no launcher id is one run's, named by its start (the library is told it in NCCLWATCH_DIR).
std::string DefaultDir() {
  char stamp[32];
  time_t now = time(nullptr);
  strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", localtime(&now));
  return DefaultDumpDir(LauncherJobId(), std::string(stamp) + "-" + std::to_string(getpid()));
}

// Whether the job's dumps can go to `dir`: made (with its parents) and written before the job
// starts, so that a job is never watched in a place its ranks cannot write to. *created: `dir`
// did not exist before.
bool CheckDir(const std::string& dir, bool* created) {
  struct stat st;
  *created = stat(dir.c_str(), &st) != 0;
  std::string why;
  if (MakeDirs(dir, &why)) {
    const std::string probe = dir + "/.ncclwatch-run-check-" + std::to_string(getpid());
    int fd = open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    bool wrote = fd >= 0 && write(fd, "x", 1) == 1;
    int e = errno;
    if (fd >= 0) close(fd);
    unlink(probe.c_str());
    if (wrote) return true;
    why = strerror(e ? e : EIO);
  }
  std::fprintf(stderr, "ncclwatch run: cannot write the dump directory '%s': %s; nothing started (--dir DIR)\n",
               trace::PrintableCut(dir).c_str(), why.c_str());
  return false;
}

// One line when `dir` already holds files of another job that is still running on this host
// (a dump of a live process, or a dump request of the last minute): they share a directory.
void WarnOtherLiveJob(const std::string& dir) {
  std::vector<std::string> names;
  std::string error;
  if (!trace::ListDumpFiles(dir, &names, &error)) return;
  const std::string own_host = trace::SafeHostName(HostName());
  std::set<long> live;
  for (const auto& n : names) {  // rank<R>-<host>-<pid>-<seq>-<reason>.json
    size_t h = n.find('-');
    if (h == std::string::npos || n.compare(h + 1, own_host.size(), own_host) != 0 ||
        n.size() <= h + 1 + own_host.size() || n[h + 1 + own_host.size()] != '-')
      continue;
    long pid = strtol(n.c_str() + h + 2 + own_host.size(), nullptr, 10);
    if (pid > 0 && (kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM)) live.insert(pid);
  }
  std::string request;
  struct stat st;
  const std::string req = dir + "/" + trace::kDumpRequestFile;
  if (stat(req.c_str(), &st) == 0 && time(nullptr) - st.st_mtime < 60) request = "a dump request written " +
      std::to_string(time(nullptr) - st.st_mtime) + " s ago";
  if (live.empty() && request.empty()) return;
  std::string what = live.empty() ? request
                                  : std::to_string(live.size()) + " running process(es) (pid " +
                                        std::to_string(*live.begin()) + (live.size() > 1 ? ", ..." : "") + ")" +
                                        (request.empty() ? "" : " and " + request);
  std::fprintf(stderr,
               "ncclwatch run: warning: %s holds files of another job that is still running (%s); this job "
               "answers, reads and reports only its own, but give each job its own --dir\n",
               trace::PrintableCut(dir).c_str(), what.c_str());
}

// Where a rank that cannot write the dump directory writes instead (lib/dump/dump_files.cpp:
// ./ncclwatch-<job id>, then /tmp/ncclwatch-<job id>-<uid>), as seen from here.
std::vector<std::string> FallbackDirs() {
  std::vector<std::string> out;
  const std::string tmp_suffix = "-" + std::to_string(getuid());
  for (const char* parent_dir : {".", "/tmp"}) {
    const std::string parent = parent_dir;
    DIR* d = opendir(parent.c_str());
    if (!d) continue;
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind("ncclwatch-", 0) != 0) continue;
      if (parent == "/tmp" && (n.size() <= tmp_suffix.size() ||
                               n.compare(n.size() - tmp_suffix.size(), tmp_suffix.size(), tmp_suffix) != 0))
        continue;
      out.push_back(parent + "/" + n);
    }
    closedir(d);
  }
  return out;
}

// The job instance its ranks will carry: `ncclwatch run` names the job it starts
// (NCCLWATCH_RUN_ID, before the launcher's instance), unless it is itself one task of a job
// (`srun ncclwatch run -- python ...`: a run per task, each with another pid), where the
// launcher's instance, the same for every task, is the job's (or none is known). *run_id: ""
// in that case.
std::string JobInstanceOfRun(std::string* run_id, const std::string& fixed_id = "") {
  bool task = false;
  for (const char* v : {"SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "RANK"})
    task = task || (getenv(v) && *getenv(v));
  const char* explicit_instance = getenv("NCCLWATCH_JOB_INSTANCE");
  std::string launcher = explicit_instance && *explicit_instance ? explicit_instance : ReadProcessIdentity().job_instance;
  if (task) {  // one id per task would split the job: the launcher's ("" unknown: every dump is read)
    run_id->clear();
    return launcher;
  }
  if (!fixed_id.empty()) {  // named by the store's job: the same on every host
    *run_id = fixed_id;
    return fixed_id;
  }
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  char id[320];
  snprintf(id, sizeof id, "run-%s-%d-%lld.%09ld", trace::SafeHostName(HostName()).c_str(), static_cast<int>(getpid()),
           static_cast<long long>(now.tv_sec), now.tv_nsec);
  *run_id = id;
  return id;
}

// The settings the job gets, checked by the library's own parser before anything starts (every
// rank would print the same error otherwise, and use a default): the environment's NCCLWATCH_
// variables with those given by --timeout and --set over them.
const std::map<std::string, std::string>* g_settings = nullptr;
const char* SettingLookup(const char* name) {
  auto it = g_settings->find(name);
  return it == g_settings->end() ? nullptr : it->second.c_str();
}

// The variable a ParseConfig error line is about: its first word, past "unknown variable ".
std::string VariableOfError(const std::string& e) {
  size_t start = e.rfind("unknown variable ", 0) == 0 ? 17 : 0;
  size_t end = e.find_first_of("=' ,(", start);
  return e.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

bool CheckSettings(const std::vector<std::pair<std::string, std::string>>& given) {
  std::map<std::string, std::string> settings;
  std::set<std::string> from_environment;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = strchr(*e, '=');
    if (!eq || strncmp(*e, "NCCLWATCH_", 10) != 0) continue;
    std::string name(*e, static_cast<size_t>(eq - *e));
    settings[name] = eq + 1;
    from_environment.insert(name);
  }
  for (const auto& kv : given) {
    settings[kv.first] = kv.second;
    from_environment.erase(kv.first);
  }
  // The names as an environment: the library's own check of unknown variables (with its
  // "did you mean") speaks for them, as it would in every rank.
  std::vector<std::string> entries;
  for (const auto& kv : settings) entries.push_back(kv.first + "=" + kv.second);
  std::vector<const char*> envp;
  for (const auto& e : entries) envp.push_back(e.c_str());
  envp.push_back(nullptr);
  bool ok = true;
  g_settings = &settings;
  for (std::string e : ParseConfig(&SettingLookup, envp.data()).errors) {
    e = e.substr(0, e.find("; using"));  // the library would fall back; run refuses instead
    const bool inherited = from_environment.count(VariableOfError(e)) > 0;
    if (e.rfind("unknown variable ", 0) == 0) e = "unknown setting " + e.substr(17);
    std::fprintf(stderr, "ncclwatch run: %s%s\n", e.c_str(), inherited ? " (in the environment)" : "");
    ok = false;
  }
  g_settings = nullptr;
  return ok;
}

// The dumps of this run, watched while it runs: a hang's verdict as soon as its episode's dumps
// are in (every rank of the world answered, or a few seconds passed since the first). Only this
// job's dumps (its job instance) count: another job sharing the directory is not this one.
class LiveWatch {
 public:
  LiveWatch(std::string dir, bool print, std::string instance)
      : dir_(std::move(dir)), print_(print), instance_(std::move(instance)), before_(DumpFiles(dir_)) {}

  // The other hosts' dumps, published in the launcher's store, are fetched into the directory.
  void UseStore(StoreSource s, std::string own_host) {
    store_ = std::move(s);
    own_host_ = std::move(own_host);
  }

  void Poll() {
    GatherFromStore();
    std::set<std::string> now = DumpFiles(dir_);
    size_t fresh = 0;
    for (const auto& n : now) fresh += !before_.count(n);
    if (fresh == 0) FollowFallback();
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

  // At the end: the analysis, unless one printed while the job ran already tells it (the same
  // verdicts). One that differs is printed as the corrected report. An analysis made while
  // running that was not news (no hang: a healthy job stopped by SIGTERM, say) is printed now.
  void Finish() {
    Poll();
    const bool news = files_ > 0 && Report(true);
    if (!news && printed_files_ > 0 && print_) {
      std::fprintf(stderr, "ncclwatch: no change since the report above\n");
      // The same story, told to its end: the waiting ranks' framework ended them afterwards.
      for (const auto& line : ended_after_) std::fprintf(stderr, "ncclwatch: then %s\n", line.c_str());
    }
    Summary();
  }

  size_t files() const { return files_; }
  const std::string& dir() const { return dir_; }  // where the job's dumps are (a fallback once followed)

 private:
  static constexpr auto kEpisodeSettle = std::chrono::seconds(5);
  // The store is looked at this often: one CHECK (was a request made?), then, once one was, the
  // host list and each host's list of dumps; each dump is fetched once.
  static constexpr auto kStoreLook = std::chrono::seconds(2);

  void GatherFromStore() {
    if (!store_.given()) return;
    auto now = std::chrono::steady_clock::now();
    if (now - last_store_look_ < kStoreLook) return;
    last_store_look_ = now;
    if (!client_.connected() || prefix_.empty()) {
      if (store_failed_) return;  // said once; the local evidence is what there is
      if (!OpenStore("run", store_, &client_, &prefix_, /*quiet=*/true)) {
        if (store_linked_ && print_) {
          std::fprintf(stderr, "ncclwatch: the store at %s is gone (%s); the report holds what was fetched before and this host's dumps\n",
                       store_.address.c_str(), client_.error().empty() ? "nothing of this job there" : client_.error().c_str());
          store_failed_ = true;
        }
        return;
      }
      store_linked_ = true;
    }
    bool asked = false;
    if (!client_.Check(prefix_ + "req_seq", &asked, 5000) || !asked) return;
    std::vector<store::HostEvidence> hosts;
    std::string why;
    store::FetchEvidence(&client_, prefix_, dir_, own_host_, &hosts, &why);
    for (auto& h : hosts) store_hosts_[h.host] = h.files.size();
  }

  // Which hosts' evidence the report holds (under --store).
  void SayHosts() const {
    if (!store_.given() || !print_) return;
    std::string text = "host " + own_host_ + " (this one)";
    for (const auto& [host, n] : store_hosts_)
      if (host != own_host_) text += ", host " + host + " (" + std::to_string(n) + " dump(s) from the store)";
    std::fprintf(stderr, "ncclwatch: evidence of %s\n", text.c_str());
  }
  static constexpr auto kFallbackLook = std::chrono::seconds(2);
  mutable std::unique_ptr<analysis::SummaryCache> cache_ = std::make_unique<analysis::SummaryCache>();

  // Each load reads only the dumps that came in since the last (the summaries read are kept).
  analysis::DumpSet Load(const std::string& dir = "") const {
    analysis::DumpSet set;
    analysis::LoadOptions options;
    options.cache = dir.empty() ? cache_.get() : nullptr;
    options.job_instance = instance_;
    std::string error;
    set.Load(dir.empty() ? dir_ : dir, options, &error);
    return set;
  }

  // Ranks that could not write the directory fall back (one line each says where): with no
  // dump of this job here yet, the fallback directories are looked at now and then, and the
  // watch moves to the one that holds this job's dumps.
  void FollowFallback() {
    if (followed_ || instance_.empty()) return;
    auto now = std::chrono::steady_clock::now();
    if (now - last_fallback_look_ < kFallbackLook) return;
    last_fallback_look_ = now;
    struct stat here, there;
    for (const auto& d : FallbackDirs()) {
      // Only a directory written to since this run started (a new dump changes its mtime): old
      // ones of earlier jobs are not read again every few seconds.
      if (stat(d.c_str(), &there) != 0 || there.st_mtime < started_) continue;
      if (stat(dir_.c_str(), &here) == 0 && here.st_ino == there.st_ino && here.st_dev == there.st_dev) continue;
      analysis::DumpSet set = Load(d);
      if (set.dumps().empty()) continue;
      if (print_)
        std::fprintf(stderr, "ncclwatch: this job's ranks write their dumps to %s (they could not write %s); "
                     "watching it there\n", trace::PrintableCut(d).c_str(), trace::PrintableCut(dir_).c_str());
      dir_ = d;
      before_.clear();  // another job's files there are told apart by their job instance
      cache_ = std::make_unique<analysis::SummaryCache>();
      followed_ = true;
      return;
    }
  }

  // Every rank has a dump of this run taken during the hang (at or after the moment the first
  // stalled operation got stuck): a rank's dump from before it (a snapshot asked earlier with
  // `ncclwatch dump`) describes it as it was then, not what it does while the others wait.
  bool AllRanksIn(const analysis::DumpSet& set) const {
    int64_t hang_began = 0;
    for (const auto* list : {&set.dumps(), &set.history()})
      for (const auto& d : *list) {
        const trace::Summary& s = d.summary;
        if (before_.count(d.file_name) || !s.reason.Is(trace::DumpReason::Stall) || !s.stalled)
          continue;
        const int64_t stuck = s.time_unix_ns - static_cast<int64_t>(std::max(0.0, s.stalled->age_s) * 1e9);
        if (hang_began == 0 || stuck < hang_began) hang_began = stuck;
      }
    int answered = 0;
    for (const auto& d : set.dumps()) answered += !before_.count(d.file_name) && d.summary.time_unix_ns >= hang_began;
    return set.world_size() > 0 && answered >= set.world_size();
  }

  // Analyzes the dumps in (`loaded`: already loaded by this poll); prints the report when it is
  // news. Returns whether it printed.
  bool Report(bool at_end, analysis::DumpSet* loaded = nullptr) {
    reported_files_ = files_;
    ended_after_.clear();
    if (!print_) return false;
    analysis::DumpSet set = loaded ? std::move(*loaded) : Load();
    if (set.dumps().empty()) return false;
    analysis::Report report = analysis::Attribute(set);
    analysis::SymbolizeReport(&report);
    // The story: each verdict's cause, culprits, operation and waiting ranks. Another story
    // than the one printed (a later round of dumps, a culprit's fresher dump) is printed again.
    std::string key;
    for (const auto& v : report.verdicts) {
      key += analysis::CauseName(v.cause);
      for (int r : v.culprit_ranks) key += "," + std::to_string(r);
      key += ":" + v.comm + ":" + v.op + ":" + std::to_string(v.seq) + ":";
      for (int r : v.waiting_ranks) key += std::to_string(r) + ",";
      key += ";";
    }
    if (key == last_key_) {  // the same story: no second copy
      for (const auto& v : report.verdicts)
        for (const auto& line : analysis::FrameworkEndingLines(v)) ended_after_.push_back(trace::Printable(line));
      return false;
    }
    if (!at_end && !report.Hang()) return false;  // while running, only hangs are news
    if (!at_end && StallsAllRecovered(set)) return false;  // over before it could be told: the end tells it
    // The analysis takes a while on a loaded machine: a recovery that came in meanwhile ends the
    // story before it is printed (looked at again, from the dumps read since).
    if (!at_end && StallsAllRecovered(Load())) return false;
    const bool corrects = !last_key_.empty() && printed_files_ > 0;
    last_key_ = key;
    printed_files_ = files_;
    // How many ranks dumped, in one line: the ranks' own lines about their dumps are for
    // NCCLWATCH_LOG=info (thousands of them at scale would bury the verdict).
    size_t ours = set.dumps().size() + set.history().size();
    const std::string of_world = set.world_size() > 0 ? " of " + std::to_string(set.world_size()) : "";
    analysis::ReportTextOptions options;
    options.style = analysis::Style(analysis::Style::ColorWanted(false));
    std::fflush(stdout);
    std::fprintf(stderr, "\nncclwatch: %s%zu%s ranks dumped (%zu dump(s) of this job in %s)%s:\n\n",
                 at_end ? "" : "while the job runs, ", set.dumps().size(), of_world.c_str(), ours, dir_.c_str(),
                 corrects ? " (the analysis changed: this report replaces the one above)" : "");
    SayHosts();
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
        if (before_.count(d.file_name) || !d.summary.reason.Is(trace::DumpReason::Stall)) continue;
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
    size_t ours = 0;
    for (const auto* list : {&set.dumps(), &set.history()})
      for (const auto& d : *list) {
        if (before_.count(d.file_name)) continue;
        ++ours;
        processes.insert(d.ProcessKey());
        if (d.summary.nccl_version > 0) versions.insert(d.summary.nccl_version);
        stalls += d.summary.reason.Is(trace::DumpReason::Stall);
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
                 ours, dir_.c_str());
  }

  std::string dir_;
  bool print_;
  std::string instance_;  // this job's ("" every dump)
  std::set<std::string> before_;
  size_t files_ = 0, reported_files_ = 0;  // dumps of this run in, and analyzed
  size_t printed_files_ = 0;                // dumps in when a report was last printed
  bool episode_started_ = false;
  bool followed_ = false;
  const time_t started_ = time(nullptr) - 1;
  std::chrono::steady_clock::time_point first_new_;
  std::chrono::steady_clock::time_point last_fallback_look_;
  std::string last_key_;
  std::vector<std::string> ended_after_;  // the same story's end: FrameworkEndingLines
  StoreSource store_;
  std::string own_host_;
  store::Client client_;
  std::string prefix_;
  bool store_linked_ = false, store_failed_ = false;
  std::chrono::steady_clock::time_point last_store_look_;
  std::map<std::string, size_t> store_hosts_;  // host -> its dumps fetched or already here
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
  auto into = [](std::string* target) {
    return [target](const char* v) {
      *target = v;
      return std::string();
    };
  };
  StoreSource store;
  ArgSpec spec = {
      "run", RunHelp,
      {{"--dir", nullptr, "a directory", into(&dir)},
       {"--lib", nullptr, "a path", into(&lib)},
       {"--timeout", nullptr, "a value", [&](const char* v) {
          settings.emplace_back("NCCLWATCH_TIMEOUT", v);
          return std::string();
        }},
       {"--set", nullptr, "NAME=VALUE", [&](const char* v) {
          const char* eq = strchr(v, '=');
          if (!eq || eq == v) return std::string("--set takes NAME=VALUE");
          std::string name(v, eq - v);
          for (auto& c : name) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
          if (name.rfind("NCCLWATCH_", 0) != 0) name = "NCCLWATCH_" + name;
          settings.emplace_back(name, eq + 1);
          return std::string();
        }},
       {"--no-analyze", nullptr, nullptr, SetTo(&analyze, false)}},
      nullptr, false, "; the command goes after --"};
  for (Option& o : StoreOptions(&store)) spec.options.push_back(std::move(o));
  const ParsedArgs parsed = ParseArgs(spec, argc, argv);
  if (parsed.exit_status >= 0) return parsed.exit_status;
  const int i = parsed.command;
  if (!CheckSettings(settings)) return kExitBadInput;

  std::string looked;
  if (lib.empty()) lib = FindLibrary(&looked);
  if (lib.empty() || !IsFile(lib)) {
    std::fprintf(stderr, "ncclwatch run: cannot find libncclwatch.so (looked in %s); pass --lib PATH\n",
                 lib.empty() ? looked.c_str() : lib.c_str());
    return kExitBadInput;
  }
  if (dir.empty()) dir = getenv("NCCLWATCH_DIR") && *getenv("NCCLWATCH_DIR") ? getenv("NCCLWATCH_DIR") : DefaultDir();
  bool created = false;
  if (!CheckDir(dir, &created)) return kExitBadInput;
  const bool print = analyze && IsFirstTask();
  if (print && !created) WarnOtherLiveJob(dir);

  const char* old = getenv("LD_PRELOAD");
  std::string preload = lib + (old && *old ? std::string(":") + old : std::string());
  setenv("LD_PRELOAD", preload.c_str(), 1);
  setenv("NCCLWATCH_DIR", dir.c_str(), 1);
  for (auto& kv : settings) setenv(kv.first.c_str(), kv.second.c_str(), 1);
  if (store.given()) {  // the ranks' side: through the store, to this address (unless told otherwise)
    setenv("NCCLWATCH_STORE_ADDR", store.address.c_str(), 0);
    setenv("NCCLWATCH_STORE", "on", 0);
  }
  std::string run_id;
  const std::string instance = JobInstanceOfRun(&run_id, store.given() ? "store-" + store.Job() : "");
  if (!run_id.empty()) setenv("NCCLWATCH_RUN_ID", run_id.c_str(), 1);
  else unsetenv("NCCLWATCH_RUN_ID");
  LiveWatch watch(dir, print, instance);
  if (store.given()) watch.UseStore(store, trace::SafeHostName(HostName()));

  // The child says through this pipe (closed by a successful exec) that COMMAND could not start.
  int exec_pipe[2];
  if (pipe2(exec_pipe, O_CLOEXEC) != 0) exec_pipe[0] = exec_pipe[1] = -1;

  pid_t child = fork();
  if (child < 0) {
    std::fprintf(stderr, "ncclwatch run: fork failed: %s\n", strerror(errno));
    return kExitBadInput;
  }
  if (child == 0) {
    execvp(argv[i], argv + i);
    int e = errno;
    std::fprintf(stderr, "ncclwatch run: cannot run '%s': %s\n", trace::Printable(argv[i]).c_str(), strerror(e));
    if (exec_pipe[1] >= 0 && write(exec_pipe[1], &e, sizeof e) < 0) {
    }
    _exit(127);
  }
  bool exec_failed = false;
  if (exec_pipe[1] >= 0) {
    close(exec_pipe[1]);
    int e = 0;
    ssize_t n;
    while ((n = read(exec_pipe[0], &e, sizeof e)) < 0 && errno == EINTR) {
    }
    exec_failed = n == static_cast<ssize_t>(sizeof e);
    close(exec_pipe[0]);
  }
  if (exec_failed) {  // said by the child in one line: nothing ran, nothing to watch
    waitpid(child, nullptr, 0);
    if (created) rmdir(dir.c_str());
    return 127;
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
  // boxes: their postmortem dumps belong in the verdict. What its dead left mid-dump goes.
  ConvertLeftBlackBoxes(instance);
  RemoveLeftTemporaries(watch.dir());
  watch.Finish();
  if (created) rmdir(dir.c_str());  // made for this job and left empty: gone again (fails otherwise)
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
