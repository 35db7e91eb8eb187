/* An application's waits and its own fault handling, with and without ncclwatch (tests/e2e
 * cases_signal_waits.py): each scenario prints the same thing either way.
 *   wait_app eintr_loop [N]  the main thread and N threads that called NCCL (1 by default)
 *                            each run 50 us of work then a 50 us nanosleep, over and over,
 *                            while the test asks for job-wide dumps; until the file "stop"
 *                            appears (60 s at most): prints how many nanosleeps returned EINTR
 *   wait_app sleep4          the main thread sleeps 4 s while the test sends SIGUSR2 or asks
 *                            for a job-wide dump: prints what sleep(4) left and after how long
 *   wait_app guard_retry     a SIGSEGV handler (set before NCCL) that unprotects a guard page:
 *                            5 writes to the page, each protected again before: each faults
 *                            once and goes on; prints whether each took 100 ms or more. Rank 1 (of 2) then SIGKILLs itself; rank 0 lives on
 *                            3 s (its exit converts the dead rank's black box)
 *   wait_app guard_give_up   the same handler fixes 3 faults, then gives up: it sets SIGSEGV's
 *                            default action and returns, and the fault ends the process
 *   wait_app guard_raise     the same, but on giving up it raises SIGSEGV itself (delivered as
 *                            its handler returns) */
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "simutil.h"

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void ready(void) {
  close(open(getenv("E2E_READY_FILE") ? getenv("E2E_READY_FILE") : "ready", O_CREAT | O_WRONLY, 0600));
}

/* ---- eintr_loop ---- */
static volatile int g_stop;

static double g_work_s = 50e-6;

static __attribute__((noinline)) long work_sleep_loop(void) {
  const struct timespec nap = {0, 50 * 1000};
  long eintr = 0, rounds = 0;
  double until = now_s() + 60;
  while (!g_stop) {
    double end = now_s() + g_work_s;
    while (now_s() < end) {
    }
    if (nanosleep(&nap, NULL) != 0 && errno == EINTR) ++eintr;
    if (++rounds % 1000 == 0 && (access("stop", F_OK) == 0 || now_s() > until)) g_stop = 1;
  }
  return eintr;
}

static void* loop_thread(void* arg) {
  simutil_cuda_init(0);
  NCCLCHECK(ncclGroupStart()); /* an NCCL call: a thread whose stack dumps sample */
  NCCLCHECK(ncclGroupEnd());
  *(long*)arg = work_sleep_loop();
  return NULL;
}

/* ---- guard pages ---- */
static char* g_page;
static long g_page_size;
static volatile int g_faults;
static int g_give_up_after; /* 0: never */
static int g_raise;

static void on_segv(int sig, siginfo_t* info, void* uctx) {
  (void)uctx;
  if ((char*)info->si_addr < g_page || (char*)info->si_addr >= g_page + g_page_size) {
    signal(sig, SIG_DFL); /* not ours: the default action */
    return;
  }
  ++g_faults;
  if (g_give_up_after && g_faults > g_give_up_after) {
    signal(sig, SIG_DFL);
    if (g_raise) raise(sig); /* blocked in the handler: delivered as it returns */
    return;                  /* the write faults again, with the default action */
  }
  mprotect(g_page, (size_t)g_page_size, PROT_READ | PROT_WRITE);
}

static void set_guard_handler(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_segv;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, NULL);
  g_page_size = sysconf(_SC_PAGESIZE);
  g_page = mmap(NULL, (size_t)g_page_size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
}

/* `times` writes to the guard page, protected again before each: each faults once (and goes
 * on, while the handler fixes the page). Each says whether its fault took 100 ms or more. */
static void touch_guard_page(int times) {
  int i;
  for (i = 0; i < times; ++i) {
    double start, took;
    mprotect(g_page, (size_t)g_page_size, PROT_NONE);
    start = now_s();
    ((volatile char*)g_page)[i] = 1;
    took = now_s() - start;
    printf("write %d: %d fault(s) so far, this one %s 100 ms\n", i + 1, g_faults, took < 0.1 ? "under" : "at least");
    fprintf(stderr, "wait_app: write %d took %.2f ms\n", i + 1, took * 1e3);
    fflush(stdout);
  }
  printf("%d faults handled\n", g_faults);
  fflush(stdout);
}

int main(int argc, char** argv) {
  const char* scenario = argc > 1 ? argv[1] : "";
  const int rank = simutil_env_int("RANK", 0), world = simutil_env_int("WORLD_SIZE", 1);
  ncclUniqueId id;
  ncclComm_t comm;
  int guard = strncmp(scenario, "guard_", 6) == 0;
  if (strcmp(scenario, "eintr_loop") != 0 && strcmp(scenario, "sleep4") != 0 && !guard) {
    fprintf(stderr, "usage: wait_app eintr_loop|sleep4|guard_retry|guard_give_up|guard_raise\n");
    return SIMUTIL_EXIT_USAGE;
  }
  if (guard) set_guard_handler(); /* before NCCL: ncclwatch finds it when it starts */
  simutil_cuda_init(0);
  simutil_exchange_id("world", rank, &id);
  NCCLCHECK(ncclCommInitRank(&comm, world, id, rank)); /* ncclwatch starts here */
  if (rank == world - 1) printf("started\n"); /* one rank speaks: the output has one order */
  fflush(stdout);

  if (strcmp(scenario, "eintr_loop") == 0) {
    enum { kMaxThreads = 16 };
    pthread_t t[kMaxThreads];
    long main_eintr, thread_eintr[kMaxThreads], total = 0;
    int n = argc > 2 ? atoi(argv[2]) : 1, i;
    if (n < 1 || n > kMaxThreads) n = 1;
    if (argc > 3) g_work_s = atof(argv[3]) * 1e-6;
    for (i = 0; i < n; ++i) pthread_create(&t[i], NULL, loop_thread, &thread_eintr[i]);
    ready(); /* the test asks for its dumps now, then makes "stop" */
    main_eintr = work_sleep_loop();
    for (i = 0; i < n; ++i) {
      pthread_join(t[i], NULL);
      total += thread_eintr[i];
    }
    printf("nanosleep returned EINTR %ld time(s) on the main thread, %ld on the %d NCCL thread(s)\n", main_eintr,
           total, n);
  } else if (strcmp(scenario, "sleep4") == 0) {
    double start;
    unsigned left;
    ready(); /* the test sends SIGUSR2, or asks for a job-wide dump, about 1 s from now */
    start = now_s();
    left = sleep(4);
    printf("sleep(4) left %u after %.0f s\n", left, now_s() - start);
    fflush(stdout);
    simutil_sleep_ms(1500); /* a dump asked for when the sleep was cut is written meanwhile */
  } else if (strcmp(scenario, "guard_retry") == 0) {
    if (rank == world - 1) {
      touch_guard_page(5);
      if (world > 1) kill(getpid(), SIGKILL); /* its black box tells, converted by rank 0 */
    } else {
      sleep(3);
    }
  } else {
    g_give_up_after = 3;
    g_raise = strcmp(scenario, "guard_raise") == 0;
    touch_guard_page(5); /* the fourth write ends the process */
  }
  fflush(stdout);
  NCCLCHECK(ncclCommDestroy(comm));
  return 0;
}
