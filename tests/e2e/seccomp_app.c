/* An application under a seccomp filter that refuses process_vm_readv (systemd's
 * SystemCallFilter=, sandboxes, container profiles), with and without ncclwatch: each scenario
 * must print and end the same (tests/e2e cases_seccomp.py). The filter is installed first
 * thing (every thread inherits it); then NCCL starts, operations run, and while the test asks a
 * job-wide dump the main thread spins in generated code (no unwind information, as JIT code has)
 * whose frame pointer points into a PROT_NONE page, and a thread that called NCCL sleeps.
 *   seccomp_app kill_process  the filter kills the process (SECCOMP_RET_KILL_PROCESS)
 *   seccomp_app kill_thread   the filter kills the calling thread (SECCOMP_RET_KILL_THREAD)
 *   seccomp_app trap          the filter raises SIGSYS (SECCOMP_RET_TRAP); the application's own
 *                             SIGSYS handler makes the call fail with EPERM and counts its runs
 *   seccomp_app eperm         the filter fails the call with EPERM (Docker's default profile
 *                             without CAP_SYS_PTRACE)
 *   seccomp_app trap_after_start  as trap, but the filter is installed once NCCL has started,
 *                             on every thread at once (SECCOMP_FILTER_FLAG_TSYNC): a call of the
 *                             library's own threads then raises SIGSYS there, and the
 *                             application's handler must run (the count goes to stderr); both
 *                             threads wait in system calls, read by the library's dumping thread
 *   seccomp_app none          no filter (the same program's baseline)
 * Each prints what it did and, last, how many times its SIGSYS handler ran. */
#define _GNU_SOURCE /* REG_RAX */
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <ucontext.h>

#include "../support/refuse_process_vm_readv.h"
#include "simutil.h"

static volatile sig_atomic_t g_sigsys_runs = 0;
static volatile long g_sigsys_tid = 0; /* the thread of its last run */
static volatile int g_stop = 0;

static void on_sigsys(int sig, siginfo_t* info, void* uctx) {
  (void)sig;
  (void)info;
  ++g_sigsys_runs;
  g_sigsys_tid = syscall(SYS_gettid);
#if defined(__x86_64__)
  ((ucontext_t*)uctx)->uc_mcontext.gregs[REG_RAX] = -EPERM; /* the call "fails" with EPERM */
#else
  (void)uctx;
#endif
}

static int install_filter(unsigned int action, unsigned int flags) { return refuse_process_vm_readv(action, flags); }

/* Generated code, as a JIT writes it: no unwind information; it sets the frame pointer to
 * `frame` (inside a PROT_NONE page) and spins until *stop is non-zero.
 *   push rbp; mov rbp, rdi; 1: pause; cmp dword [rsi], 0; je 1b; pop rbp; ret */
typedef void (*spin_fn)(void* frame, volatile int* stop);

static spin_fn make_spin(void) {
#if defined(__x86_64__)
  static const unsigned char code[] = {0x55, 0x48, 0x89, 0xfd, 0xf3, 0x90, 0x83, 0x3e, 0x00, 0x74, 0xf9, 0x5d, 0xc3};
  void* page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return NULL;
  memcpy(page, code, sizeof code);
  if (mprotect(page, 4096, PROT_READ | PROT_EXEC) != 0) return NULL;
  return (spin_fn)page;
#else
  return NULL;
#endif
}

struct worker {
  ncclComm_t comm;
  CUstream stream;
  CUdeviceptr buf;
};

static volatile int g_worker_called = 0, g_go_on = 0;

/* A thread that calls NCCL, then (once the main thread lets it: trap_after_start installs its
 * filter in between) sleeps while the dump is taken, then lets the main thread go. */
static void* worker_main(void* arg) {
  struct worker* w = (struct worker*)arg;
  NCCLCHECK(ncclAllReduce((void*)w->buf, (void*)w->buf, 1024, ncclFloat32, ncclSum, w->comm, w->stream));
  CUCHECK(cuStreamSynchronize(w->stream));
  __atomic_store_n(&g_worker_called, 1, __ATOMIC_RELEASE);
  while (!__atomic_load_n(&g_go_on, __ATOMIC_ACQUIRE)) simutil_sleep_ms(1);
  simutil_sleep_ms(4000);
  __atomic_store_n(&g_stop, 1, __ATOMIC_RELEASE);
  return NULL;
}

