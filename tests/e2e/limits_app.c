/* What the library takes from the job: memory, descriptors and address space. Each scenario
 * must print and end the same with and without ncclwatch (tests/e2e/cases_resources.py).
 *   limits_app oom_exit       starts NCCL, runs operations, limits its address space (RLIMIT_AS)
 *                             to its size + 64 MiB, takes memory until malloc fails, lets the
 *                             watchdog tick for 6 s out of memory, and exits 12 (run with
 *                             jemalloc preloaded, and with glibc's malloc)
 *   limits_app oom_early      the same, its first operations only after memory ran out
 *   limits_app nofile N       RLIMIT_NOFILE N at start, starts NCCL, runs operations, then opens
 *                             files until EMFILE and says how many it opened, runs operations again
 *   limits_app nofile_free K  RLIMIT_NOFILE 16, starts NCCL, then holds every descriptor but K,
 *                             waits 4 s while the test asks a job-wide dump (K 1: opening and
 *                             closing a file all the while), and says how many opens failed
 *   limits_app as_tight       starts NCCL, limits its address space to its size + 16 MiB, runs
 *                             operations for 2 s, then takes 8 MiB; says how many failed
 *   limits_app vm             prints VmSize/VmPeak (KiB) before NCCL starts and after 3 s of
 *                             operations, on stderr (a measure, not compared)
 * Built a second time with LIMITS_COUNT_MALLOC (e2e_limits_count_app): malloc and its family are
 * interposed and counted per thread;
 *   limits_count_app mallocs [MS]  starts NCCL, runs operations for 2.5 s, then for MS ms more
 *                             (3000), and says how many allocations the thread named "ncclwatch"
 *                             made in those (stacks of the first few on stderr) */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#include "simutil.h"

#ifdef LIMITS_COUNT_MALLOC
#include <execinfo.h>
#include <malloc.h>
extern void* __libc_malloc(size_t);
extern void* __libc_calloc(size_t, size_t);
extern void* __libc_realloc(void*, size_t);
extern void* __libc_memalign(size_t, size_t);
extern void __libc_free(void*);

/* Visible to every library (the build hides symbols by default). */
#define EXPORTED __attribute__((visibility("default")))
#define SLOTS 256
static struct {
  volatile int tid;
  volatile unsigned long count;
} counts[SLOTS];
static __thread int my_slot = -1;
static __thread int in_hook;
static volatile int traced_tid;  /* its allocations' stacks are kept (the first few) */
#define TRACES 24
#define DEPTH 10
static void* traces[TRACES][DEPTH];
static int trace_depth[TRACES];
static volatile int traces_taken;

static void counted(void) {
  if (in_hook) return;
  if (my_slot < 0) {
    int tid = (int)syscall(SYS_gettid), i;
    for (i = 0; i < SLOTS; ++i)
      if (__sync_bool_compare_and_swap(&counts[i].tid, 0, tid) || counts[i].tid == tid) break;
    my_slot = i < SLOTS ? i : SLOTS - 1;
  }
  __sync_fetch_and_add(&counts[my_slot].count, 1);
  if (traced_tid && counts[my_slot].tid == traced_tid) {
    int n = __sync_fetch_and_add(&traces_taken, 1);
    if (n < TRACES) {
      in_hook = 1;
      trace_depth[n] = backtrace(traces[n], DEPTH);
      in_hook = 0;
    }
  }
}
EXPORTED void* malloc(size_t n) { counted(); return __libc_malloc(n); }
EXPORTED void* calloc(size_t a, size_t b) { counted(); return __libc_calloc(a, b); }
EXPORTED void* realloc(void* p, size_t n) { counted(); return __libc_realloc(p, n); }
EXPORTED void* memalign(size_t a, size_t n) { counted(); return __libc_memalign(a, n); }
EXPORTED void* aligned_alloc(size_t a, size_t n) { counted(); return __libc_memalign(a, n); }
EXPORTED int posix_memalign(void** out, size_t a, size_t n) {
  void* p;
  counted();
  p = __libc_memalign(a, n);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}
