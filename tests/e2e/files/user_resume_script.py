"""A user's own DeepSpeed script that survives a restart: it saves to MULTINODE_DS_CHECKPOINT_DIR every 2 steps and,
on a later attempt, loads MULTINODE_DS_RESUME_TAG (the newest whole checkpoint) and goes on from its step."""
import argparse
import os
import socket
import time

import deepspeed
import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    engine = deepspeed.initialize(
        model=model, model_parameters=model.parameters(),
        config={"train_micro_batch_size_per_gpu": 4, "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
                "zero_optimization": {"stage": 0}})[0]
    # The five lines a script needs to resume where the run's last attempt left off:
    ckpt_dir, tag, start = os.environ["MULTINODE_DS_CHECKPOINT_DIR"], os.environ.get("MULTINODE_DS_RESUME_TAG"), 0
    if tag:
        start = engine.load_checkpoint(ckpt_dir, tag=tag)[1]["step"]
        print(f"user-script rank {rank} resumed from {tag} at step {start}", flush=True)
    gen = torch.Generator().manual_seed(rank)
    w = torch.arange(8, dtype=torch.float32) / 8
    for step in range(start, args.steps):
        x = torch.randn(4, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(engine(x), (x @ w).unsqueeze(1))
        engine.backward(loss)
        engine.step()
        time.sleep(0.3)
        print(f"user-script rank {rank}/{world} on {socket.gethostname()} step {step + 1} loss {loss.item():.4f}",
              flush=True)
        if (step + 1) % 2 == 0:
            engine.save_checkpoint(ckpt_dir, tag=f"step{step + 1}", client_state={"step": step + 1})
    dist.barrier()


if __name__ == "__main__":
    main()
