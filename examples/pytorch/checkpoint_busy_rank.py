"""Field failure 1: rank 0 writes a checkpoint while every other rank waits in an all-gather.

    ncclwatch run -- torchrun --nproc-per-node 2 examples/pytorch/checkpoint_busy_rank.py

PyTorch alone: after 10 minutes every rank prints "Watchdog caught collective operation
timeout ... OpType=_ALLGATHER_BASE" and the job dies. With ncclwatch, about 10 s after the
all-gather started, rank 1 reports a stall, every rank dumps, and `ncclwatch analyze` says:
rank_missing, culprit rank 0, which is not inside NCCL, with rank 0's Python stack ending in
save_checkpoint() below.
"""
import os
import time

import torch
import torch.distributed as dist


def save_checkpoint(step):
    # Stands in for torch.save(model.state_dict(), "model.safetensors") on a slow file system.
    time.sleep(float(os.environ.get("BUSY_SECONDS", "60")))


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
