/* Two launches share one communicator (an RL trainer and a rollout engine started apart):
 * each launch (simlaunch -n N) has its own world communicator over its RANK 0..N-1, and every
 * process of both launches joins a shared weight-sync communicator of --shared-size ranks, in
 * which this launch's RANK r is shared rank --offset + r. The shared communicator's unique id
 * travels as a file in $SIM_SHARED_DIR (a directory both launches see; shared rank 0 writes it).
 * Each step: an all-reduce on the world communicator (training, or generating), then a
 * broadcast from shared rank 0 on the shared communicator (the weight sync). */
#include <stdint.h>

#include "simutil.h"

static const char* kUsage =
    "usage: sim_two_launches --offset K --shared-size N [options]\n"
    "  --offset K          this launch's RANK r is rank K + r of the shared communicator\n"
    "  --shared-size N     ranks in the shared communicator (every process of both launches)\n"
    "  --steps N           steps (default 20); --step-ms M sleep between steps (default 10)\n"
    "  --busy R:S          this launch's RANK R is busy in host code (generate_rollouts) before\n"
    "                      sync step S: it never enters the shared broadcast #S\n"
    "The shared id is exchanged through $SIM_SHARED_DIR (both launches must see it).\n";

/* The shared id: shared rank 0 publishes it in $SIM_SHARED_DIR, the others poll. */
static void exchange_shared_id(int shared_rank, ncclUniqueId* id) {
  const char* dir = getenv("SIM_SHARED_DIR");
  if (!dir || !*dir) {
    fprintf(stderr, "SIM_SHARED_DIR is not set\n");
    exit(SIMUTIL_EXIT_USAGE);
  }
  simutil_exchange_id_in(dir, "weight_sync", shared_rank, id);
}

/* Stuck generating: host code that never calls NCCL again (its own frame in the stacks). */
__attribute__((noinline)) static void generate_rollouts(void) {
  volatile uint64_t spins = 0;
  for (;;) {
    ++spins;
    if ((spins & 0xfffff) == 0) simutil_sleep_ms(1);
  }
}

int main(int argc, char** argv) {
  int offset = -1, shared_size = 0, steps = 20, step_ms = 10, busy_rank = -1, busy_step = -1, i, s;
  int rank = simutil_env_int("RANK", -1), world = simutil_env_int("WORLD_SIZE", 0);
  ncclUniqueId world_id, shared_id;
  ncclComm_t world_comm, shared_comm;
  CUstream stream;
  CUdeviceptr buf;
  const size_t count = 1024;

  for (i = 1; i < argc; ++i) {
    const char* a = argv[i];
    const char* v = i + 1 < argc ? argv[i + 1] : NULL;
    if (v && !strcmp(a, "--offset")) {
      offset = atoi(v), ++i;
    } else if (v && !strcmp(a, "--shared-size")) {
      shared_size = atoi(v), ++i;
    } else if (v && !strcmp(a, "--steps")) {
      steps = atoi(v), ++i;
    } else if (v && !strcmp(a, "--step-ms")) {
      step_ms = atoi(v), ++i;
    } else if (v && !strcmp(a, "--busy") && sscanf(v, "%d:%d", &busy_rank, &busy_step) == 2) {
      ++i;
    } else {
      fputs(kUsage, stderr);
      return SIMUTIL_EXIT_USAGE;
    }
  }
  if (rank < 0 || world <= 0 || offset < 0 || offset + world > shared_size) {
    fputs(kUsage, stderr);
    return SIMUTIL_EXIT_USAGE;
  }
  simutil_cuda_init(simutil_env_int("LOCAL_RANK", rank));
  simutil_exchange_id("world", rank, &world_id);
  NCCLCHECK(ncclCommInitRank(&world_comm, world, world_id, rank));
  exchange_shared_id(offset + rank, &shared_id);
  NCCLCHECK(ncclCommInitRank(&shared_comm, shared_size, shared_id, offset + rank));
  CUCHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  buf = simutil_alloc(count * sizeof(float));
  for (s = 0; s < steps; ++s) {
    NCCLCHECK(ncclAllReduce((void*)buf, (void*)buf, count, ncclFloat32, ncclSum, world_comm, stream));
    CUCHECK(cuStreamSynchronize(stream));
    if (rank == busy_rank && s >= busy_step) generate_rollouts();
    NCCLCHECK(ncclBroadcast((void*)buf, (void*)buf, count, ncclFloat32, 0, shared_comm, stream));
    CUCHECK(cuStreamSynchronize(stream));
    simutil_sleep_ms(step_ms);
  }
  NCCLCHECK(ncclCommDestroy(shared_comm));
  NCCLCHECK(ncclCommDestroy(world_comm));
  printf("launch rank %d (shared rank %d): %d steps\n", rank, offset + rank, steps);
  return 0;
}
