"""Field failure 4: a straggler. Rank 1 is 15 s late at one step; the job does not hang, it
recovers.

    ncclwatch run -- torchrun --nproc-per-node 2 examples/pytorch/straggler.py

With ncclwatch: rank 0 reports a stall after about 10 s (the adaptive deadline: its
all-reduces took milliseconds so far), every rank dumps, `analyze` names rank 1 (rank_missing,
in time.sleep below), and when rank 1 arrives rank 0 writes a `recovery` dump: "AllReduce seq
N completed after 15.0 s". The job finishes normally, with its normal exit status.
"""
import os
import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    x = torch.ones(1024, device="cuda")
    for step in range(60):
        if step == 30 and rank == 1:
            time.sleep(15)  # a slow data loader, a page-cache miss, a noisy neighbour
        dist.all_reduce(x)
        torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
