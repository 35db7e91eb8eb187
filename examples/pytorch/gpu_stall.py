"""Field failure 3: the host enqueued the all-reduce, but earlier work on rank 1's GPU is stuck,
so its GPU never reaches the collective while the peers' GPUs wait inside it.

    ncclwatch run -- torchrun --nproc-per-node 2 examples/pytorch/gpu_stall.py

With ncclwatch: gpu_not_reached, culprit rank 1 (its AllReduce is `enqueued`, the others'
`gpu_reached`), with rank 1's call site in this file: printed by `ncclwatch run` while the job
runs, and by `ncclwatch analyze` afterwards. The stuck kernel spins SLEEP_CYCLES GPU cycles
(default 2e12, over 15 minutes at 2 GHz: longer than PyTorch's 10-minute timeout, which then
aborts the job). A kernel that finishes earlier (SLEEP_CYCLES=2e11, about two minutes) is a
stall that recovers: the job finishes and the report reads no hang, with a stall_recovered line
naming rank 1.
"""
import os

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    grad = torch.ones(1 << 20, device="cuda")
    for step in range(100):
        if step == 50 and rank == 1:
            torch.cuda._sleep(int(float(os.environ.get("SLEEP_CYCLES", "2e12"))))  # a kernel that hangs
        dist.all_reduce(grad)
        torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
