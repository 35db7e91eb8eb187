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
 *                               dumps on demand (SIGUSR2): says whether its sleep was cut short
 * The kernel's rules for the application's signals (issue 38): each ends as without ncclwatch.
 *   signal_app blocked_abrt     every thread blocks SIGABRT; kill(SIGABRT) to the process stays
 *                               pending until a worker unblocks it, which then dies of it
 *   signal_app main_exited_abrt the main thread has called pthread_exit; a worker (blocking it
 *                               until then) gets the SIGABRT sent to the process and dies of it
 *   signal_app term_no_restart  a SIGTERM handler without SA_RESTART: the main thread's read()
 *                               returns EINTR and the program ends cleanly
 *   signal_app longjmp_int      a SIGINT handler leaves with longjmp; then raise(SIGTERM) ends
 *                               the process (the mask after the jump is the kernel's)
 *   signal_app exit_in_handler  a SIGTERM handler calls exit(5) while the main thread is in
 *                               malloc: exits 5
 *   signal_app term_no_onstack  a SIGTERM handler without SA_ONSTACK next to a 16 KiB
 *                               sigaltstack for SIGSEGV: it runs on the thread's own stack
 *   signal_app waits_in_full    while the process dumps (a job-wide request the test makes), the
 *                               main thread sleeps 4 s and a thread that called NCCL waits 3 s in
 *                               sem_timedwait, then in nanosleep: each keeps its length and result */
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>
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

static void block(int sig, int how) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, sig);
  pthread_sigmask(how, &set, NULL);
}

static int blocked_now(int sig) {
  sigset_t set;
  pthread_sigmask(SIG_BLOCK, NULL, &set);
  return sigismember(&set, sig);
}

/* Sent to the process while every thread of the application blocks it: pending until this
 * worker unblocks it. */
static void* abrt_unblocker(void* arg) {
  (void)arg;
  usleep(300 * 1000);
  kill(getpid(), SIGABRT);
  usleep(300 * 1000);
  say("worker unblocks SIGABRT\n");
  block(SIGABRT, SIG_UNBLOCK);
  sleep(10);
  say("worker survived SIGABRT\n");
  exit(0);
}

static volatile sig_atomic_t g_term_seen = 0;
static void on_term_flag(int sig) {
  (void)sig;
  g_term_seen = 1;
}

/* Sends `sig` to the process after 300 ms, blocking it itself: the kernel gives it to the
 * main thread. */
static void* send_later(void* arg) {
  block(*(int*)arg, SIG_BLOCK);
  usleep(300 * 1000);
  kill(getpid(), *(int*)arg);
  return NULL;
}

static jmp_buf g_jump;
static void on_int_jump(int sig) {
  (void)sig;
  longjmp(g_jump, 1);
}

static void on_term_exit(int sig) {
  (void)sig;
  exit(5);
}

static char* g_altstack;
static void on_segv_exit(int sig) {
  (void)sig;
  say("segv handler ran\n");
  _exit(3);
}
static __attribute__((noinline)) void use_stack(void) {
  volatile char deep[64 * 1024];
  memset((char*)deep, 1, sizeof deep);
}
static void on_term_deep(int sig) {
  stack_t now;
  (void)sig;
  sigaltstack(NULL, &now);
  say(now.ss_flags & SS_ONSTACK ? "term handler on the alternate stack\n" : "term handler on the thread's stack\n");
  use_stack(); /* 64 KiB: more than the alternate stack has */
}

struct waits {
  ncclComm_t comm;
  double sem_s, nano_s;
  int sem_rc, sem_errno, nano_rc, nano_errno;
};

