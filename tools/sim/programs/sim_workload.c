/* sim_workload: a training-loop-like NCCL workload whose options reproduce the hang scenarios
 * ncclwatch must name (see --help and docs/simulator.md). NCCL + CUDA driver API only. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>

#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "simutil.h"

static const char kUsage[] =
    "usage: sim_workload [options]   (run under simlaunch: RANK, WORLD_SIZE, NCCLWATCH_SIM_RUNDIR)\n"
    "Each iteration issues one collective on every communicator on one stream, synchronizes\n"
    "every --sync-every iterations, and at the end checks every result. Prints \"ok\" on success.\n"
    "  --iters N                 iterations (default 10)\n"
    "  --op OP                   allreduce|allgather|reducescatter|broadcast|alltoall (default\n"
    "                            allreduce); float32 sum, broadcast from rank 0\n"
    "  --count C                 elements per rank (NCCL's count argument; default 1024)\n"
    "  --comms K                 also run on K-1 communicators split from the world\n"
    "                            (communicator k: color = rank % (k+1)); default 1\n"
    "  --sync-every K            cuStreamSynchronize every K iterations (default 1)\n"
    "  --busy-rank R --busy-at I --busy-ms M\n"
    "                            rank R sleeps M ms on the host before iteration I (a rank busy\n"
    "                            saving a checkpoint); M = -1: forever\n"
    "  --busy-after FILE         with --busy-rank: busy at the first iteration after FILE\n"
    "                            exists, instead of at --busy-at (a test's moment of its choosing)\n"
    "  --slow-kernel-rank R --slow-kernel-at I --slow-kernel-ms M\n"
    "                            rank R launches its own \"kernel\" of M ms (-1: forever) on the\n"
    "                            stream before iteration I: the GPU does not reach the collective\n"
    "                            (the application's work, before NCCL is called)\n"
    "  --straggler-rank R --straggler-ms A [--straggler-max-ms B]\n"
    "                            rank R sleeps A ms (uniform in A..B ms) on the host before every\n"
    "                            iteration: a straggler the others wait for at each collective\n"
    "  --jitter-ms J --seed S    every rank sleeps 0..J ms (uniform, seeded by S and the rank)\n"
    "                            before every iteration: a healthy job's noise\n"
    "  --cpu-wait                after the loop, each rank prints how long its issuing thread\n"
    "                            waited for a CPU during it (/proc/thread-self/schedstat):\n"
    "                            \"cpu wait: rank R MS ms in N iterations\" (a loaded machine's\n"
    "                            share in a rank's lateness)\n"
    "  --linger-ms M              every rank sleeps M ms on the host after its last iteration\n"
    "                            (all work done) before it exits\n"
    "  --extra-rank R --extra-at I\n"
    "                            rank R issues one extra all-gather before iteration I (ranks\n"
    "                            diverge in call count)\n"
    "  --mismatch-rank R --mismatch-at I\n"
    "                            rank R passes count+1 at iteration I (mismatched collective)\n"
    "  --p2p-deadlock            at iteration --deadlock-at, ranks 0 and 1 both ncclSend to each\n"
    "                            other first (then ncclRecv), outside a group\n"
    "  --cross-comm-deadlock     two communicators A and B on two streams; at iteration\n"
    "                            --deadlock-at even ranks run A then B, odd ranks B then A,\n"
    "                            synchronizing after each\n"
    "  --deadlock-at I           iteration of the two deadlocks above (default 1)\n"
    "  --graph                   capture one all-reduce into a CUDA graph (GLOBAL capture mode)\n"
    "                            and replay it --iters times, checking each replay\n"
    "  --nonblocking             non-blocking communicators (config.blocking = 0): poll\n"
    "                            ncclCommGetAsyncError after init and after every call\n"
    "  --abort-after-ms T        watchdog thread (as PyTorch's): if an iteration's stream work\n"
    "                            is not finished T ms after it was issued, ncclCommAbort every\n"
    "                            communicator and exit(6)\n"
    "  --final-from R             after the loop, every rank >= R issues one more all-reduce (its\n"
    "                            final metrics, which the others never issue) and waits for it;\n"
    "                            the others destroy their communicators and exit 0\n"
    "  --exit-rank R --exit-at I rank R leaves the loop before iteration I and returns from main\n"
    "                            with status 0 (uneven inputs); the others wait\n"
    "  --quick-exit              with --exit-rank: leave through _exit(0), as a multiprocessing\n"
    "                            child or os._exit does (no exit() handlers)\n"
    "  --kill-self               with --exit-rank: SIGKILL itself instead (the OOM killer's way),\n"
    "                            right after synchronizing the last iteration's work\n"
    "  --stop-self               with --exit-rank: SIGSTOP itself there instead (a debugger's\n"
    "                            stop, Ctrl-Z); continued, it leaves the loop as --exit-rank does\n"
    "  --fork                    the rank forks at start; the child runs the job (and leaves\n"
    "                            through _exit with --exit-rank), the parent waits and exits with\n"
    "                            its status (ranks started by fork, as Python's multiprocessing\n"
    "                            fork context does)\n"
    "  --no-init-rank R          rank R never calls ncclCommInitRank (sleeps until killed): a\n"
    "                            setup hang\n"
    "  --new-comm-at I --new-comm-kind K [--new-comm-groups G] [--new-comm-skip-rank R]\n"
    "                            before iteration I every rank creates a new communicator (a\n"
    "                            checkpoint group): K init (ncclCommInitRank) or config\n"
    "                            (ncclCommInitRankConfig) of G blocks of consecutive ranks (default\n"
    "                            1), split (ncclCommSplit of the world, color = block) or shrink\n"
    "                            (ncclCommShrink of the world, excluding nobody); rank R never\n"
    "                            calls it (busy in host code until killed)\n"
    "  --late-init-rank R --late-init-ms T\n"
    "                            rank R calls ncclCommInitRank T ms after the others (a rank late\n"
    "                            to setup), then runs normally\n"
    "  --graph-then-loop         with --graph: after the replays, run the plain iterations too\n"
    "                            (with their options, --busy-rank included)\n"
    "  --abort-signal            with --abort-after-ms: abort() (SIGABRT) after ncclCommAbort,\n"
    "                            as PyTorch's TORCH_NCCL_ASYNC_ERROR_HANDLING does, not exit(6)\n"
    "  --exit-in-flight          after the iterations, issue one all-reduce that can never\n"
    "                            complete (count differs per rank) and exit(0) without waiting\n"
    "  --sigterm-handler         install a SIGTERM handler that prints \"app handler ran\" and\n"
    "                            calls _exit(42)\n"
    "  --get-version-only        print \"nccl version V\" (ncclGetVersion) and exit\n"
    "Iterations count from 0. Exit status: 0 ok, 2 usage, 3 NCCL/CUDA error, 4 wrong result,\n"
    "6 watchdog abort, 42 from the SIGTERM handler.\n";

enum Op { OP_ALLREDUCE, OP_ALLGATHER, OP_REDUCESCATTER, OP_BROADCAST, OP_ALLTOALL };
/* How long this thread has waited on a run queue (ns in schedstat's second field), in ms; 0
 * where the kernel keeps no schedstat. */
