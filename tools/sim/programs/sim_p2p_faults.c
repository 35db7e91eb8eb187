/* Point-to-point jobs with the faults ncclwatch must name pair by pair (docs/simulator.md).
 *   sim_p2p_faults --mode alltoall|pipeline|exchange [--steps N] [--count C] [--fault-at S] [fault]
 * Modes, one step each, then an all-reduce of the step's loss on the world and a stream sync:
 *   alltoall  every rank sends C float32 to every other rank and receives C from each, in one
 *             ncclGroupStart/End (an expert-parallel MoE token all-to-all)
 *   pipeline  stage r receives C float32 from stage r-1, then sends them to stage r+1 (no group)
 *   exchange  ranks 2k and 2k+1 swap C float32 in one group (a pipeline pair's forward/backward)
 * Faults, at step S (default 3; steps count from 1):
 *   --size-mismatch A B   rank A sends rank B C/2 elements (a stale capacity); B expects C
 *   --dtype-mismatch A B  rank A sends rank B C bfloat16; B expects C float32
 *   --missing-recv A B    rank B never posts its receive from rank A (A's send is unmatched)
 *   --recv-first          exchange: every rank posts its receive in a group of its own, then its
 *                         send in a second group, without waiting in between: both sides of a
 *                         pair receive first
 * --grouped-allreduce: alltoall: the step's all-reduce is issued inside the all-to-all's group
 * (a group mixing a collective and Send/Recv, as Megatron's interleaved schedule does).
 * The simulator's NCCL hangs a receive whose send has a different size, as NCCL does (its
 * send, a rendezvous, never completes either). Prints "ok" when every step completed. */
#include <string.h>
#include <unistd.h>

#include "simutil.h"

enum Mode { ALLTOALL, PIPELINE, EXCHANGE };

static const char kUsage[] =
    "usage: sim_p2p_faults --mode alltoall|pipeline|exchange [--steps N] [--count C] [--fault-at S]\n"
    "       [--size-mismatch A B | --dtype-mismatch A B | --missing-recv A B | --recv-first]\n"
    "       [--grouped-allreduce]\n";

