#include "left_boxes.h"

#include <cstdio>
#include <cstdlib>

#include "blackbox/postmortem.h"
#include "common/config.h"
#include "common/process_info.h"
#include "dump/dump_files.h"
#include "model/dump_set.h"

namespace ncclwatch {
namespace cli {

namespace {

// The node-local directory the library uses for setting `name` (NCCLWATCH_BLACKBOX_DIR,
// NCCLWATCH_RELAY_DIR): this user's own directory in it; "none" when not used.
std::string NodeLocalDir(const char* name) {
  const char* v = std::getenv(name);
  const std::string dir(v && *v ? v : kNodeLocalDir);
  std::string why;
  const std::string mine = dir == "none" ? dir : UserPrivateDir(dir, &why);
  return mine.empty() ? std::string("none") : mine;
}

}  // namespace

void RemoveLeftTemporaries(const std::string& dir) {
  if (int n = RemoveStaleTemporaries(dir, HostName()))
    std::fprintf(stderr, "ncclwatch: removed %d partial dump file(s) in %s that dead processes of this host left\n", n,
                 dir.c_str());
}

void ConvertLeftBlackBoxes(const std::string& job_instance) {
  for (const auto& c :
       blackbox::ConvertDeadBoxes(NodeLocalDir("NCCLWATCH_BLACKBOX_DIR"), NodeLocalDir("NCCLWATCH_RELAY_DIR")).converted) {
    if (job_instance.empty() || analysis::OfJobInstance(c.job_instance, job_instance))
      std::fprintf(stderr, "ncclwatch: %s\n", c.line.c_str());
  }
}

}  // namespace cli
}  // namespace ncclwatch
