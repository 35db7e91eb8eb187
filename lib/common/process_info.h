// Who this process is in the job, from the launcher's environment (torchrun, Slurm, Open MPI,
// PMI), read once at start-up.
#pragma once

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

// Default dump directory: ./ncclwatch-<job id> ("job" when the launcher gives none).
std::string DefaultDumpDir(const ProcessIdentity& id);

// The environment variables docs/trace-format.md lists (NCCL_*, TORCH_NCCL_*, launcher ids,
// ...) and no other; a secret-looking value is redacted.
std::vector<std::pair<std::string, std::string>> RelevantEnvironment();

// Executable path, argv (secret-looking values redacted: RedactCommandLine), working directory.
std::string ExecutablePath();
std::vector<std::string> CommandLine();
std::string WorkingDirectory();

// The node-local directory ncclwatch keeps its shared-memory files in, for a configured `dir`
// (NCCLWATCH_BLACKBOX_DIR, NCCLWATCH_RELAY_DIR): one that other users can write to (/dev/shm,
// /tmp) is not used directly, but its subdirectory ncclwatch-<uid>, created 0700 and checked
// (a directory, not a link, this user's, closed to others), so that no other user can create,
// replace or foresee a file in it. A directory that only its owner can write to is used as it
// is, and so is one that does not exist (its user says why it cannot use it). Empty (with *why)
// when the subdirectory cannot be used: another user's, a link, open to others.
std::string UserPrivateDir(const std::string& dir, std::string* why);

}  // namespace ncclwatch