int main(int argc, char** argv) {
  const char* scenario = argc > 1 ? argv[1] : "";
  unsigned int action;
  ncclUniqueId id;
  struct worker w;
  pthread_t thread;
  spin_fn spin;
  void* guard;
  int i, late = 0;
  if (strcmp(scenario, "kill_process") == 0) action = SECCOMP_RET_KILL_PROCESS;
  else if (strcmp(scenario, "kill_thread") == 0) action = SECCOMP_RET_KILL_THREAD;
  else if (strcmp(scenario, "trap") == 0) action = SECCOMP_RET_TRAP;
  else if (strcmp(scenario, "trap_after_start") == 0) action = SECCOMP_RET_TRAP, late = 1;
  else if (strcmp(scenario, "eperm") == 0) action = SECCOMP_RET_ERRNO | EPERM;
  else if (strcmp(scenario, "none") == 0) action = SECCOMP_RET_ALLOW;
  else {
    fprintf(stderr, "usage: seccomp_app kill_process|kill_thread|trap|trap_after_start|eperm|none\n");
    return SIMUTIL_EXIT_USAGE;
  }
  spin = make_spin();
  if (!spin) {
    printf("%s: not on x86_64, nothing to do\n", scenario);
    return 0;
  }
  if (action == SECCOMP_RET_TRAP) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigsys;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSYS, &sa, NULL);
  }
  if (!late && action != SECCOMP_RET_ALLOW && install_filter(action, 0) != 0) {
    printf("%s: cannot install the filter: %s\n", scenario, strerror(errno));
    return 0;
  }
  printf("%s: %s\n", scenario, late ? "no filter yet" : "filter installed");
  fflush(stdout);

  simutil_cuda_init(0);
  simutil_exchange_id("world", 0, &id);
  NCCLCHECK(ncclCommInitRank(&w.comm, 1, id, 0));
  CUCHECK(cuStreamCreate(&w.stream, CU_STREAM_NON_BLOCKING));
  w.buf = simutil_alloc(1024 * sizeof(float));
  for (i = 0; i < 10; ++i)
    NCCLCHECK(ncclAllReduce((void*)w.buf, (void*)w.buf, 1024, ncclFloat32, ncclSum, w.comm, w.stream));
  CUCHECK(cuStreamSynchronize(w.stream));
  printf("%s: 10 operations\n", scenario);
  fflush(stdout);

  guard = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (guard == MAP_FAILED || pthread_create(&thread, NULL, worker_main, &w) != 0) return 1;
  while (!__atomic_load_n(&g_worker_called, __ATOMIC_ACQUIRE)) simutil_sleep_ms(1);
  if (late && install_filter(action, SECCOMP_FILTER_FLAG_TSYNC) != 0) {
    printf("%s: cannot install the filter on every thread: %s\n", scenario, strerror(errno));
    return 0;
  }
  __atomic_store_n(&g_go_on, 1, __ATOMIC_RELEASE);
  /* the test asks a job-wide dump now */
  close(open(getenv("E2E_READY_FILE") ? getenv("E2E_READY_FILE") : "ready", O_CREAT | O_WRONLY, 0600));
  if (late) { /* waits in a system call: its stack is read by the dumping thread, the library's */
    pthread_join(thread, NULL);
    printf("%s: waited for the worker\n", scenario);
  } else {
    spin((char*)guard + 64, &g_stop);
    pthread_join(thread, NULL);
    printf("%s: spun under a frame pointer into a PROT_NONE page\n", scenario);
  }

  for (i = 0; i < 10; ++i)
    NCCLCHECK(ncclAllReduce((void*)w.buf, (void*)w.buf, 1024, ncclFloat32, ncclSum, w.comm, w.stream));
  CUCHECK(cuStreamSynchronize(w.stream));
  NCCLCHECK(ncclCommDestroy(w.comm));
  if (late) {
    printf("%s: 20 operations\n", scenario);
    char path[64], name[32] = "";
    FILE* f;
    snprintf(path, sizeof path, "/proc/self/task/%ld/comm", (long)g_sigsys_tid);
    f = fopen(path, "r");
    if (f && !fgets(name, sizeof name, f)) name[0] = '\0';
    if (f) fclose(f);
    fprintf(stderr, "%s: SIGSYS handler ran %d times, last on thread %s", scenario, (int)g_sigsys_runs,
            name[0] ? name : "(gone)\n");
  }
  else
    printf("%s: 20 operations, SIGSYS handler ran %d times\n", scenario, (int)g_sigsys_runs);
  return 0;
}
