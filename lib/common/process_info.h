// Who this process is in the job, from the launcher's environment (torchrun, Slurm, Open MPI,
// PMI), read once at start-up.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ncclwatch {

struct ProcessIdentity {
  int env_rank = -1;        // RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID, PMI_RANK
  int local_rank = -1;      // LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID
  int env_world_size = -1;  // WORLD_SIZE, OMPI_COMM_WORLD_SIZE, SLURM_NTASKS, PMI_SIZE
  std::string host;
  int pid = 0;
  std::string job_id;  // SLURM_JOB_ID, TORCHELASTIC_RUN_ID, PMIX_NAMESPACE, OMPI_MCA_orte_ess_jobid
  // This attempt of the job, as the launcher names it ("" unknown): torchelastic:<run>:<restart>,
  // slurm:<job>.<step>:<restart>, pmix:<namespace>, ompi:<jobid>.
  std::string job_instance;
  // Random, drawn at start: unique in the job even where host and pid are not (containers with
  // their own PID namespaces).
  std::string process_uid;
  uint64_t start_unix_ns = 0;
};

ProcessIdentity ReadProcessIdentity();

// The job's id as the launcher gives it: SLURM_JOB_ID, TORCHELASTIC_RUN_ID, PMIX_NAMESPACE or
// OMPI_MCA_orte_ess_jobid, the first set ("" none).
std::string LauncherJobId();
// This host's name in dumps, file names and requests: NCCLWATCH_HOST, else the system's ("unknown"
// when it has none). The library and the command both ask here.
std::string HostName();

// Default dump directory of a job, the one rule for the library and the command (which predicts
// where the library writes): ncclwatch-<job id>, letters, digits, '-', '_' and '.' kept, any
// other character '_'; ncclwatch-<unnamed> when the launcher gives no id.
std::string DefaultDumpDir(const std::string& job_id, const std::string& unnamed = "job");
std::string DefaultDumpDir(const ProcessIdentity& id);

// The environment variables docs/trace-format.md lists (NCCL_*, TORCH_NCCL_*, launcher ids,
// ...) and no other; a secret-looking value is redacted.
std::vector<std::pair<std::string, std::string>> RelevantEnvironment();

// The running program's path (/proc/self/exe; "" unreadable). Inline, the one copy: the stack
// code, which links none of the core, names the main program with it too.
inline std::string ExecutablePath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}
// argv (secret-looking values redacted: RedactCommandLine), working directory.
std::vector<std::string> CommandLine();
std::string WorkingDirectory();

// The node-local directory ncclwatch keeps its shared-memory files in, for a configured `dir`
// (NCCLWATCH_BLACKBOX_DIR, NCCLWATCH_RELAY_DIR): one that other users can write to (/dev/shm,
// /tmp) is not used directly, but its subdirectory ncclwatch-<uid>, created 0700 and checked
// (a directory, not a link, this user's, closed to others), so that no other user can create,
// replace or foresee a file in it. A directory that only its owner can write to is used as it
// is, and so is one that does not exist (its user says why it cannot use it). Empty (with *why)
// when the subdirectory cannot be used: another user's, a link, open to others. `create` false:
// nothing is created (a reader that must leave the host as it found it); a missing subdirectory
// is returned as it is.
std::string UserPrivateDir(const std::string& dir, std::string* why, bool create = true);

}  // namespace ncclwatch
