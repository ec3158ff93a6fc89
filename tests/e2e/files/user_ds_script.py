"""A user's own DeepSpeed script: its own model and loop, nothing from multinode_ds.

It runs unmodified under DeepSpeed's launcher: it reads LOCAL_RANK/RANK/WORLD_SIZE
from the environment the launcher sets, and prints one line per step.
"""
import argparse
import os
import socket

import deepspeed
import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    engine = deepspeed.initialize(
        model=model, model_parameters=model.parameters(),
        config={"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
                "zero_optimization": {"stage": 0}})[0]
    gen = torch.Generator().manual_seed(rank)
    w = torch.arange(8, dtype=torch.float32) / 8
    for step in range(args.steps):
        x = torch.randn(4, 8, generator=gen)
        y = (x @ w).unsqueeze(1)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        print(f"user-script rank {rank}/{world} on {socket.gethostname()} step {step + 1} loss {loss.item():.4f}",
              flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{rank}.done"), "w") as fh:
        fh.write(f"{socket.gethostname()} {world}\n")
    dist.barrier()


if __name__ == "__main__":
    main()
