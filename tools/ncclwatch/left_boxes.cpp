#include "left_boxes.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "blackbox/postmortem.h"
#include "common/config.h"
#include "common/process_info.h"
#include "dump/dump_files.h"
#include "dump_dir.h"
#include "format/display.h"
#include "format/dump_reader.h"
#include "format/file_name.h"
#include "model/dump_set.h"

namespace ncclwatch {
namespace cli {

namespace {

// The node-local directory the library uses for setting `name` (NCCLWATCH_BLACKBOX_DIR,
// NCCLWATCH_RELAY_DIR): this user's own directory in it; "none" when not used. `create`: as the
// library does (false: a reader creates nothing).
std::string NodeLocalDir(const char* name, bool create = true) {
  const char* v = std::getenv(name);
  const std::string dir(v && *v ? v : kNodeLocalDir);
  std::string why;
  const std::string mine = dir == "none" ? dir : UserPrivateDir(dir, &why, create);
  return mine.empty() ? std::string("none") : mine;
}

bool SameFile(const std::string& a, const struct stat& b) {
  struct stat st;
  return !a.empty() && stat(a.c_str(), &st) == 0 && st.st_dev == b.st_dev && st.st_ino == b.st_ino;
}

// `p` absolute and without "." or ".." parts or a trailing '/', for a directory that is not there.
std::string Lexical(const std::string& p) {
  if (p.empty()) return p;
  std::filesystem::path path(p[0] == '/' ? p : WorkingDirectory() + "/" + p);
  std::string s = path.lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

}  // namespace

std::vector<analysis::Dump> ReadLeftBlackBoxes(const std::string& dir, std::string* line) {
  std::vector<analysis::Dump> out;
  line->clear();
  // The directory may never have been made: every rank killed before its first dump.
  struct stat here;
  const bool exists = stat(dir.c_str(), &here) == 0;
  const std::string box_dir = NodeLocalDir("NCCLWATCH_BLACKBOX_DIR", /*create=*/false);
  std::set<std::string> files;
  std::string who;
  bool deaths = false;  // else every one exited without its record (out of memory, ...)
  // Only the boxes of the job whose directory this is: the others (every job that died on this
  // host) are not read.
  const auto of_this_job = [&](const blackbox::LeftBox& left) {
    return exists ? SameFile(left.dump_dir, here) : Lexical(left.dump_dir) == Lexical(dir);
  };
  for (auto& left : blackbox::ReadDeadBoxes(box_dir, of_this_job)) {
    if (left.dump.empty()) continue;  // it dumped at its end
    analysis::Dump d;
    if (!trace::ReadDumpBuffer(left.dump, trace::ReadDepth::kFull, &d).usable) continue;
    // A caretaker converting it right now: its dump is in the directory already.
    if (files.empty()) files = DumpFiles(dir);
    const std::string stem = trace::DumpFileStem(d.summary.rank, d.summary.host, d.summary.pid, d.summary.dump_seq,
                                                 d.summary.reason.Name());
    auto at = files.lower_bound(stem);
    if (at != files.end() && at->compare(0, stem.size(), stem) == 0) continue;
    d.file_name = left.box;  // where this evidence lies: no file in the directory
    deaths = deaths || !d.summary.reason.Is(trace::DumpReason::Exit);
    who += (who.empty() ? "" : ", ") + ("rank " + std::to_string(left.rank) + " (pid " + std::to_string(left.pid) + ")");
    out.push_back(std::move(d));
  }
  if (!out.empty())
    *line = "ncclwatch: " + std::to_string(out.size()) +
            (deaths ? " process(es) of this job ended without a word" : " process(es) of this job exited without their exit record") +
            " and nobody turned their black boxes into dumps: "
            "read in memory from " + trace::PrintableCut(box_dir) + " (" + trace::PrintableCut(who, 200) +
            "); `ncclwatch collect` on this host writes them as " + (deaths ? "postmortem dumps" : "exit records");
  return out;
}

void RemoveLeftTemporaries(const std::string& dir) {
  if (int n = RemoveStaleTemporaries(dir, HostName()))
    std::fprintf(stderr, "ncclwatch: removed %d partial dump file(s) in %s that dead processes of this host left\n", n,
                 dir.c_str());
}

size_t ConvertLeftBlackBoxes(const std::string& job_instance) {
  const auto converted =
      blackbox::ConvertDeadBoxes(NodeLocalDir("NCCLWATCH_BLACKBOX_DIR"), NodeLocalDir("NCCLWATCH_RELAY_DIR")).converted;
  for (const auto& c : converted)
    if (job_instance.empty() || analysis::OfJobInstance(c.job_instance, job_instance))
      std::fprintf(stderr, "ncclwatch: %s\n", c.line.c_str());
  return converted.size();
}

}  // namespace cli
}  // namespace ncclwatch
