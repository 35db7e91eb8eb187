// What processes of this host that are gone left behind: their black boxes (a rank killed
// without a word: SIGKILL, the OOM killer) and partial dump files.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "model/dump.h"

namespace ncclwatch {
namespace cli {

// For commands that only read: the postmortem dumps, made in memory, of the black boxes that
// processes of this host gone without a word left for dump directory `dir` and that nobody
// converted (no caretaker was left: every rank of the job on the host killed at once). Nothing
// is written, locked or removed. *line: one line saying which boxes were read and how to turn
// them into dumps ("" when none).
std::vector<analysis::Dump> ReadLeftBlackBoxes(const std::string& dir, std::string* line);

// Converts the black boxes that processes gone without a word left on this host (when no
// process of theirs was left to do it) into postmortem dumps in their dump directories, and
// removes what dead processes left there. One line on stderr per conversion. The directories
// are NCCLWATCH_BLACKBOX_DIR and NCCLWATCH_RELAY_DIR, as the library reads them. `job_instance`
// (not ""): the lines of other jobs' processes are not printed (they are converted all the same).
// Returns how many boxes it converted or removed.
size_t ConvertLeftBlackBoxes(const std::string& job_instance = "");
// Removes the temporary files that dead processes of this host left in `dir` mid-dump (one line
// when there were any).
void RemoveLeftTemporaries(const std::string& dir);

}  // namespace cli
}  // namespace ncclwatch
