#include "dump_dir.h"

#include <sys/stat.h>
#include <unistd.h>

#include <vector>

#include "format/display.h"
#include "format/file_name.h"
#include "render/render_report.h"
#include "subcommand.h"

namespace ncclwatch {
namespace cli {

namespace {

// Progress is worth a line only for big sets, and only where a person watches.
constexpr size_t kProgressMinFiles = 1000;

}  // namespace

std::set<std::string> DumpFiles(const std::string& dir) {
  std::vector<std::string> names;
  std::string error;
  trace::ListDumpFiles(dir, &names, &error);  // not there yet: none
  return {names.begin(), names.end()};
}

void SayProblems(const analysis::DumpSet& set) {
  for (const auto& p : set.problems()) std::fprintf(stderr, "%s\n", analysis::ProblemLine(p).c_str());
}

int ReadDumpDir(const char* sub, const std::string& dir, analysis::LoadOptions load, analysis::DumpSet* set,
                bool progress) {
  const std::string shown = trace::Printable(dir);
  // One line with the path given and what to do: the common mistakes are a dump file for the
  // directory and a directory that is not the job's.
  struct stat st {};
  if (stat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    std::fprintf(stderr,
                 "ncclwatch: %s: a file, not a directory of dumps: `ncclwatch %s DIR` takes the job's dump "
                 "directory; `ncclwatch show %s` prints this one dump\n",
                 shown.c_str(), sub, shown.c_str());
    return kExitBadInput;
  }
  progress = progress && ::isatty(STDERR_FILENO);
  if (progress)
    load.progress = [](size_t done, size_t total) {
      if (total > kProgressMinFiles) std::fprintf(stderr, "\rncclwatch: reading summaries %zu/%zu", done, total);
    };
  std::string error;
  const bool listed = set->Load(dir, load, &error);
  if (progress && set->files_seen() > kProgressMinFiles) std::fprintf(stderr, "\r\033[K");
  if (!listed) {
    std::fprintf(stderr,
                 "ncclwatch: %s; give the job's dump directory (NCCLWATCH_DIR, or the ncclwatch-<job id> "
                 "directory `ncclwatch run` names)\n",
                 trace::Printable(error).c_str());
    return kExitBadInput;
  }
  if (!set->dumps().empty()) return kExitOk;
  SayProblems(*set);
  std::fprintf(stderr, "ncclwatch: %s: no readable dump (%zu rank*.json files)\n", shown.c_str(), set->files_seen());
  return kExitBadInput;
}

}  // namespace cli
}  // namespace ncclwatch
