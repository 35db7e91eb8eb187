/* One process drives several devices (nccl-tests -g N, JAX, single-process multi-GPU code):
 * each of P processes (simlaunch -n P) drives G devices, one rank each: global rank
 * process*G + device. The ranks are created in one group (G ncclCommInitRank calls between
 * ncclGroupStart/End, sharing one unique id), or with ncclCommInitAll (--init-all, one process).
 * Each step is one group of G all-reduces on G streams, one per device (the device's primary
 * context current for its calls), then a wait on every stream.
 *
 * The process index is SIM_PROC when set (a job run without RANK in its environment), else
 * RANK; the process count SIM_PROCS, else WORLD_SIZE. */
#include <pthread.h>
#include <stdint.h>

#include "simutil.h"

#define MAX_DEVICES 16

static const char* kUsage =
    "usage: sim_multi_gpu [options]\n"
    "  --gpus G            devices (ranks) per process (default 4)\n"
    "  --steps N           steps (default 20); --step-ms M sleep between steps (default 10)\n"
    "  --init-all          ncclCommInitAll (one process) instead of G ncclCommInitRank in a group\n"
    "  --stuck P:D:S       process P, device D: before step S its stream gets a kernel that never\n"
    "                      ends (the device never reaches the group's all-reduce)\n"
    "  --busy P:S          process P is busy in host code from step S on (every rank it drives\n"
    "                      misses the step's all-reduce)\n"
    "  --mismatch P:D:S    process P, device D: step S's all-reduce has another count\n"
    "  --no-rank-env       remove RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK from\n"
    "                      the environment before the first CUDA or NCCL call (JAX, nccl-tests)\n";

struct Fault {
  int proc, dev, step;
};

static int parse_fault(const char* s, int parts, struct Fault* f) {
  if (parts == 3) return sscanf(s, "%d:%d:%d", &f->proc, &f->dev, &f->step) == 3;
  f->dev = -1;
  return sscanf(s, "%d:%d", &f->proc, &f->step) == 2;
}

static void never_ends(void* arg) {
  (void)arg;
  for (;;) simutil_sleep_ms(1000);
}

static CUcontext device_context(int dev) {
  CUdevice d;
  CUcontext ctx;
  CUCHECK(cuDeviceGet(&d, dev));
  CUCHECK(cuDevicePrimaryCtxRetain(&ctx, d));
  return ctx;
}

int main(int argc, char** argv) {
  struct Fault stuck = {-1, -1, -1}, busy = {-1, -1, -1}, mismatch = {-1, -1, -1};
  int gpus = 4, steps = 20, step_ms = 10, init_all = 0, no_rank_env = 0, i, d, s, ndev = 0;
  int proc, nproc;
  ncclComm_t comms[MAX_DEVICES];
  CUcontext ctx[MAX_DEVICES];
  CUstream streams[MAX_DEVICES];
  CUdeviceptr bufs[MAX_DEVICES];
  const size_t count = 1024;

  for (i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--init-all")) {
      init_all = 1;
    } else if (!strcmp(a, "--no-rank-env")) {
      no_rank_env = 1;
    } else if (v && !strcmp(a, "--gpus")) {
      gpus = atoi(v), ++i;
    } else if (v && !strcmp(a, "--steps")) {
      steps = atoi(v), ++i;
    } else if (v && !strcmp(a, "--step-ms")) {
      step_ms = atoi(v), ++i;
    } else if (v && !strcmp(a, "--stuck") && parse_fault(v, 3, &stuck)) {
      ++i;
    } else if (v && !strcmp(a, "--busy") && parse_fault(v, 2, &busy)) {
      ++i;
    } else if (v && !strcmp(a, "--mismatch") && parse_fault(v, 3, &mismatch)) {
      ++i;
    } else {
      fputs(kUsage, stderr);
      return SIMUTIL_EXIT_USAGE;
    }
  }
  proc = simutil_env_int("SIM_PROC", simutil_env_int("RANK", 0));
  nproc = simutil_env_int("SIM_PROCS", simutil_env_int("WORLD_SIZE", 1));
  if (no_rank_env) {
    static const char* const kNames[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"};
    for (i = 0; i < (int)(sizeof kNames / sizeof kNames[0]); ++i) unsetenv(kNames[i]);
  }
  CUCHECK(cuInit(0));
  CUCHECK(cuDeviceGetCount(&ndev));
  if (gpus < 1 || gpus > MAX_DEVICES || gpus > ndev || (init_all && nproc != 1)) {
    fprintf(stderr, "sim_multi_gpu: --gpus %d with %d devices and %d processes%s\n", gpus, ndev, nproc,
            init_all ? " (--init-all needs one process)" : "");
    return SIMUTIL_EXIT_USAGE;
  }
  for (d = 0; d < gpus; ++d) ctx[d] = device_context(d);

  if (init_all) {
    NCCLCHECK(ncclCommInitAll(comms, gpus, NULL));
  } else {
    ncclUniqueId id;
    simutil_exchange_id("multi_gpu", proc, &id);
    NCCLCHECK(ncclGroupStart());
    for (d = 0; d < gpus; ++d) {
      CUCHECK(cuCtxSetCurrent(ctx[d]));
      NCCLCHECK(ncclCommInitRank(&comms[d], nproc * gpus, id, proc * gpus + d));
    }
    NCCLCHECK(ncclGroupEnd());
  }
  for (d = 0; d < gpus; ++d) {
    CUCHECK(cuCtxSetCurrent(ctx[d]));
    CUCHECK(cuStreamCreate(&streams[d], CU_STREAM_NON_BLOCKING));
    bufs[d] = simutil_alloc((count + 1) * sizeof(float));
  }
  printf("sim_multi_gpu: process %d of %d drives ranks %d-%d\n", proc, nproc, proc * gpus, proc * gpus + gpus - 1);
  fflush(stdout);

  for (s = 1; s <= steps; ++s) {
    if (proc == busy.proc && s >= busy.step)
      for (;;) simutil_sleep_ms(1000); /* busy in host code: never calls NCCL again */
    if (proc == stuck.proc && s == stuck.step) {
      CUCHECK(cuCtxSetCurrent(ctx[stuck.dev]));
      CUCHECK(cuLaunchHostFunc(streams[stuck.dev], never_ends, NULL));
    }
    NCCLCHECK(ncclGroupStart());
    for (d = 0; d < gpus; ++d) {
      size_t n = proc == mismatch.proc && d == mismatch.dev && s == mismatch.step ? count + 1 : count;
      CUCHECK(cuCtxSetCurrent(ctx[d]));
      NCCLCHECK(ncclAllReduce((void*)bufs[d], (void*)bufs[d], n, ncclFloat32, ncclSum, comms[d], streams[d]));
    }
    NCCLCHECK(ncclGroupEnd());
    for (d = 0; d < gpus; ++d) {
      CUCHECK(cuCtxSetCurrent(ctx[d]));
      CUCHECK(cuStreamSynchronize(streams[d]));
    }
    if (step_ms > 0) simutil_sleep_ms(step_ms);
  }
  for (d = 0; d < gpus; ++d) NCCLCHECK(ncclCommDestroy(comms[d]));
  printf("sim_multi_gpu: process %d done after %d steps\n", proc, steps);
  return 0;
}
