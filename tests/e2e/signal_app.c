/* An application's own signal dispositions, set before NCCL starts (ncclwatch finds them when
 * the first communicator starts it): each scenario must end the same with ncclwatch preloaded
 * as without it (tests/e2e run_e2e.py, signals_chained_as_without_ncclwatch).
 *   signal_app resethand_segv   a SIGSEGV handler with SA_RESETHAND, then a fault: it runs once,
 *                               the fault comes again and the process dies of SIGSEGV
 *   signal_app ignored_segv     SIGSEGV ignored, then a fault: the kernel's default action
 *   signal_app resethand_term   a SIGTERM handler with SA_RESETHAND, two SIGTERMs: the second
 *                               ends the process
 *   signal_app ignored_term     SIGTERM and SIGINT ignored and raised: the process goes on, and
 *                               they are still ignored in it and in a program it execs
 *   signal_app segv_first_byte  no handler of its own; a fault on the first instruction of a
 *                               static function (corrupt_batch): the crash dump names it
 *   signal_app term_then_segv   SIGTERM, then SIGSEGV sent while its handler runs: SIGTERM ends it
 *   signal_app forked_child_usr2  a forked child raises SIGUSR2: it dies of it (the parent says)
 *   signal_app sleeper          a thread that never calls NCCL sleeps 3 s while the process
 *                               dumps on demand (SIGUSR2): says whether its sleep was cut short */
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "simutil.h"

static void say(const char* line) {
  ssize_t ignored = write(STDOUT_FILENO, line, strlen(line));
  (void)ignored;
}

static void on_segv(int sig) {
  (void)sig;
  say("segv handler ran\n");  /* returns: the faulting instruction runs again */
}

/* Not a constant: the compiler cannot fold the store into the caller or clone the function. */
static int* volatile g_batch = NULL;

/* Its first instruction stores through `batch`: with NULL, the fault is on the function's first
 * byte, where a return-address lookup (address - 1) would name the function before it. */
static __attribute__((noinline)) void corrupt_batch(int* batch) { *batch = 1; }

/* Once the main thread is inside a SIGTERM handler (SIGTERM blocked in it: ncclwatch's, writing
 * its dump), SIGSEGV is sent to the process. Without ncclwatch SIGTERM ended it long before. */
static void* segv_during_term(void* arg) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/self/task/%d/status", *(int*)arg);
  for (;;) {
    FILE* f = fopen(path, "r");
    unsigned long long blocked = 0;
    while (f && fgets(line, sizeof line, f))
      if (strncmp(line, "SigBlk:", 7) == 0) blocked = strtoull(line + 7, NULL, 16);
    if (f) fclose(f);
    /* SIGTERM blocked but not SIGSEGV: inside a SIGTERM handler (raise() blocks every signal
     * for a moment around its own send, which must not count). */
    if ((blocked & (1ull << (SIGTERM - 1))) && !(blocked & (1ull << (SIGSEGV - 1)))) break;
    usleep(200);
  }
  usleep(1000);
  kill(getpid(), SIGSEGV);
  return NULL;
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void* sleeper(void* arg) {
  double start = now_s();
  sleep(3);
  *(double*)arg = now_s() - start;
  return NULL;
}

static void on_term(int sig) {
  (void)sig;
  say("term handler ran\n");
}

static void print_ignored(const char* who) {
  char line[256];
  FILE* f = fopen("/proc/self/status", "r");
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "SigIgn:", 7) == 0) printf("%s %s", who, line);
  if (f) fclose(f);
  fflush(stdout);
}

int main(int argc, char** argv) {
  const char* scenario = argc > 1 ? argv[1] : "";
  struct sigaction sa;
  ncclUniqueId id;
  ncclComm_t comm;
  memset(&sa, 0, sizeof sa);
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  if (strcmp(scenario, "resethand_segv") == 0) {
    sa.sa_handler = on_segv;
    sigaction(SIGSEGV, &sa, NULL);
  } else if (strcmp(scenario, "ignored_segv") == 0) {
    signal(SIGSEGV, SIG_IGN);
  } else if (strcmp(scenario, "resethand_term") == 0) {
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);
  } else if (strcmp(scenario, "ignored_term") == 0) {
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
  } else if (strcmp(scenario, "segv_first_byte") == 0 || strcmp(scenario, "term_then_segv") == 0 ||
             strcmp(scenario, "forked_child_usr2") == 0 || strcmp(scenario, "sleeper") == 0) {
    /* nothing of its own: ncclwatch's dumps, then the default action */
  } else {
    fprintf(stderr, "usage: signal_app resethand_segv|ignored_segv|resethand_term|ignored_term|segv_first_byte\n");
    return SIMUTIL_EXIT_USAGE;
  }

  simutil_cuda_init(0);
  simutil_exchange_id("world", 0, &id);
  NCCLCHECK(ncclCommInitRank(&comm, 1, id, 0)); /* ncclwatch starts here */
  say("started\n");

  if (strcmp(scenario, "term_then_segv") == 0) {
    pthread_t t;
    int main_tid = getpid();
    pthread_create(&t, NULL, segv_during_term, &main_tid);
    raise(SIGTERM);
    sleep(20);
    say("survived SIGTERM and SIGSEGV\n");
    return 1;
  }
  if (strcmp(scenario, "forked_child_usr2") == 0) {
    int status = 0;
    pid_t child = fork();
    if (child == 0) {
      raise(SIGUSR2);
      sleep(5);
      _exit(3);
    }
    while (waitpid(child, &status, 0) < 0) {
    }
    if (WIFSIGNALED(status)) printf("child killed by signal %d\n", WTERMSIG(status));
    else printf("child exited %d\n", WEXITSTATUS(status));
    fflush(stdout);
    NCCLCHECK(ncclCommDestroy(comm));
    return 0;
  }
  if (strcmp(scenario, "sleeper") == 0) {
    double slept = 0;
    pthread_t t;
    pthread_create(&t, NULL, sleeper, &slept);
    usleep(200 * 1000);  /* the sleeper is in its sleep */
    raise(SIGUSR2);      /* an on-demand dump, while it sleeps */
    pthread_join(t, NULL);
    printf(slept >= 2.9 ? "sleeper slept in full\n" : "sleeper woke after %.1f s\n", slept);
    fflush(stdout);
    NCCLCHECK(ncclCommDestroy(comm));
    return 0;
  }
  if (strcmp(scenario, "segv_first_byte") == 0) {
    corrupt_batch(g_batch);
    say("survived the fault\n");
    return 1;
  }
  if (strstr(scenario, "segv")) {
    volatile int* volatile nowhere = NULL;
    *nowhere = 1;
    say("survived the fault\n");
    return 1;
  }
  if (strcmp(scenario, "resethand_term") == 0) {
    raise(SIGTERM);
    raise(SIGTERM);
    say("survived two SIGTERMs\n");
    return 1;
  }
  raise(SIGTERM);
  raise(SIGINT);
  print_ignored("self");
  if (system("grep '^SigIgn:' /proc/self/status | sed 's/^/child /'") != 0) return 1;
  NCCLCHECK(ncclCommDestroy(comm));
  return 0;
}