EXPORTED void free(void* p) { __libc_free(p); }

static unsigned long count_of(int tid) {
  int i;
  for (i = 0; i < SLOTS; ++i)
    if (counts[i].tid == tid) return counts[i].count;
  return 0;
}
#endif

/* The thread whose name is `name`, or 0. */
static __attribute__((unused)) int thread_named(const char* name) {
  char path[320], comm[64];
  int found = 0;
  DIR* d = opendir("/proc/self/task");
  struct dirent* e;
  while (d && (e = readdir(d)) != NULL) {
    FILE* f;
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
    f = fopen(path, "r");
    if (f && fgets(comm, sizeof comm, f) && strncmp(comm, name, strlen(name)) == 0 && comm[strlen(name)] == '\n')
      found = atoi(e->d_name);
    if (f) fclose(f);
  }
  if (d) closedir(d);
  return found;
}

static void start_nccl(ncclComm_t* comm) {
  ncclUniqueId id;
  simutil_cuda_init(0);
  simutil_exchange_id("world", 0, &id);
  NCCLCHECK(ncclCommInitRank(comm, 1, id, 0));
  printf("started\n");
  fflush(stdout);
}

static CUstream stream;
static CUdeviceptr buf;

static int run_ops(ncclComm_t comm, int count) {
  int i, failed = 0;
  if (!stream) {
    CUCHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    buf = simutil_alloc(1024 * sizeof(float));
  }
  for (i = 0; i < count; ++i)
    failed += ncclAllReduce((void*)buf, (void*)buf, 1024, ncclFloat32, ncclSum, comm, stream) != ncclSuccess;
  failed += cuStreamSynchronize(stream) != CUDA_SUCCESS;
  return failed;
}

/* Operations for `ms`, a few every 5 ms. */
static int run_for(ncclComm_t comm, long ms) {
  double until = simutil_now_ms() + ms;
  int failed = 0;
  while (simutil_now_ms() < until) {
    failed += run_ops(comm, 4);
    simutil_sleep_ms(5);
  }
  return failed;
}

static long status_kib(const char* field) {
  char line[256];
  long v = -1;
  FILE* f = fopen("/proc/self/status", "r");
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, field, strlen(field)) == 0) v = atol(line + strlen(field) + 1);
  if (f) fclose(f);
  return v;
}

static void limit_as(long extra_bytes) {
  struct rlimit lim;
  lim.rlim_cur = lim.rlim_max = (rlim_t)status_kib("VmSize:") * 1024 + extra_bytes;
  if (setrlimit(RLIMIT_AS, &lim) != 0) exit(1);
}

static void ready(void) {
  close(open(getenv("E2E_READY_FILE") ? getenv("E2E_READY_FILE") : "ready", O_CREAT | O_WRONLY | O_CLOEXEC, 0600));
}

