/* An application's own file descriptors, mappings and memory, with and without ncclwatch: each
 * scenario must print and end the same (tests/e2e run_e2e.py, resources_as_without_ncclwatch).
 *   resource_app never_nccl      no NCCL call: lists its descriptors >= 3 and whether libunwind
 *                                or liblzma is mapped
 *   resource_app unique_id_only  ncclGetVersion and ncclGetUniqueId only: the same list
 *   resource_app closed_fds      closes every descriptor >= 3 at start (as daemons do), opens
 *                                two files of its own, starts NCCL, waits while the test asks a
 *                                job-wide dump, then checks that its files are untouched
 *   resource_app closed_after_init  starts NCCL and runs a few operations (every descriptor the
 *                                library keeps is open by then), closes every descriptor >= 3 and
 *                                opens eight files of its own (which take the freed numbers), then
 *                                runs a burst of operations, one slow enough to be a stall, waits
 *                                while the test asks a job-wide dump, and checks its files are
 *                                exactly as written, before its exit and after the library's
 *   resource_app reexec          starts NCCL, runs 5 operations, then re-executes itself (an
 *                                in-place restart: the same pid, a new program): the new program
 *                                starts NCCL again, runs 10 operations (the 8th is slow when the
 *                                test makes it so: a hang of the new program), waits 3 s, ends
 *   resource_app oom_exit        after NCCL starts, limits its address space (RLIMIT_AS), takes
 *                                memory until malloc fails and exits 12
 *   resource_app stderr_reused   closes descriptor 2 (as daemons do) and opens a file of its own,
 *                                which takes it, writes 10 bytes, starts NCCL (the test sets an
 *                                unknown NCCLWATCH_ variable: a line at the first call), waits while
 *                                the test asks a job-wide dump, then checks its file
 *   resource_app stderr_dead_pipe  re-executes itself with descriptor 2 a pipe nobody reads (its
 *                                read end closed), as a log collector that died leaves it: the new
 *                                program starts NCCL (a line at its first call on its own thread,
 *                                the unknown variable's) and runs operations, then says it lived */
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/resource.h>

#include "simutil.h"

static void list_resources(const char* when) {
  char path[64], target[256], line[512];
  int maps_unwind = 0, maps_lzma = 0;
  DIR* d = opendir("/proc/self/fd");
  struct dirent* e;
  int self = d ? dirfd(d) : -1;
  FILE* maps;
  printf("%s: descriptors >= 3:", when);
  while (d && (e = readdir(d)) != NULL) {
    int fd = atoi(e->d_name);
    ssize_t n;
    if (e->d_name[0] == '.' || fd < 3 || fd == self) continue;
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    n = readlink(path, target, sizeof target - 1);
    target[n > 0 ? n : 0] = '\0';
    printf(" %d=%s", fd, strchr(target, ':') ? "(pipe/anon)" : target);
  }
  if (d) closedir(d);
  maps = fopen("/proc/self/maps", "r");
  while (maps && fgets(line, sizeof line, maps)) {
    maps_unwind |= strstr(line, "libunwind") != NULL;
    maps_lzma |= strstr(line, "liblzma") != NULL;
  }
  if (maps) fclose(maps);
  printf("\n%s: libunwind mapped %d, liblzma mapped %d\n", when, maps_unwind, maps_lzma);
  fflush(stdout);
}

static int own_file(const char* name) {
  int fd = open(name, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || write(fd, "0123456789", 10) != 10) exit(1);
  return fd;
}

/* Its contents, read from its start with the descriptor the application kept. */
static void check_file(int fd, const char* name) {
  char buf[64];
  ssize_t n = pread(fd, buf, sizeof buf, 0);
  off_t at = lseek(fd, 0, SEEK_CUR);
  printf("%s: %zd bytes, %s, offset %lld\n", name, n, n == 10 && memcmp(buf, "0123456789", 10) == 0 ? "as written" : "changed",
         (long long)at);
}

/* closed_after_init's files, checked again after the library's exit handler (registered
 * before NCCL starts: atexit handlers run in reverse order). */
#define OWN_FILES 8
static int own_fds[OWN_FILES];

static void check_own_files(const char* when) {
  char name[32];
  int i;
  printf("%s:\n", when);
  for (i = 0; i < OWN_FILES; ++i) {
    snprintf(name, sizeof name, "own%d.txt", i);
    check_file(own_fds[i], name);
  }
  fflush(stdout);
}

static void check_own_files_at_exit(void) { check_own_files("after exit"); }

static int start_nccl_as(ncclComm_t* comm, const char* name) {
  ncclUniqueId id;
  simutil_cuda_init(0);
  simutil_exchange_id(name, 0, &id);
  NCCLCHECK(ncclCommInitRank(comm, 1, id, 0));
  printf("started\n");
  fflush(stdout);
  return 0;
}

static int start_nccl(ncclComm_t* comm) { return start_nccl_as(comm, "world"); }

static void run_ops(ncclComm_t comm, int count) { simutil_run_allreduces(comm, count); }