static double thread_cpu_wait_ms(void) {
  unsigned long long run = 0, wait = 0;
  FILE* f = fopen("/proc/thread-self/schedstat", "r");
  if (!f) return 0;
  if (fscanf(f, "%llu %llu", &run, &wait) != 2) wait = 0;
  fclose(f);
  return (double)wait / 1e6;
}

static const char* const kOpNames[] = {"allreduce", "allgather", "reducescatter", "broadcast", "alltoall"};

struct Options {
  int iters, count, comms, sync_every, op;
  int busy_rank, busy_at, busy_ms;
  int straggler_rank, straggler_ms, straggler_max_ms, jitter_ms, seed;
  int slow_kernel_rank, slow_kernel_at, slow_kernel_ms;
  int linger_ms;
  int final_from;
  int cpu_wait;
  int extra_rank, extra_at;
  int mismatch_rank, mismatch_at;
  int p2p_deadlock, cross_comm_deadlock, deadlock_at;
  int graph, nonblocking, abort_after_ms, exit_in_flight, sigterm_handler, get_version_only;
  int late_init_rank, late_init_ms;
  int new_comm_at, new_comm_groups, new_comm_skip_rank;
  const char* new_comm_kind;
  int exit_rank, exit_at, no_init_rank, abort_signal, graph_then_loop, quick_exit, fork_rank, kill_self, stop_self;
  const char* busy_after;
};

