// `ncclwatch dump DIR`: makes every rank of a running job dump now, through the job-wide dump
// request the stall path uses (format/request.h), shows how many ranks answered out of the
// world size, then analyzes. A snapshot of a healthy job reads `no_hang`.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "format/dump_reader.h"
#include "dump/dump_files.h"
#include "format/file_name.h"
#include "format/request.h"
#include "common/process_info.h"
#include "dump_dir.h"
#include "store_source.h"
#include "subcommand.h"

namespace ncclwatch {
namespace cli {

extern const Subcommand kAnalyzeCommand;

namespace {

// Every rank checks the request every NCCLWATCH_PEER_POLL_MS (1 s by default) and then writes
// its dump (stacks of every thread: up to a few seconds on a big process).
constexpr double kDefaultWaitS = 15;
constexpr auto kPollInterval = std::chrono::milliseconds(200);
// The store's published dumps are fetched this often while waiting (a few queries a host).
constexpr auto kStoreGatherInterval = std::chrono::seconds(1);

void DumpHelp(std::FILE* out) {
  std::fprintf(out,
               "usage: ncclwatch dump DIR [--wait SECONDS] [--json] [--no-color]\n"
               "                          [--store HOST:PORT [--store-job ID]]\n\n"
               "Makes every rank of the running job whose dump directory is DIR write a dump now\n"
               "(the job goes on), waits until every rank answered or SECONDS passed (default\n"
               "15), says how many answered out of the world size, then analyzes the directory.\n"
               "A healthy job reads `no_hang`. Ranks look for the request every\n"
               "NCCLWATCH_PEER_POLL_MS (1 s by default) and answers every new request with a\n"
               "new dump (at most NCCLWATCH_MAX_DUMPS per process: the first and the latest are\n"
               "kept). DIR is created when no rank has written there yet, and removed again\n"
               "when no rank answered.\n\n"
               "  --store HOST:PORT  hosts that do not share DIR (NCCLWATCH_STORE): the request\n"
               "               goes through the launcher's store too, and their answers are\n"
               "               fetched from it into DIR (--store-job ID: torchrun's --rdzv-id)\n\n"
               "exit status: that of `ncclwatch analyze`; 2 when no rank answered.\n");
}

int Run(int argc, char** argv) {
  double wait_s = kDefaultWaitS;
  std::vector<std::string> analyze_args = {"analyze"};
  auto pass_on = [&](const char* flag) {  // to the analysis
    return [&analyze_args, flag](const char*) {
      analyze_args.push_back(flag);
      return std::string();
    };
  };
  StoreSource store;
  ArgSpec spec = {"dump", DumpHelp,
                        {{"--wait", nullptr, "seconds", [&](const char* v) {
                            char* end = nullptr;
                            wait_s = std::strtod(v, &end);
                            if (!*v || !end || *end || !(wait_s > 0 && wait_s <= 3600))
                              return std::string("--wait takes seconds, more than 0 and at most 3600");
                            return std::string();
                          }},
                         {"--json", nullptr, nullptr, pass_on("--json")},
                         {"--no-color", nullptr, nullptr, pass_on("--no-color")}},
                        "directory"};
  for (Option& o : StoreOptions(&store)) spec.options.push_back(std::move(o));
  const ParsedArgs parsed = ParseArgs(spec, argc, argv);
  if (parsed.exit_status >= 0) return parsed.exit_status;
  const char* dir = parsed.operand.c_str();
  // The ranks poll DIR for the request whether or not any of them has written there yet (the
  // library creates it at its first dump): create it as the library would.
  struct stat st {};
  bool created = false;
  std::vector<std::string> made;  // the directories this creates, deepest first
  if (stat(dir, &st) != 0 && errno == ENOENT) {
    for (std::string p = dir; !p.empty() && p != "/" && p != "." && stat(p.c_str(), &st) != 0 && errno == ENOENT;) {
      made.push_back(p);
      size_t slash = p.find_last_of('/');
      p = slash == std::string::npos ? "" : p.substr(0, slash);
      while (p.size() > 1 && p.back() == '/') p.pop_back();
    }
    std::string why;
    if (!MakeDirs(dir, &why)) {
      std::fprintf(stderr, "ncclwatch dump: cannot create %s: %s; give the job's NCCLWATCH_DIR\n", dir, why.c_str());
      return kExitBadInput;
    }
    created = true;
  } else if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
    std::fprintf(stderr, "ncclwatch dump: %s: %s; give the job's NCCLWATCH_DIR, a directory\n", dir,
                 stat(dir, &st) != 0 ? strerror(errno) : "not a directory");
    return kExitBadInput;
  }