int main(int argc, char** argv) {
  const char* scenario = argc > 1 ? argv[1] : "";
  ncclComm_t comm;
#ifdef LIMITS_COUNT_MALLOC
  if (strcmp(scenario, "mallocs") == 0) {
    void* prime[2];
    unsigned long before, after;
    int tid, i;
    const long window_ms = argc > 2 ? atol(argv[2]) : 3000;
    double start, now;
    backtrace(prime, 2);  /* loads the unwinder now, not inside malloc */
    start_nccl(&comm);
    /* One loop, one call site: a new call site's first sight is resolved (allocating) once. */
    tid = 0;
    before = 0;
    start = simutil_now_ms();
    while ((now = simutil_now_ms()) < start + 2500 + window_ms) {
      if (!traced_tid && now >= start + 2500) {
        tid = thread_named("ncclwatch");
        before = count_of(tid);
        traced_tid = tid ? tid : -1;
      }
      run_ops(comm, 4);
      simutil_sleep_ms(5);
    }
    after = count_of(tid);
    traced_tid = 0;
    if (tid)
      printf("the ncclwatch thread allocated %lu times in %ld ms of operations\n", after - before, window_ms);
    else
      printf("no ncclwatch thread\n");
    for (i = 0; i < traces_taken && i < TRACES; ++i) {
      fprintf(stderr, "allocation %d on the ncclwatch thread:\n", i);
      backtrace_symbols_fd(traces[i], trace_depth[i], 2);
    }
    NCCLCHECK(ncclCommDestroy(comm));
    return 0;
  }
#endif
  if (strcmp(scenario, "oom_exit") == 0 || strcmp(scenario, "oom_early") == 0) {
    size_t sizes[] = {1 << 20, 4096, 64};
    int i, early = strcmp(scenario, "oom_early") == 0;
    start_nccl(&comm);
    if (!early) run_ops(comm, 20);
    else CUCHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    limit_as(64 << 20);
    for (i = 0; i < 3; ++i)
      while (malloc(sizes[i]) != NULL) {
      }
    if (early) /* its first operations, out of memory: their results are the simulator's */
      printf("operations failed: %d\n", run_ops(comm, 4) > 0);
    simutil_sleep_ms(6000);  /* the watchdog ticks out of memory (a metrics file is due every 5 s) */
    printf("out of memory\n");
    fflush(stdout);
    exit(12);
  }
  if (strcmp(scenario, "nofile") == 0 && argc > 2) {
    struct rlimit lim;
    int opened = 0, fd, failed;
    lim.rlim_cur = (rlim_t)atoi(argv[2]);
    lim.rlim_max = lim.rlim_cur;
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) return 1;
    start_nccl(&comm);
    failed = run_for(comm, 500);
    while ((fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0) ++opened;
    printf("opened %d files, then %s\n", opened, strerror(errno));
    failed += run_for(comm, 300);
    printf("operations failed: %d\n", failed);
    fflush(stdout);
    return 0;
  }
  if (strcmp(scenario, "nofile_free") == 0 && argc > 2) {
    struct rlimit lim = {16, 16};
    int keep_free = atoi(argv[2]), held = 0, failed = 0, tries = 0, fd, mine[16];
    double until;
    if (setrlimit(RLIMIT_NOFILE, &lim) != 0) return 1;
    start_nccl(&comm);
    run_for(comm, 300);
    ready();
    while (held < 16 && (fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0) mine[held++] = fd;
    for (fd = 0; fd < keep_free && held > 0; ++fd) close(mine[--held]);
    until = simutil_now_ms() + 4000;
    while (simutil_now_ms() < until) {
      if (keep_free > 0) {  /* all the while the dump is asked and written */
        fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        ++tries;
        if (fd < 0) ++failed;
        else close(fd);
      } else {
        simutil_sleep_ms(10);
      }
    }
    printf("held all but %d; %d opens failed\n", keep_free, failed);
    fflush(stdout);
    return 0;
  }
  if (strcmp(scenario, "as_tight") == 0) {
    int failed, allocs = 0, i;
    limit_as((long)simutil_env_int("LIMITS_AS_MIB", 16) << 20);  /* before NCCL: what the library takes counts */
    start_nccl(&comm);
    failed = run_for(comm, 2000);
    for (i = 0; i < 8; ++i) allocs += malloc(1 << 20) != NULL;
    printf("operations failed: %d; 1 MiB allocations: %d of 8\n", failed, allocs);
    fflush(stdout);
    return 0;
  }
  if (strcmp(scenario, "vm") == 0) {
    long size0 = status_kib("VmSize:"), peak0 = status_kib("VmPeak:");
    start_nccl(&comm);
    run_for(comm, 3000);
    fprintf(stderr, "vm: VmSize %ld -> %ld KiB (+%ld), VmPeak %ld -> %ld KiB (+%ld)\n", size0, status_kib("VmSize:"),
            status_kib("VmSize:") - size0, peak0, status_kib("VmPeak:"), status_kib("VmPeak:") - peak0);
    return 0;
  }
  fprintf(stderr, "usage: limits_app oom_exit|nofile N|nofile_free K|as_tight|vm|mallocs\n");
  return SIMUTIL_EXIT_USAGE;
}