/* One communicator of the workload and what it takes to check its results. */
struct Comm {
  ncclComm_t comm;
  int size, rank;
  int members[1024]; /* world rank of each member, in communicator rank order */
  CUdeviceptr send, recv;
};

static struct Options opt;
static int g_rank, g_world;
static struct Comm g_comms[16];
static int g_ncomms;
static ncclComm_t g_extra_comm; /* B of --cross-comm-deadlock */

/* ---- watchdog (--abort-after-ms) ---------------------------------------------------------- */

static CUevent g_iter_event;
static CUcontext g_ctx;
static atomic_int g_watch_iter = -1; /* iteration being watched, -1: none */
static _Atomic double g_watch_since;
static atomic_int g_aborting;

static void* watchdog(void* arg) {
  (void)arg;
  CUCHECK(cuCtxSetCurrent(g_ctx));
  for (;;) {
    int it = atomic_load(&g_watch_iter);
    if (it >= 0 && simutil_now_ms() - atomic_load(&g_watch_since) > opt.abort_after_ms &&
        cuEventQuery(g_iter_event) == CUDA_ERROR_NOT_READY && it == atomic_load(&g_watch_iter)) {
      int i;
      atomic_store(&g_aborting, 1);
      fprintf(stderr, "sim_workload: rank %d: watchdog: iteration %d not finished after %d ms; aborting\n",
              g_rank, it, opt.abort_after_ms);
      for (i = 0; i < g_ncomms; ++i) ncclCommAbort(g_comms[i].comm);
      if (g_extra_comm) ncclCommAbort(g_extra_comm);
      if (opt.abort_signal) abort();
      exit(6);
    }
    simutil_sleep_ms(10);
  }
  return NULL;
}

/* ---- helpers -------------------------------------------------------------------------------- */

static void on_sigterm(int sig) {
  static const char msg[] = "app handler ran\n";
  (void)sig;
  if (write(1, msg, sizeof msg - 1) < 0) {
  }
  _exit(42);
}

/* Non-blocking communicators: wait until the last call's work was handed to the stream. */
static void settle(ncclComm_t c) {
  ncclResult_t e;
  for (;;) {
    NCCLCHECK(ncclCommGetAsyncError(c, &e));
    if (e != ncclInProgress) break;
    simutil_sleep_ms(1);
  }
  if (e != ncclSuccess) {
    fprintf(stderr, "sim_workload: rank %d: async error %s\n", g_rank, ncclGetErrorString(e));
    exit(SIMUTIL_EXIT_API);
  }
}

/* Runs an NCCL call; ncclInProgress is expected on non-blocking communicators. */
static void call(ncclResult_t r, ncclComm_t c, const char* what) {
  if (r == ncclInProgress && opt.nonblocking) {
    settle(c);
    return;
  }
  if (r != ncclSuccess) {
    ncclResult_t e = ncclSuccess;
    ncclCommGetAsyncError(c, &e);
    fprintf(stderr, "sim_workload: rank %d: %s failed: %s; async error: %s\n", g_rank, what,
            ncclGetErrorString(r), ncclGetErrorString(e));
    exit(SIMUTIL_EXIT_API);
  }
  if (opt.nonblocking) settle(c);
}

static void sync_stream(CUstream s) {
  CUresult r = cuStreamSynchronize(s);
  if (atomic_load(&g_aborting))
    for (;;) pause(); /* the watchdog is taking the process down (exit() fails syncs) */
  CUCHECK(r);
}

static size_t send_elems(int n) { return (size_t)(opt.count + 1) * (size_t)n; }

