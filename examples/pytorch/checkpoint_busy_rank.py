"""Field failure 1: rank 0 writes a checkpoint while every other rank waits in an all-gather.

    ncclwatch run -- torchrun --nproc-per-node 2 examples/pytorch/checkpoint_busy_rank.py

PyTorch alone: after 10 minutes (its default NCCL timeout) every rank prints "Watchdog caught
collective operation timeout ... OpType=_ALLGATHER_BASE" and the job dies: the checkpoint takes
BUSY_SECONDS (default 900, longer than that timeout). With ncclwatch, about 10 s after the
all-gather started, rank 1 reports a stall, every rank dumps, and `ncclwatch run` prints while
the job runs, as `ncclwatch analyze` does afterwards: rank_missing, culprit rank 0, which is
not inside NCCL, with rank 0's Python stack ending in save_checkpoint() below.

With BUSY_SECONDS=30 the save ends before PyTorch's timeout: the all-gather completes, the job
finishes, and the report reads no hang, with a stall_recovered line below it naming rank 0 and
save_checkpoint() as what the all-gather waited for.
"""
import os
import time

import torch
import torch.distributed as dist


def save_checkpoint(step):
    # Stands in for torch.save(model.state_dict(), "model.safetensors") on a slow file system.
    time.sleep(float(os.environ.get("BUSY_SECONDS", "900")))


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    shard = torch.randn(1 << 20, device="cuda")
    full = torch.empty(shard.numel() * dist.get_world_size(), device="cuda")
    for step in range(200):
        dist.all_gather_into_tensor(full, shard)
        torch.cuda.synchronize()
        if step == 100 and rank == 0:
            save_checkpoint(step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