  std::set<std::string> before = DumpFiles(dir);
  const std::string host = HostName();
  auto now = std::chrono::system_clock::now().time_since_epoch();
  trace::DumpRequest req;
  req.time_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now).count();
  req.request = std::string("cli-") + host + "-" + std::to_string(getpid()) + "-" + std::to_string(req.time_unix_ns);
  req.origin_host = host;
  req.reason = trace::DumpReasonName(trace::DumpReason::OnDemand);
  std::string path = std::string(dir) + "/" + trace::kDumpRequestFile;
  if (int e = WriteFileReplacing(path, trace::WriteRequest(req))) {
    std::fprintf(stderr, "ncclwatch dump: cannot write the request %s: %s\n", path.c_str(), strerror(e));
    return kExitBadInput;
  }

  // The other hosts: the same request through the store (their links relay it to their ranks).
  std::vector<store::HostEvidence> hosts;
  if (store.given()) {
    store::Client c;
    std::string prefix, why;
    if (!OpenStore("dump", store, &c, &prefix) || !store::PublishRequest(&c, prefix, trace::WriteRequest(req), &why))
      std::fprintf(stderr, "ncclwatch dump: the request reaches only the ranks that read %s%s%s\n", dir,
                   why.empty() ? "" : ": ", why.c_str());
  }
  auto last_gather = std::chrono::steady_clock::now() - std::chrono::seconds(10);

  // Watch the answers: new dumps that answer this request (summary.answered).
  bool tty = isatty(STDERR_FILENO);
  std::set<int> answered;
  std::set<std::string> seen = before;
  int world = 0;
  auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  while (elapsed() < wait_s && (world == 0 || static_cast<int>(answered.size()) < world)) {
    std::this_thread::sleep_for(kPollInterval);
    if (store.given() && std::chrono::steady_clock::now() - last_gather >= kStoreGatherInterval) {
      last_gather = std::chrono::steady_clock::now();
      GatherFromStore("dump", store, dir, "", /*say=*/false, &hosts);
    }
    for (const auto& name : DumpFiles(dir)) {
      if (!seen.insert(name).second) continue;
      trace::LoadedDump d;
      if (!trace::ReadDumpFile(std::string(dir) + "/" + name, trace::ReadDepth::kSummary, &d).usable) {
        seen.erase(name);  // maybe still being renamed into place: look again
        continue;
      }
      if (!d.summary.answered || d.summary.answered->request != req.request) continue;
      answered.insert(d.summary.rank);
      world = std::max(world, d.summary.world_size);
    }
    if (tty) std::fprintf(stderr, "\rncclwatch dump: %zu/%d ranks answered", answered.size(), world);
  }
  if (tty) std::fprintf(stderr, "\r\033[K");
  if (answered.empty()) {
    if (created) {  // nobody there: leave no trace of a mistyped path, its parents included
      unlink(path.c_str());
      for (const auto& m : made) rmdir(m.c_str());
    }
    std::fprintf(stderr,
                 "ncclwatch dump: no rank answered within %.0f s: is a job running with ncclwatch and "
                 "NCCLWATCH_DIR=%s?\n",
                 wait_s, dir);
    return kExitBadInput;
  }
  if (store.given()) {  // the last answers, and which hosts' evidence the analysis holds
    GatherFromStore("dump", store, dir, "", /*say=*/false, &hosts);
    std::fprintf(stderr, "ncclwatch dump: evidence from the store at %s: %s\n", store.address.c_str(),
                 DescribeHosts(hosts).c_str());
  }
  std::string missing;
  for (int r = 0; r < world && missing.size() < 200; ++r)
    if (!answered.count(r)) missing += (missing.empty() ? "" : ",") + std::to_string(r);
  std::fprintf(stderr, "ncclwatch dump: %zu/%d ranks answered in %.1f s%s\n", answered.size(), world, elapsed(),
               missing.empty() ? "" : (" (not: " + missing + ")").c_str());
  std::vector<char*> args;
  analyze_args.push_back("--");  // a directory whose name starts with '-' is still one
  analyze_args.push_back(dir);
  for (auto& a : analyze_args) args.push_back(&a[0]);
  args.push_back(nullptr);
  std::fflush(stderr);
  return kAnalyzeCommand.run(static_cast<int>(args.size()) - 1, args.data());
}

}  // namespace

extern const Subcommand kDumpCommand = {"dump", "make every rank of a running job dump now, then analyze", &Run,
                                        &DumpHelp};

}  // namespace cli
}  // namespace ncclwatch