static void issue(struct Comm* c, size_t count, CUstream s) {
  void *sb = (void*)c->send, *rb = (void*)c->recv;
  ncclResult_t r = ncclSuccess;
  switch (opt.op) {
    case OP_ALLREDUCE: r = ncclAllReduce(sb, rb, count, ncclFloat32, ncclSum, c->comm, s); break;
    case OP_ALLGATHER: r = ncclAllGather(sb, rb, count, ncclFloat32, c->comm, s); break;
    case OP_REDUCESCATTER: r = ncclReduceScatter(sb, rb, count, ncclFloat32, ncclSum, c->comm, s); break;
    case OP_BROADCAST: r = ncclBroadcast(sb, rb, count, ncclFloat32, 0, c->comm, s); break;
    case OP_ALLTOALL: r = ncclAlltoAll(sb, rb, count, ncclFloat32, c->comm, s); break;
  }
  call(r, c->comm, kOpNames[opt.op]);
}

/* Send buffer of member m (world rank w): element i is w + 1 + i % 13. */
static float input(int w, size_t i) { return (float)(w + 1) + (float)(i % 13); }

static int verify(const struct Comm* c) {
  const size_t C = (size_t)opt.count;
  const int n = c->size, me = c->rank;
  size_t total = C, i;
  float* got;
  int bad = 0, m;
  if (opt.op == OP_ALLGATHER || opt.op == OP_ALLTOALL) total = C * (size_t)n;
  got = malloc(total * sizeof *got);
  CUCHECK(cuMemcpyDtoH(got, c->recv, total * sizeof *got));
  for (i = 0; i < total && bad < 5; ++i) {
    float want = 0;
    size_t blk = i / C, off = i % C;
    switch (opt.op) {
      case OP_ALLREDUCE:
      case OP_REDUCESCATTER: {
        size_t at = opt.op == OP_ALLREDUCE ? i : (size_t)me * C + i;
        for (m = 0; m < n; ++m) want += input(c->members[m], at);
        break;
      }
      case OP_ALLGATHER: want = input(c->members[blk], off); break;
      case OP_BROADCAST: want = input(c->members[0], i); break;
      case OP_ALLTOALL: want = input(c->members[blk], (size_t)me * C + off); break;
    }
    if (got[i] != want) {
      fprintf(stderr, "sim_workload: rank %d: %s on a %d-rank comm: element %zu is %g, want %g\n", g_rank,
              kOpNames[opt.op], n, i, got[i], want);
      ++bad;
    }
  }
  free(got);
  return bad == 0;
}

static void setup_comm(struct Comm* c) {
  size_t elems = send_elems(c->size), i;
  float* host = malloc(elems * sizeof *host);
  for (i = 0; i < elems; ++i) host[i] = input(g_rank, i);
  c->send = simutil_alloc(elems * sizeof(float));
  c->recv = simutil_alloc(elems * sizeof(float));
  CUCHECK(cuMemcpyHtoD(c->send, host, elems * sizeof(float)));
  free(host);
}

static ncclComm_t split(ncclComm_t parent, int color, int key, ncclConfig_t* cfg) {
  ncclComm_t child = NULL;
  ncclResult_t r = ncclCommSplit(parent, color, key, &child, cfg);
  call(r, parent, "ncclCommSplit");
  if (opt.nonblocking) settle(child);
  return child;
}

/* A communicator created mid-job by every rank but one (--new-comm-*). */
static ncclComm_t g_new_comm;
static void create_new_comm(ncclComm_t world, ncclConfig_t* cfg) {
  const int groups = opt.new_comm_groups > 0 ? opt.new_comm_groups : 1;
  const int gsize = (g_world + groups - 1) / groups, group = g_rank / gsize, grank = g_rank % gsize;
  const int size = group == groups - 1 ? g_world - group * gsize : gsize;
  if (g_rank == opt.new_comm_skip_rank)
    for (;;) simutil_sleep_ms(1000); /* busy in host code: never calls it */
  if (strcmp(opt.new_comm_kind, "split") == 0) {
    g_new_comm = split(world, group, g_rank, NULL);
  } else if (strcmp(opt.new_comm_kind, "shrink") == 0) {
    call(ncclCommShrink(world, NULL, 0, &g_new_comm, NULL, 0), world, "ncclCommShrink");
  } else {
    char name[64];
    ncclUniqueId id;
    snprintf(name, sizeof name, "newcomm-%d", group);
    simutil_exchange_id(name, grank, &id);
    if (strcmp(opt.new_comm_kind, "config") == 0)
      call(ncclCommInitRankConfig(&g_new_comm, size, id, grank, cfg), NULL, "ncclCommInitRankConfig");
    else
      call(ncclCommInitRank(&g_new_comm, size, id, grank), NULL, "ncclCommInitRank");
  }
}