int main(int argc, char** argv) {
  const char* scenario = argc > 1 ? argv[1] : "";
  ncclComm_t comm;
  if (strcmp(scenario, "never_nccl") == 0) {
    list_resources("never_nccl");
    return 0;
  }
  if (strcmp(scenario, "unique_id_only") == 0) {
    ncclUniqueId id;
    int version = 0;
    NCCLCHECK(ncclGetVersion(&version));
    NCCLCHECK(ncclGetUniqueId(&id));
    list_resources("unique_id_only");
    return 0;
  }
  if (strcmp(scenario, "closed_fds") == 0) {
    int a, b, fd;
    list_resources("at start");
    for (fd = 3; fd < 1024; ++fd) close(fd);
    a = own_file("a.txt");
    b = own_file("b.txt");
    start_nccl(&comm);
    close(open(getenv("E2E_READY_FILE") ? getenv("E2E_READY_FILE") : "ready", O_CREAT | O_WRONLY, 0600)); /* the test asks a job-wide dump now */
    sleep(4);
    check_file(a, "a.txt");
    check_file(b, "b.txt");
    NCCLCHECK(ncclCommDestroy(comm));
    return 0;
  }
  if (strcmp(scenario, "closed_after_init") == 0) {
    /* Operations run on a stream, then one whose kernel is slow (NCCLWATCH_SIM_FAULT, set by
     * the test): a stall past NCCLWATCH_TIMEOUT, then its recovery. */
    char name[32];
    int fd, i;
    atexit(check_own_files_at_exit);
    start_nccl(&comm);
    run_ops(comm, 10);
    simutil_sleep_ms(1500); /* past the first job-wide request poll: every descriptor of ours is open */
    for (fd = 3; fd < 1024; ++fd) close(fd);
    for (i = 0; i < OWN_FILES; ++i) {
      snprintf(name, sizeof name, "own%d.txt", i);
      own_fds[i] = own_file(name);
    }
    run_ops(comm, 3000); /* a burst the watchdog's pace has not caught up with: woken from here */
    run_ops(comm, 1);    /* seq 3011: slow */
    close(open(getenv("E2E_READY_FILE") ? getenv("E2E_READY_FILE") : "ready", O_CREAT | O_WRONLY, 0600));
    sleep(4);
    check_own_files("before exit");
    NCCLCHECK(ncclCommDestroy(comm));
    return 0;
  }
  if (strcmp(scenario, "reexec") == 0) {
    start_nccl(&comm);
    run_ops(comm, 5);
    simutil_sleep_ms(1500); /* its black box, relay and caretaker in place */
    printf("re-executing\n");
    fflush(stdout);
    execl("/proc/self/exe", argv[0], "reexeced", (char*)NULL);
    perror("execl");
    return 1;
  }
  if (strcmp(scenario, "reexeced") == 0) {
    start_nccl_as(&comm, "world2");
    run_ops(comm, 10);
    simutil_sleep_ms(3000); /* a few job-wide request polls: the host's caretaker looks at the boxes */
    printf("the new program ends\n");
    NCCLCHECK(ncclCommDestroy(comm));
    return 0;
  }
  if (strcmp(scenario, "oom_exit") == 0) {
    long pages = 0;
    FILE* statm = fopen("/proc/self/statm", "r");
    struct rlimit lim;
    size_t sizes[] = {1 << 20, 4096, 64};
    int i;
    start_nccl(&comm);
    if (!statm || fscanf(statm, "%ld", &pages) != 1) return 1;
    fclose(statm);
    lim.rlim_cur = lim.rlim_max = (rlim_t)pages * 4096 + (64 << 20);
    if (setrlimit(RLIMIT_AS, &lim) != 0) return 1;
    for (i = 0; i < 3; ++i)
      while (malloc(sizes[i]) != NULL) {
      }
    printf("out of memory\n");
    fflush(stdout);
    exit(12);
  }
  if (strcmp(scenario, "stderr_reused") == 0) {
    int data;
    close(STDERR_FILENO);
    data = own_file("data.txt");
    if (data != STDERR_FILENO) return 1;
    start_nccl(&comm);
    run_ops(comm, 5);
    close(open(getenv("E2E_READY_FILE") ? getenv("E2E_READY_FILE") : "ready", O_CREAT | O_WRONLY, 0600));
    sleep(4);
    NCCLCHECK(ncclCommDestroy(comm));
    check_file(data, "data.txt (descriptor 2)");
    return 0;
  }
  if (strcmp(scenario, "stderr_dead_pipe") == 0) {
    int p[2];
    if (pipe(p) != 0) return 1;
    close(p[0]);
    dup2(p[1], STDERR_FILENO);
    close(p[1]);
    fflush(stdout);
    execl("/proc/self/exe", argv[0], "stderr_dead_pipe_child", (char*)NULL);
    return 1;
  }
  if (strcmp(scenario, "stderr_dead_pipe_child") == 0) {
    start_nccl(&comm);
    run_ops(comm, 20);
    NCCLCHECK(ncclCommDestroy(comm));
    printf("stderr_dead_pipe: ran 20 operations and lived\n");
    return 0;
  }
  fprintf(stderr, "usage: resource_app never_nccl|unique_id_only|closed_fds|closed_after_init|reexec|oom_exit|"
                  "stderr_reused|stderr_dead_pipe\n");
  return SIMUTIL_EXIT_USAGE;
}
