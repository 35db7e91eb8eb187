"""Field failure 2: ranks issue different numbers of parameter all-gathers (ZeRO-3 generation
with different sequence lengths), so the collectives at one sequence number no longer match.

    ncclwatch run -- torchrun --nproc-per-node 2 examples/pytorch/zero3_divergent_allgathers.py

With ncclwatch: `ncclwatch analyze` says mismatch at the first differing sequence number:
rank 1 called AllGather where rank 0 called AllReduce, with the advice "call-count
divergence" (rank 1's op equals rank 0's next op), naming the minority and both call sites.
"""
import os

import torch
import torch.distributed as dist


def generate(tokens, params):
    # Each generated token gathers the (sharded) parameters once, as ZeRO-3 does.
    out = torch.empty(params.numel() * dist.get_world_size(), device="cuda")
    for _ in range(tokens):
        dist.all_gather_into_tensor(out, params)
    return out


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    params = torch.randn(1 << 16, device="cuda")
    loss = torch.ones(1, device="cuda")
    for step in range(10):
        # Rank 1 produces one more token at step 5: one more all-gather than everyone else.
        generate(3 + (1 if (rank == 1 and step == 5) else 0), params)
        dist.all_reduce(loss)
        torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