static int parse_int(int argc, char** argv, int* i) {
  char* end;
  long v;
  if (*i + 1 >= argc) {
    fprintf(stderr, "sim_workload: %s needs a value\n", argv[*i]);
    exit(SIMUTIL_EXIT_USAGE);
  }
  v = strtol(argv[++*i], &end, 10);
  if (*end != '\0') {
    fprintf(stderr, "sim_workload: %s: not an integer: %s\n", argv[*i - 1], argv[*i]);
    exit(SIMUTIL_EXIT_USAGE);
  }
  return (int)v;
}

static void parse(int argc, char** argv) {
  int i, k;
  memset(&opt, 0, sizeof opt);
  opt.iters = 10;
  opt.count = 1024;
  opt.comms = 1;
  opt.sync_every = 1;
  opt.busy_rank = opt.extra_rank = opt.mismatch_rank = opt.slow_kernel_rank = -1;
  opt.exit_rank = opt.no_init_rank = opt.late_init_rank = -1;
  opt.new_comm_at = opt.new_comm_skip_rank = -1;
  opt.new_comm_groups = 1;
  opt.new_comm_kind = "init";
  opt.straggler_rank = -1;
  opt.final_from = -1;
  opt.deadlock_at = 1;
  for (i = 1; i < argc; ++i) {
    const char* a = argv[i];
#define INT_OPT(name, field) else if (strcmp(a, name) == 0) opt.field = parse_int(argc, argv, &i);
#define FLAG_OPT(name, field) else if (strcmp(a, name) == 0) opt.field = 1;
    if (strcmp(a, "--") == 0) {
      break;  /* the rest stands for a training script's own arguments: ignored */
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      fputs(kUsage, stdout);
      exit(0);
    } else if (strcmp(a, "--busy-after") == 0) {
      if (++i >= argc) break;
      opt.busy_after = argv[i];
    } else if (strcmp(a, "--op") == 0) {
      if (++i >= argc) break;
      for (opt.op = -1, k = 0; k < 5; ++k)
        if (strcmp(argv[i], kOpNames[k]) == 0) opt.op = k;
      if (opt.op < 0) {
        fprintf(stderr, "sim_workload: unknown --op %s\n%s", argv[i], kUsage);
        exit(SIMUTIL_EXIT_USAGE);
      }
    }
    INT_OPT("--iters", iters) INT_OPT("--count", count) INT_OPT("--comms", comms)
    INT_OPT("--sync-every", sync_every) INT_OPT("--busy-rank", busy_rank) INT_OPT("--busy-at", busy_at)
    INT_OPT("--busy-ms", busy_ms) INT_OPT("--extra-rank", extra_rank) INT_OPT("--extra-at", extra_at)
    INT_OPT("--slow-kernel-rank", slow_kernel_rank) INT_OPT("--slow-kernel-at", slow_kernel_at)
    INT_OPT("--slow-kernel-ms", slow_kernel_ms) INT_OPT("--linger-ms", linger_ms) INT_OPT("--final-from", final_from)
    INT_OPT("--mismatch-rank", mismatch_rank) INT_OPT("--mismatch-at", mismatch_at)
    INT_OPT("--deadlock-at", deadlock_at) INT_OPT("--abort-after-ms", abort_after_ms)
    FLAG_OPT("--p2p-deadlock", p2p_deadlock) FLAG_OPT("--cross-comm-deadlock", cross_comm_deadlock)
    FLAG_OPT("--graph", graph) FLAG_OPT("--nonblocking", nonblocking)
    FLAG_OPT("--exit-in-flight", exit_in_flight) FLAG_OPT("--sigterm-handler", sigterm_handler)
    FLAG_OPT("--get-version-only", get_version_only) INT_OPT("--exit-rank", exit_rank)
    INT_OPT("--exit-at", exit_at) INT_OPT("--no-init-rank", no_init_rank)
    INT_OPT("--new-comm-at", new_comm_at) INT_OPT("--new-comm-groups", new_comm_groups)
    INT_OPT("--new-comm-skip-rank", new_comm_skip_rank)
    else if (strcmp(a, "--new-comm-kind") == 0 && i + 1 < argc) opt.new_comm_kind = argv[++i];
    INT_OPT("--late-init-rank", late_init_rank) INT_OPT("--late-init-ms", late_init_ms) FLAG_OPT("--abort-signal", abort_signal)
    FLAG_OPT("--graph-then-loop", graph_then_loop) FLAG_OPT("--quick-exit", quick_exit) FLAG_OPT("--kill-self", kill_self) FLAG_OPT("--stop-self", stop_self) FLAG_OPT("--fork", fork_rank) INT_OPT("--straggler-rank", straggler_rank)
    INT_OPT("--straggler-ms", straggler_ms) INT_OPT("--straggler-max-ms", straggler_max_ms)
    INT_OPT("--jitter-ms", jitter_ms) INT_OPT("--seed", seed) FLAG_OPT("--cpu-wait", cpu_wait)
    else {
      fprintf(stderr, "sim_workload: unknown option %s\n%s", a, kUsage);
      exit(SIMUTIL_EXIT_USAGE);
    }
#undef INT_OPT
#undef FLAG_OPT
  }
  if (opt.iters < 0 || opt.count < 1 || opt.comms < 1 || opt.comms > 16 || opt.sync_every < 1) {
    fprintf(stderr, "sim_workload: invalid --iters/--count/--comms/--sync-every\n");
    exit(SIMUTIL_EXIT_USAGE);
  }
}