/* A thread that calls NCCL (its stack is sampled by a dump), then waits 3 s twice. */
static void* nccl_waiter(void* arg) {
  struct waits* w = arg;
  sem_t sem;
  struct timespec until, nap = {3, 0};
  double start;
  simutil_cuda_init(0);
  (void)w->comm;
  NCCLCHECK(ncclGroupStart()); /* an NCCL call: a thread whose stack dumps show */
  NCCLCHECK(ncclGroupEnd());
  sem_init(&sem, 0, 0);
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 3;
  say("waiting\n");
  close(open(getenv("E2E_READY_FILE") ? getenv("E2E_READY_FILE") : "ready", O_CREAT | O_WRONLY, 0600)); /* the test asks its dump now */
  start = now_s();
  w->sem_rc = sem_timedwait(&sem, &until);
  w->sem_errno = errno;
  w->sem_s = now_s() - start;
  start = now_s();
  w->nano_rc = nanosleep(&nap, NULL);
  w->nano_errno = errno;
  w->nano_s = now_s() - start;
  return NULL;
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
  } else if (strcmp(scenario, "blocked_abrt") == 0) {
    block(SIGABRT, SIG_BLOCK); /* every thread created from here on blocks it too */
  } else if (strcmp(scenario, "term_no_restart") == 0) {
    sa.sa_flags = 0;
    sa.sa_handler = on_term_flag;
    sigaction(SIGTERM, &sa, NULL);
  } else if (strcmp(scenario, "longjmp_int") == 0) {
    sa.sa_flags = 0;
    sa.sa_handler = on_int_jump;
    sigaction(SIGINT, &sa, NULL);
  } else if (strcmp(scenario, "exit_in_handler") == 0) {
    sa.sa_flags = 0;
    sa.sa_handler = on_term_exit;
    sigaction(SIGTERM, &sa, NULL);
  } else if (strcmp(scenario, "term_no_onstack") == 0) {
    stack_t ss;
    g_altstack = malloc(16384);
    ss.ss_sp = g_altstack;
    ss.ss_size = 16384;
    ss.ss_flags = 0;
    sigaltstack(&ss, NULL);
    sa.sa_flags = SA_ONSTACK;
    sa.sa_handler = on_segv_exit;
    sigaction(SIGSEGV, &sa, NULL);
    sa.sa_flags = 0;
    sa.sa_handler = on_term_deep;
    sigaction(SIGTERM, &sa, NULL);
  } else if (strcmp(scenario, "segv_first_byte") == 0 || strcmp(scenario, "term_then_segv") == 0 ||
             strcmp(scenario, "forked_child_usr2") == 0 || strcmp(scenario, "sleeper") == 0 ||
             strcmp(scenario, "main_exited_abrt") == 0 || strcmp(scenario, "waits_in_full") == 0) {
    /* nothing of its own: ncclwatch's dumps, then the default action */
  } else {
    fprintf(stderr, "usage: signal_app resethand_segv|ignored_segv|resethand_term|ignored_term|segv_first_byte\n");
    return SIMUTIL_EXIT_USAGE;
  }

  simutil_cuda_init(0);
  simutil_exchange_id("world", 0, &id);
  NCCLCHECK(ncclCommInitRank(&comm, 1, id, 0)); /* ncclwatch starts here */
  say("started\n");

  alarm(15); /* a run that hangs ends the same way with and without ncclwatch: SIGALRM */
  if (strcmp(scenario, "blocked_abrt") == 0 || strcmp(scenario, "main_exited_abrt") == 0) {
    pthread_t t;
    if (strcmp(scenario, "main_exited_abrt") == 0) block(SIGABRT, SIG_BLOCK); /* for the worker */
    pthread_create(&t, NULL, abrt_unblocker, NULL);
    if (strcmp(scenario, "main_exited_abrt") == 0) pthread_exit(NULL);
    sleep(10);
    say("main survived SIGABRT\n");
    return 0;
  }
  if (strcmp(scenario, "term_no_restart") == 0) {
    int fds[2], sig = SIGTERM;
    char c;
    pthread_t t;
    ssize_t n;
    if (pipe(fds) != 0) return 1;
    pthread_create(&t, NULL, send_later, &sig);
    n = read(fds[0], &c, 1); /* nobody writes: only a signal ends it */
    printf("read returned %d (%s), handler ran: %d\n", (int)n, n < 0 && errno == EINTR ? "EINTR" : "?",
           (int)g_term_seen);
    fflush(stdout);
    pthread_join(t, NULL);
    NCCLCHECK(ncclCommDestroy(comm));
    return 0;
  }
  if (strcmp(scenario, "longjmp_int") == 0) {
    if (setjmp(g_jump) == 0) {
      raise(SIGINT);
      say("SIGINT handler returned\n");
      return 1;
    }
    printf("after the jump: SIGINT blocked %d, SIGTERM blocked %d\n", blocked_now(SIGINT), blocked_now(SIGTERM));
    fflush(stdout);
    raise(SIGTERM);
    say("survived SIGTERM\n");
    return 1;
  }
  if (strcmp(scenario, "exit_in_handler") == 0) {
    int sig = SIGTERM;
    pthread_t t;
    pthread_create(&t, NULL, send_later, &sig);
    for (unsigned i = 0;; ++i) { /* beyond the thread cache: every call takes the arena's lock */
      void* volatile p = malloc(2048 + (i * 7919u) % 60000);
      free(p);
    }
  }
  if (strcmp(scenario, "term_no_onstack") == 0) {
    raise(SIGTERM);
    say("term handler returned\n");
    NCCLCHECK(ncclCommDestroy(comm));
    return 0;
  }
  if (strcmp(scenario, "waits_in_full") == 0) {
    struct waits w;
    pthread_t t;
    double start;
    unsigned left;
    memset(&w, 0, sizeof w);
    w.comm = comm;
    pthread_create(&t, NULL, nccl_waiter, &w);
    /* The test asks for a job-wide dump (ncclwatch dump) while both wait. */
    start = now_s();
    left = sleep(4);
    printf("main: sleep(4) left %u after %s\n", left, now_s() - start >= 3.9 ? "4 s" : "less");
    pthread_join(t, NULL);
    printf("waiter: sem_timedwait %d %s after %s; nanosleep %d %s after %s\n", w.sem_rc,
           w.sem_rc ? strerror(w.sem_errno) : "-", w.sem_s >= 2.9 ? "3 s" : "less", w.nano_rc,
           w.nano_rc ? strerror(w.nano_errno) : "-", w.nano_s >= 2.9 ? "3 s" : "less");
    fflush(stdout);
    NCCLCHECK(ncclCommDestroy(comm));
    return 0;
  }
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