int main(int argc, char** argv) {
  const int rank = simutil_env_int("RANK", 0), n = simutil_env_int("WORLD_SIZE", 1);
  int mode = ALLTOALL, steps = 6, fault_at = 3, i, step, p;
  size_t count = 1024;
  int size_a = -1, size_b = -1, dtype_a = -1, dtype_b = -1, miss_a = -1, miss_b = -1, recv_first = 0;
  int grouped_allreduce = 0;
  ncclUniqueId id;
  ncclComm_t comm;
  CUstream stream;
  CUdeviceptr sendbuf, recvbuf, loss;

  for (i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "--mode") == 0 && i + 1 < argc) {
      ++i;
      mode = strcmp(argv[i], "pipeline") == 0 ? PIPELINE : strcmp(argv[i], "exchange") == 0 ? EXCHANGE : ALLTOALL;
    } else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = atoi(argv[++i]);
    else if (strcmp(argv[i], "--count") == 0 && i + 1 < argc) count = (size_t)atoi(argv[++i]);
    else if (strcmp(argv[i], "--fault-at") == 0 && i + 1 < argc) fault_at = atoi(argv[++i]);
    else if (strcmp(argv[i], "--size-mismatch") == 0 && i + 2 < argc) {
      size_a = atoi(argv[++i]);
      size_b = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--dtype-mismatch") == 0 && i + 2 < argc) {
      dtype_a = atoi(argv[++i]);
      dtype_b = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--missing-recv") == 0 && i + 2 < argc) {
      miss_a = atoi(argv[++i]);
      miss_b = atoi(argv[++i]);
    } else if (strcmp(argv[i], "--recv-first") == 0) recv_first = 1;
    else if (strcmp(argv[i], "--grouped-allreduce") == 0) grouped_allreduce = 1;
    else {
      fputs(kUsage, stderr);
      return SIMUTIL_EXIT_USAGE;
    }
  }
  simutil_cuda_init(simutil_env_int("LOCAL_RANK", 0));
  simutil_exchange_id("world", rank, &id);
  NCCLCHECK(ncclCommInitRank(&comm, n, id, rank));
  CUCHECK(cuStreamCreate(&stream, 0));
  sendbuf = simutil_alloc((size_t)n * count * sizeof(float));
  recvbuf = simutil_alloc((size_t)n * count * sizeof(float));
  loss = simutil_alloc(sizeof(float));

  for (step = 1; step <= steps; ++step) {
    const int fault = step == fault_at;
    if (mode == ALLTOALL) {
      NCCLCHECK(ncclGroupStart());
      for (p = 0; p < n; ++p) {
        size_t c = count;
        ncclDataType_t t = ncclFloat32;
        if (p == rank) continue;
        if (fault && rank == size_a && p == size_b) c = count / 2;
        if (fault && rank == dtype_a && p == dtype_b) t = ncclBfloat16;
        NCCLCHECK(ncclSend((void*)(sendbuf + (size_t)p * count * sizeof(float)), c, t, p, comm, stream));
        if (!(fault && rank == miss_b && p == miss_a))
          NCCLCHECK(ncclRecv((void*)(recvbuf + (size_t)p * count * sizeof(float)), count, ncclFloat32, p, comm, stream));
      }
      if (grouped_allreduce)
        NCCLCHECK(ncclAllReduce((const void*)loss, (void*)loss, 1, ncclFloat32, ncclSum, comm, stream));
      NCCLCHECK(ncclGroupEnd());
    } else if (mode == PIPELINE) {
      if (rank > 0 && !(fault && rank == miss_b && rank - 1 == miss_a))
        NCCLCHECK(ncclRecv((void*)recvbuf, count, ncclFloat32, rank - 1, comm, stream));
      if (rank + 1 < n) {
        size_t c = count;
        ncclDataType_t t = ncclFloat32;
        if (fault && rank == size_a && rank + 1 == size_b) c = count / 2;
        if (fault && rank == dtype_a && rank + 1 == dtype_b) t = ncclBfloat16;
        NCCLCHECK(ncclSend((void*)sendbuf, c, t, rank + 1, comm, stream));
      }
    } else {
      const int peer = rank ^ 1;
      if (peer < n) {
        size_t c = count;
        ncclDataType_t t = ncclFloat32;
        if (fault && rank == size_a && peer == size_b) c = count / 2;
        if (fault && rank == dtype_a && peer == dtype_b) t = ncclBfloat16;
        if (fault && recv_first) {
          NCCLCHECK(ncclGroupStart());
          NCCLCHECK(ncclRecv((void*)recvbuf, count, ncclFloat32, peer, comm, stream));
          NCCLCHECK(ncclGroupEnd());
          NCCLCHECK(ncclGroupStart());
          NCCLCHECK(ncclSend((void*)sendbuf, c, t, peer, comm, stream));
          NCCLCHECK(ncclGroupEnd());
        } else {
          NCCLCHECK(ncclGroupStart());
          NCCLCHECK(ncclSend((void*)sendbuf, c, t, peer, comm, stream));
          if (!(fault && rank == miss_b && peer == miss_a))
            NCCLCHECK(ncclRecv((void*)recvbuf, count, ncclFloat32, peer, comm, stream));
          NCCLCHECK(ncclGroupEnd());
        }
      }
    }
    if (!(grouped_allreduce && mode == ALLTOALL))
      NCCLCHECK(ncclAllReduce((const void*)loss, (void*)loss, 1, ncclFloat32, ncclSum, comm, stream));
    CUCHECK(cuStreamSynchronize(stream));
  }
  NCCLCHECK(ncclCommDestroy(comm));
  printf("ok\n");
  fflush(stdout);
  return 0;
}