/* ---- the scenarios ---------------------------------------------------------------------------- */

static void p2p_deadlock(CUstream s) {
  struct Comm* w = &g_comms[0];
  int peer = 1 - g_rank;
  if (g_rank > 1 || g_world < 2) return;
  call(ncclSend((void*)w->send, (size_t)opt.count, ncclFloat32, peer, w->comm, s), w->comm, "ncclSend");
  call(ncclRecv((void*)w->recv, (size_t)opt.count, ncclFloat32, peer, w->comm, s), w->comm, "ncclRecv");
}

/* A on the main stream, B (same members) on its own stream; the order depends on the parity. */
static void cross_comm_deadlock(CUstream sa, CUstream sb) {
  struct Comm* a = &g_comms[0];
  int i;
  for (i = 0; i < 2; ++i) {
    int use_a = (g_rank % 2 == 0) == (i == 0);
    ncclComm_t c = use_a ? a->comm : g_extra_comm;
    CUstream s = use_a ? sa : sb;
    call(ncclAllReduce((void*)a->send, (void*)a->recv, (size_t)opt.count, ncclFloat32, ncclSum, c, s), c,
         use_a ? "ncclAllReduce on A" : "ncclAllReduce on B");
    sync_stream(s);
  }
}

static int run_graph(CUstream s) {
  struct Comm* w = &g_comms[0];
  CUgraph graph;
  CUgraphExec exec;
  size_t bytes = (size_t)opt.count * sizeof(float);
  int it;
  opt.op = OP_ALLREDUCE;
  CUCHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  call(ncclAllReduce((void*)w->send, (void*)w->recv, (size_t)opt.count, ncclFloat32, ncclSum, w->comm, s), w->comm,
       "ncclAllReduce (captured)");
  CUCHECK(cuStreamEndCapture(s, &graph));
  CUCHECK(cuGraphInstantiate(&exec, graph, 0));
  for (it = 0; it < opt.iters; ++it) {
    CUCHECK(cuMemsetD8(w->recv, 0, bytes)); /* a replay that does not run leaves zeros */
    CUCHECK(cuGraphLaunch(exec, s));
    sync_stream(s);
    if (!verify(w)) return 0;
  }
  CUCHECK(cuGraphExecDestroy(exec));
  CUCHECK(cuGraphDestroy(graph));
  return 1;
}

