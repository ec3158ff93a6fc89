"""A user's DeepSpeed script, shipped with -e workdir: it imports helper.py and reads data/ from its directory.

    deepspeed train.py --deepspeed_config ds_config.json [--steps N] [--data FILE] [--inline-batch N]
        [--probe-workspace]

--inline-batch N builds its own config dict with train_batch_size N (no --deepspeed_config): a config mistake made in
the script, which only DeepSpeed finds, after launch. --probe-workspace: each rank writes a file in its working
directory and tries one in data/ (the read-only workspace), and says which it could.
"""
import argparse
import os
import socket

import deepspeed
import torch
import torch.distributed as dist

import helper


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--inline-batch", type=int, default=0)
    parser.add_argument("--data", default="data/points.txt")
    parser.add_argument("--probe-workspace", action="store_true")
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model = helper.model()
    config = None
    if args.inline_batch:
        config = {"train_batch_size": args.inline_batch, "train_micro_batch_size_per_gpu": 4,
                  "gradient_accumulation_steps": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.01}}}
    engine, _opt, loader, _sched = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(),
                                                        training_data=helper.Points(args.data), config=config)
    step = 0
    while step < args.steps:
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            engine.step()
            if not engine.is_gradient_accumulation_boundary():
                continue
            step += 1
            if engine.monitor.enabled:
                engine.monitor.write_events([("Train/Samples/train_loss", loss.item(), engine.global_samples)])
            print(f"workdir-script rank {rank}/{world} on {socket.gethostname()} in {os.getcwd()} step {step} "
                  f"loss {loss.item():.4f}", flush=True)
            if step >= args.steps:
                break
    dist.barrier()
    if args.probe_workspace:
        probe(rank)


def probe(rank):
    """What a rank may write: its working directory (collected with the run), not the workspace (read-only)."""
    with open(f"out-rank{rank}.txt", "w") as fh:
        fh.write(f"rank {rank} wrote this\n")
    try:
        with open(os.path.join("data", f"probe-rank{rank}.txt"), "w") as fh:
            fh.write("x\n")
        print(f"workspace writable for rank {rank}", flush=True)
    except PermissionError:
        print(f"workspace read-only for rank {rank}", flush=True)


if __name__ == "__main__":
    main()
