// What processes of this host that are gone left behind: their black boxes (a rank killed
// without a word: SIGKILL, the OOM killer) and partial dump files.
#pragma once

#include <string>

namespace ncclwatch {
namespace cli {

// Converts the black boxes that processes gone without a word left on this host (when no
// process of theirs was left to do it) into postmortem dumps in their dump directories, and
// removes what dead processes left there. One line on stderr per conversion. The directories
// are NCCLWATCH_BLACKBOX_DIR and NCCLWATCH_RELAY_DIR, as the library reads them. `job_instance`
// (not ""): the lines of other jobs' processes are not printed (they are converted all the same).
void ConvertLeftBlackBoxes(const std::string& job_instance = "");
// Removes the temporary files that dead processes of this host left in `dir` mid-dump (one line
// when there were any).
void RemoveLeftTemporaries(const std::string& dir);

}  // namespace cli
}  // namespace ncclwatch