/* The application's own long kernel: a host function in stream order. */
static void slow_kernel(void* arg) {
  long ms = (long)(intptr_t)arg;
  if (ms < 0)
    for (;;) simutil_sleep_ms(1000);
  simutil_sleep_ms(ms);
}

int main(int argc, char** argv) {
  ncclUniqueId id;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  CUstream stream, stream_b = NULL;
  pthread_t wd;
  int it, k, ok = 1;

  parse(argc, argv);
  if (opt.fork_rank) {
    pid_t child = fork();
    int status = 0;
    if (child < 0) return SIMUTIL_EXIT_USAGE;
    if (child > 0) {
      while (waitpid(child, &status, 0) < 0) {
      }
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    /* The launcher stops the rank it started, the parent: the child goes with it. */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() == 1) _exit(SIMUTIL_EXIT_USAGE);
  }
  if (opt.get_version_only) {
    int v = 0;
    NCCLCHECK(ncclGetVersion(&v));
    printf("nccl version %d\n", v);
    return 0;
  }
  if (opt.sigterm_handler) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigterm;
    sigaction(SIGTERM, &sa, NULL);
  }
  g_rank = simutil_env_int("RANK", 0);
  g_world = simutil_env_int("WORLD_SIZE", 1);
  if (g_world > 1024) return SIMUTIL_EXIT_USAGE;
  g_ctx = simutil_cuda_init(simutil_env_int("LOCAL_RANK", 0));
  if (opt.nonblocking) cfg.blocking = 0;

  /* World, then the split communicators. */
  if (g_rank == opt.no_init_rank)
    for (;;) simutil_sleep_ms(1000); /* never joins: the others wait inside ncclCommInitRank */
  simutil_exchange_id("world", g_rank, &id);
  if (g_rank == opt.late_init_rank) simutil_sleep_ms(opt.late_init_ms); /* late to setup, then healthy */
  {
    ncclResult_t r = ncclCommInitRankConfig(&g_comms[0].comm, g_world, id, g_rank, &cfg);
    call(r, g_comms[0].comm, "ncclCommInitRankConfig");
  }
  g_comms[0].size = g_world;
  g_comms[0].rank = g_rank;
  for (k = 0; k < g_world; ++k) g_comms[0].members[k] = k;
  g_ncomms = 1;
  for (k = 1; k < opt.comms; ++k) {
    struct Comm* c = &g_comms[g_ncomms++];
    int color = g_rank % (k + 1), w;
    c->comm = split(g_comms[0].comm, color, g_rank, opt.nonblocking ? &cfg : NULL);
    for (w = color; w < g_world; w += k + 1) c->members[c->size++] = w;
    c->rank = g_rank / (k + 1);
  }
  if (opt.cross_comm_deadlock) g_extra_comm = split(g_comms[0].comm, 0, g_rank, opt.nonblocking ? &cfg : NULL);
  for (k = 0; k < g_ncomms; ++k) setup_comm(&g_comms[k]);

  CUCHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  if (opt.cross_comm_deadlock) CUCHECK(cuStreamCreate(&stream_b, CU_STREAM_NON_BLOCKING));
  if (opt.abort_after_ms > 0) {
    CUCHECK(cuEventCreate(&g_iter_event, CU_EVENT_DISABLE_TIMING));
    pthread_create(&wd, NULL, watchdog, NULL);
  }

  if (opt.graph) ok = run_graph(stream);
  if (!opt.graph || opt.graph_then_loop) {
    unsigned jitter_state = (unsigned)opt.seed * 7919u + (unsigned)g_rank * 104729u + 1u;
    const double cpu_wait_start = thread_cpu_wait_ms();
    for (it = 0; it < opt.iters; ++it) {
      if (g_rank == opt.exit_rank && it == opt.exit_at) {
        sync_stream(stream);
        if (opt.kill_self) raise(SIGKILL);
        if (opt.stop_self) raise(SIGSTOP);
        printf("ok (left before iteration %d)\n", it);
        fflush(stdout);
        if (opt.quick_exit || opt.fork_rank) _exit(0);
        return 0; /* uneven inputs: a normal exit while the others go on */
      }
      if (g_rank == opt.straggler_rank) {
        int span = opt.straggler_max_ms > opt.straggler_ms ? opt.straggler_max_ms - opt.straggler_ms : 0;
        simutil_sleep_ms(opt.straggler_ms + (span ? (int)(rand_r(&jitter_state) % (unsigned)(span + 1)) : 0));
      }
      if (opt.jitter_ms > 0) simutil_sleep_ms((int)(rand_r(&jitter_state) % (unsigned)(opt.jitter_ms + 1)));
      if (g_rank == opt.busy_rank &&
          (opt.busy_after ? access(opt.busy_after, F_OK) == 0 : it == opt.busy_at)) {
        if (opt.busy_ms < 0)
          for (;;) simutil_sleep_ms(1000);
        simutil_sleep_ms(opt.busy_ms);
      }
      if (g_rank == opt.slow_kernel_rank && it == opt.slow_kernel_at)
        CUCHECK(cuLaunchHostFunc(stream, slow_kernel, (void*)(intptr_t)opt.slow_kernel_ms));
      if (g_rank == opt.extra_rank && it == opt.extra_at) {
        struct Comm* w = &g_comms[0];
        call(ncclAllGather((void*)w->send, (void*)w->recv, 1, ncclFloat32, w->comm, stream), w->comm,
             "extra ncclAllGather");
      }
      if (it == opt.new_comm_at) {
        sync_stream(stream);
        create_new_comm(g_comms[0].comm, &cfg);
      }
      if (opt.p2p_deadlock && it == opt.deadlock_at) p2p_deadlock(stream);
      if (opt.cross_comm_deadlock && it == opt.deadlock_at) cross_comm_deadlock(stream, stream_b);
      for (k = 0; k < g_ncomms; ++k) {
        size_t count = (size_t)opt.count;
        if (k == 0 && g_rank == opt.mismatch_rank && it == opt.mismatch_at) count += 1;
        issue(&g_comms[k], count, stream);
      }
      if (opt.abort_after_ms > 0) {
        CUCHECK(cuEventRecord(g_iter_event, stream));
        atomic_store(&g_watch_since, simutil_now_ms());
        atomic_store(&g_watch_iter, it);
      }
      if ((it + 1) % opt.sync_every == 0) sync_stream(stream);
    }
    sync_stream(stream);
    if (opt.cpu_wait) {
      printf("cpu wait: rank %d %.1f ms in %d iterations\n", g_rank, thread_cpu_wait_ms() - cpu_wait_start, it);
      fflush(stdout);
    }
    atomic_store(&g_watch_iter, -1);
    if (opt.linger_ms > 0) simutil_sleep_ms(opt.linger_ms);
    for (k = 0; k < g_ncomms && opt.iters > 0; ++k) ok &= verify(&g_comms[k]);
  }
  if (!ok) return SIMUTIL_EXIT_WRONG;

  if (opt.exit_in_flight) {
    struct Comm* w = &g_comms[0];
    /* Count differs on every rank: a mismatch that never completes, then exit at once. */
    call(ncclAllReduce((void*)w->send, (void*)w->recv, 1 + (size_t)g_rank, ncclFloat32, ncclSum, w->comm, stream),
         w->comm, "ncclAllReduce (in flight at exit)");
    printf("ok\n");
    fflush(stdout);
    exit(0);
  }
  if (opt.final_from >= 0 && g_rank >= opt.final_from) {
    struct Comm* w = &g_comms[0];
    call(ncclAllReduce((void*)w->send, (void*)w->recv, 1, ncclFloat32, ncclSum, w->comm, stream), w->comm,
         "final ncclAllReduce");
    sync_stream(stream); /* nobody else issues it: it waits until the launcher's timeout */
  }
  for (k = 0; k < g_ncomms; ++k) NCCLCHECK(ncclCommDestroy(g_comms[k].comm));
  if (g_extra_comm) NCCLCHECK(ncclCommDestroy(g_extra_comm));
  printf("ok\n");
  return 0;
}
