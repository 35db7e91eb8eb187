// Reading this process's memory under a seccomp filter that refuses process_vm_readv (kills,
// traps or fails it): found out before the first read, the call is never made in the process,
// and only readable memory is read. Each case runs in a forked child, where the filter stays.
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

#include <catch2/catch.hpp>

#include "native_unwind.h"
#include "stacks.h"
#include "testing.h"
#include "../support/refuse_process_vm_readv.h"

using namespace ncclwatch::stacks;

namespace {

int InstallFilter(unsigned int action) { return refuse_process_vm_readv(action, 0); }

// The child's exit status: 0 when every check held, else the number of the first that failed.
int InChild(const std::function<int()>& body) {
  std::fflush(nullptr);
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

const char kText[] = "readable bytes";

// Readable memory is read; a PROT_NONE page, a read running into one, and an unmapped address
// are not (and do not fault).
int ReadsOnlyWhatCanBeRead() {
  char out[sizeof kText] = {};
  if (!detail::ReadOwnMemory(reinterpret_cast<uintptr_t>(kText), out, sizeof kText)) return 21;
  if (std::memcmp(out, kText, sizeof kText) != 0) return 22;
  void* map = mmap(nullptr, 2 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) return 23;
  char* pages = static_cast<char*>(map);
  std::memcpy(pages + 4088, "8 bytes", 8);
  if (mprotect(pages + 4096, 4096, PROT_NONE) != 0) return 24;
  uint64_t word = 0;
  if (detail::ReadOwnMemory(reinterpret_cast<uintptr_t>(pages + 4096), &word, sizeof word)) return 25;
  if (detail::ReadOwnMemory(reinterpret_cast<uintptr_t>(pages + 4092), &word, sizeof word)) return 26;
  if (detail::ReadOwnMemory(8, &word, sizeof word)) return 27;
  if (!detail::ReadOwnMemory(reinterpret_cast<uintptr_t>(pages + 4088), &word, sizeof word)) return 28;
  if (std::memcmp(&word, "8 bytes", 8) != 0) return 29;
  return 0;
}

}  // namespace

TEST_CASE("memory reads: a seccomp filter that kills, traps or fails process_vm_readv is found first") {
  struct Mode {
    unsigned int action;
    const char* said;
  };
  for (const Mode& mode : {Mode{SECCOMP_RET_KILL_PROCESS, "it kills or traps the caller with SIGSYS"},
                           Mode{SECCOMP_RET_KILL_THREAD, "it kills or traps the caller with SIGSYS"},
                           Mode{SECCOMP_RET_TRAP, "it kills or traps the caller with SIGSYS"},
                           Mode{SECCOMP_RET_ERRNO | EPERM, "it fails with EPERM"}}) {
    INFO(mode.said);
    const int status = InChild([&] {
      if (InstallFilter(mode.action) != 0) return 10;
      detail::DecideReadPathForTesting();
      if (const int failed = ReadsOnlyWhatCanBeRead()) return failed;
      if (detail::OwnMemoryReadsAtomic()) return 31;  // running threads' Python frames: not walked
      const std::string problem = MemoryReadProblem();
      // Before Linux 5.16 (and in sanitizer builds) no child tries the call: a filter is taken
      // as refusing it.
      return problem.find("process_vm_readv is refused here") != std::string::npos &&
                     (problem.find(mode.said) != std::string::npos ||
                      problem.find("not tried here") != std::string::npos)
                 ? 0
                 : 30;
    });
    // Killed by SIGSYS: the process made the call itself.
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}

TEST_CASE("memory reads: without a filter, process_vm_readv and nothing said") {
  const int status = InChild([] {
    detail::DecideReadPathForTesting();
    if (const int failed = ReadsOnlyWhatCanBeRead()) return failed;
    if (!detail::OwnMemoryReadsAtomic()) return 31;
    return MemoryReadProblem().empty() ? 0 : 30;
  });
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("memory reads: a filter failing the call installed after the first read turns to checked reads") {
  const int status = InChild([] {
    detail::DecideReadPathForTesting();
    if (const int failed = ReadsOnlyWhatCanBeRead()) return failed;
    if (InstallFilter(SECCOMP_RET_ERRNO | EPERM) != 0) return 10;
    return ReadsOnlyWhatCanBeRead();
  });
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
