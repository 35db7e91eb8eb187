"""Field failure 4: stragglers. Rank 1 is 15 s late at one step, then a little late at every
step after it; the job never hangs.

    ncclwatch run -- torchrun --nproc-per-node 2 examples/pytorch/straggler.py

With ncclwatch: rank 0 reports a stall after about 10 s (the adaptive deadline: its
all-reduces took milliseconds so far), every rank dumps, and the verdict printed while the job
runs names rank 1 (rank_missing, in time.sleep below). When rank 1 arrives, rank 0 writes a
`recovery` dump: "AllReduce seq N completed after 15.0 s". The job finishes normally, with its
normal exit status, and no verdict follows the recovery. After it, `ncclwatch analyze` on the
dump directory says `no hang` and, below it, "Also noticed": "stall_recovered AllReduce #N ...
stalled 15.0 s ... waiting for rank 1 (busy in ...); it recovered", then "slow_rank rank 1 ...
collectives last: ~35 ms behind the others", with the line of this file where rank 1 issues them: the steady 20-50 ms
delay of the second half (host clocks are aligned from the collectives themselves, so this works
across nodes too).
"""
import os
import random
import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    x = torch.ones(1024, device="cuda")
    for step in range(120):
        if step == 30 and rank == 1:
            time.sleep(15)  # a slow data loader, a page-cache miss, a noisy neighbour
        if step > 30 and rank == 1:
            time.sleep(random.uniform(0.02, 0.05))  # then a slower host at every step
        dist.all_reduce(x)
        torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
