/* How a process that used NCCL ends by itself, each way, with and without ncclwatch: each
 * scenario must print and end the same (tests/e2e cases_box_endings.py), and the black box must
 * say how it ended, never "SIGKILL or the OOM killer".
 *   ending_app quick_exit      starts NCCL, runs operations, registers an at_quick_exit handler
 *                              (it prints), calls quick_exit(7)
 *   ending_app raw_exit        starts NCCL, runs operations, ends with the exit_group system
 *                              call itself (status 5): no C library exit path at all
 *   ending_app exec            starts NCCL, runs operations, tries to exec a program that does
 *                              not exist (it goes on), then execs /bin/sh (no NCCL), which prints
 *                              and exits 3
 *   ending_app setresuid       starts NCCL, runs operations, gives up root for nobody (65534)
 *                              with setresuid, exits 4 (as root only: else says so and exits 4)
 *   ending_app chroot          starts NCCL, runs operations, chroots into an empty directory of
 *                              its own, exits 6 (as root only: else says so and exits 6)
 *   ending_app rmcwd           starts NCCL in a working directory of its own (E2E_WORK_DIR),
 *                              runs operations, removes that directory (as a job cleaning up its
 *                              scratch space does), runs one more, exits 0 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include "simutil.h"

static ncclComm_t start(void) {
  ncclComm_t comm;
  ncclUniqueId id;
  simutil_cuda_init(0);
  simutil_exchange_id("world", 0, &id);
  NCCLCHECK(ncclCommInitRank(&comm, 1, id, 0));
  printf("started\n");
  fflush(stdout);
  return comm;
}

static void run_ops(ncclComm_t comm, int count) {
  simutil_run_allreduces(comm, count);
  printf("ran %d operations\n", count);
  fflush(stdout);
}

static void on_quick_exit(void) {
  printf("at_quick_exit handler ran\n");
  fflush(stdout);
}

static int remove_tree(const char* path) {
  char cmd[4200];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  return system(cmd);
}

int main(int argc, char** argv) {
  const char* scenario = argc > 1 ? argv[1] : "";
  ncclComm_t comm;
  if (strcmp(scenario, "rmcwd") == 0) {
    const char* work = getenv("E2E_WORK_DIR");
    if (!work || mkdir(work, 0755) != 0 || chdir(work) != 0) return 2;
  }
  comm = start();
  run_ops(comm, 10);
  if (strcmp(scenario, "quick_exit") == 0) {
    at_quick_exit(on_quick_exit);
    quick_exit(7);
  }
  if (strcmp(scenario, "raw_exit") == 0) {
    for (;;) syscall(SYS_exit_group, 5);
  }
  if (strcmp(scenario, "exec") == 0) {
    execl("/nonexistent/program", "program", (char*)NULL);
    printf("exec of a missing program failed: %s\n", strerror(errno));
    fflush(stdout);
    execl("/bin/sh", "sh", "-c", "echo the new program runs; exit 3", (char*)NULL);
    return 1;
  }
  if (strcmp(scenario, "setresuid") == 0) {
    if (setresuid(65534, 65534, 65534) != 0) printf("setresuid: %s\n", strerror(errno));
    else printf("now nobody\n");
    fflush(stdout);
    exit(4);
  }
  if (strcmp(scenario, "chroot") == 0) {
    char root[] = "chroot-root-XXXXXX"; /* in its working directory */
    if (!mkdtemp(root) || chroot(root) != 0 || chdir("/") != 0) printf("chroot: %s\n", strerror(errno));
    else printf("in a chroot\n");
    fflush(stdout);
    exit(6);
  }
  if (strcmp(scenario, "rmcwd") == 0) {
    if (remove_tree(getenv("E2E_WORK_DIR")) != 0) return 2;
    printf("removed its working directory\n");
    fflush(stdout);
    run_ops(comm, 1);
    return 0;
  }
  return 0;
}
