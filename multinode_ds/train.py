"""The bundled trainer: ``python -m multinode_ds.train`` under DeepSpeed's launcher.

Every rank writes one JSON line per step to ``<run-dir>/metrics/rank<N>.jsonl``
(loss, learning rate, step time, samples/s, tokens/s, rank, host) and a final
``{"event": "done"}`` line; rank 0 prints a progress line every few steps.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

from . import checkpoints, exit_after_work
from . import data as data_mod
from . import ds_config as dsc
from .models import REGISTRY, build_model, get_spec


def parse_args(argv=None):
    return parser().parse_args(argv)


def parser():
    """The trainer's options (the plan's PLANNED_OPTIONS and TRAINER_OPTIONS name every one of them)."""
    # No abbreviations: "--checkpoint-d" must not quietly mean --checkpoint-dir (the plan sets it; args must not).
    p = argparse.ArgumentParser(prog="python -m multinode_ds.train", description=__doc__, allow_abbrev=False)
    p.add_argument("--model", default="llama-tiny", choices=sorted(REGISTRY))
    p.add_argument("--run-dir", required=True, help="the run's directory, on storage every node shares")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=1,
                   help="micro-batches per step on each rank: a run on fewer nodes keeps its global batch (rank r "
                        "takes the micro-batches ranks r*N..r*N+N-1 of the N times larger world had)")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--data", action="append", default=[], help=".txt/.jsonl file or directory (repeatable)")
    p.add_argument("--dataset", default=None,
                   help="a Hugging Face dataset, NAME[:SPLIT] (needs the datasets package and the hub)")
    p.add_argument("--model-path", default=None,
                   help="pretrained weights: a local directory (on shared storage) or a Hugging Face hub id; "
                        "the token comes from HF_TOKEN_PATH, never from the command line")
    p.add_argument("--ds-config", help="a user's DeepSpeed JSON, merged over the generated config")
    p.add_argument("--device-memory-gib", type=float, default=None)
    p.add_argument("--bf16", action="store_true", help="the devices support bf16")
    p.add_argument("--save-interval", type=int, default=0, help="checkpoint every N steps (0: only at the end)")
    p.add_argument("--checkpoint-dir", default=None, help="default: <run-dir>/checkpoints")
    p.add_argument("--resume", action="store_true", help="resume from the newest checkpoint")
    p.add_argument("--resume-if-any", action="store_true",
                   help="resume from the newest whole checkpoint when there is one, else start from step 0 (a "
                        "run's later attempts)")
    p.add_argument("--print-every", type=int, default=5)
    p.add_argument("--dry-run", action="store_true",
                   help="check model, data, config and memory; print the plan as JSON; train nothing")
    p.add_argument("--world-size", type=int, default=1, help="with --dry-run: the ranks the run will have")
    p.add_argument("--memory-gib", type=float, default=None,
                   help="with --dry-run: memory per rank (device memory on GPUs, host memory on CPU)")
    p.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    return p


class PlanError(ValueError):
    """The run cannot work as asked; the message says why and what to do."""


def option_problems(args, spec) -> list:
    """The trainer's numeric options (``-e args=...``), each that cannot work with its fix."""
    problems = []
    positions = spec.config.get("n_positions") or spec.config.get("max_position_embeddings")
    for option, value, low in (("--micro-batch", args.micro_batch, 1), ("--seq-len", args.seq_len, 2),
                               ("--warmup", args.warmup, 0), ("--print-every", args.print_every, 1),
                               ("--seed", args.seed, 0), ("--save-interval", args.save_interval, 0)):
        if value < low:
            problems.append(f"{option} {value} must be at least {low}. Fix: -e args='{option} <{low} or more>'")
    if positions and args.seq_len > positions:
        problems.append(f"--seq-len {args.seq_len} is longer than {spec.name} can attend to ({positions} positions). "
                        f"Fix: -e args='--seq-len <at most {positions}>'")
    if not math.isfinite(args.lr) or args.lr <= 0 or args.lr >= 1:
        problems.append(f"--lr {args.lr} is not a learning rate (between 0 and 1). Fix: -e args='--lr 3e-4'")
    return problems


def plan(args) -> dict:
    """Check what can be checked without torch and return the run's plan."""
    spec = get_spec(args.model)
    for path in args.data:
        if not Path(path).exists():
            raise PlanError(f"data path {path} does not exist on this node. Fix: put the data on storage every "
                            f"node shares and pass its path with --data.")
    if args.ds_config:
        if not Path(args.ds_config).is_file():
            raise PlanError(f"DeepSpeed config {args.ds_config} does not exist. Fix: pass the path of a JSON file "
                            f"that every node can read.")
        dsc.load_override(args.ds_config)
    if args.model_path and not Path(args.model_path).exists() and args.model_path.startswith(("/", ".")):
        raise PlanError(f"model path {args.model_path} does not exist on this node. Fix: put the weights on "
                        f"the shared directory, or pass a Hugging Face hub id.")
    if args.steps < 1:
        raise PlanError(f"steps={args.steps}; a run needs at least one step. Fix: -e steps=30")
    problems = option_problems(args, spec)
    if problems:
        raise PlanError("; ".join(problems))
    resume = None
    if args.resume:
        try:
            resume = checkpoints.choose(checkpoint_dir(args))
        except checkpoints.CheckpointError as exc:
            raise PlanError(str(exc)) from None
        if resume["step"] >= args.steps:
            raise PlanError(f"resume=true from {resume['tag']} (step {resume['step']}) with steps={args.steps}: "
                            f"nothing left to train. Fix: -e steps=<more than {resume['step']}>")
    n_params = spec.n_params()
    on_cpu = os.environ.get("DS_ACCELERATOR", "") == "cpu" or args.device_memory_gib is None
    stage = 1 if on_cpu else 3
    need = dsc.estimate_bytes_per_rank(n_params, args.world_size, stage, bf16=not on_cpu,
                                       offload_optimizer=not on_cpu) / dsc.GIB
    out = {"model": spec.name, "family": spec.family, "n_params": n_params, "world_size": args.world_size,
           "zero_stage": stage, "estimated_gib_per_rank": round(need, 2), "memory_gib_per_rank": args.memory_gib,
           "resume": resume}
    if args.memory_gib is not None and need > args.memory_gib:
        raise PlanError(
            f"model {spec.name} ({n_params / 1e9:.2f}B parameters) needs about {need:.1f} GiB per rank for weights, "
            f"gradients and optimizer states over {args.world_size} ranks, but a rank has {args.memory_gib:.1f} GiB. "
            f"Fix: use a smaller model (-e model=llama-tiny on CPU nodes) or more ranks or GPUs.")
    return out


def checkpoint_dir(args) -> str:
    """Where the run's checkpoints are: ``--checkpoint-dir``, else ``<run-dir>/checkpoints``."""
    return args.checkpoint_dir or str(Path(args.run_dir) / "checkpoints")


class MetricsWriter:
    def __init__(self, run_dir: str, rank: int):
        d = Path(run_dir) / "metrics"
        d.mkdir(parents=True, exist_ok=True)
        self.path = d / f"rank{rank}.jsonl"
        self.fh = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict) -> None:
        self.fh.write(json.dumps(record, sort_keys=True) + "\n")
        self.fh.flush()

    def close(self) -> None:
        self.fh.close()


def load_model_and_tokenizer(spec, args):
    """Random-initialised ``spec`` with the byte tokenizer, or pretrained weights from ``--model-path``.

    A local directory or a hub id; the hub token is read by huggingface_hub from the file named in
    HF_TOKEN_PATH (written by train.yml from a vaulted variable), so it never appears in a command line
    or a log.
    """
    if not args.model_path:
        return build_model(spec, seed=args.seed), data_mod.ByteTokenizer()
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(args.model_path)
    try:
        tok = transformers.AutoTokenizer.from_pretrained(args.model_path)
        tokenizer = data_mod.HFTokenizer(tok)
    except (OSError, ValueError):
        if model.config.vocab_size < data_mod.ByteTokenizer.vocab_size:
            raise PlanError(f"{args.model_path} has no tokenizer and a vocabulary too small for bytes")
        tokenizer = data_mod.ByteTokenizer()
    return model, tokenizer


def node_name(run_dir, env=None) -> str:
    """This node's name as the user knows it: its inventory name, not the machine's hostname.

    The node's line in the run's hostfile (``<run_dir>/hostfile``, written from the inventory), picked by DeepSpeed's node rank
    (``CROSS_RANK``, the node's index in the hostfile, under pdsh as with --no_ssh) when DeepSpeed's
    node count (``CROSS_SIZE``) is the hostfile's; else the hostname (a launcher that fell back to
    the local node runs one node, whatever the hostfile says: its ranks then name the machine).
    """
    env = os.environ if env is None else env
    try:
        node_rank, nodes = int(env.get("CROSS_RANK", "")), int(env.get("CROSS_SIZE", ""))
        with open(Path(run_dir) / "hostfile", encoding="utf-8") as fh:
            names = [line.split()[0] for line in fh if line.strip() and not line.lstrip().startswith("#")]
        if nodes == len(names) and 0 <= node_rank < len(names):
            return names[node_rank]
    except (ValueError, OSError):
        pass
    return socket.gethostname()


def process_start_time() -> float:
    """When this process started (epoch seconds), from /proc; now where /proc is missing.

    Startup is measured from here, so it includes the imports and any op that
    DeepSpeed would JIT-compile at the first run.
    """
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat", encoding="ascii") as fh:
            btime = next(int(line.split()[1]) for line in fh if line.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


def dry_run(args) -> int:
    """``--dry-run``: print the plan as JSON (exit 0), or why the run cannot work (exit 2); nothing is trained."""
    try:
        print(json.dumps(plan(args), sort_keys=True))
    except (PlanError, ValueError) as exc:
        print(f"multinode_ds: {exc}", file=sys.stderr)
        return 2
    return 0


class Ranks(NamedTuple):
    """Where this process trains: its rank among the run's ranks, its node and its device."""

    rank: int
    world: int
    local_rank: int
    host: str
    on_cpu: bool
    device: Any


def wait_for_store(timeout: float = 60.0, interval: float = 0.02) -> bool:
    """A rank other than 0: wait until the run's store (``MASTER_ADDR:MASTER_PORT``, which rank 0 opens) takes a
    connection, trying every ``interval`` seconds.  torch's client tries a refused connection again only after a
    second or so, and the rank that finished its imports first (often not rank 0) waits that long; polling here
    joins as soon as the store listens.  False after ``timeout`` (torch's own connect then goes on and reports)."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if os.environ.get("RANK", "0") == "0" or not addr or not port.isdigit():
        return True
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((addr, int(port)), timeout=min(1.0, timeout)):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)


def join_ranks(run_dir) -> Ranks:
    """Join the run's process group (gloo on CPU, the accelerator's own backend otherwise) and take this rank's device."""
    import deepspeed
    import torch
    import torch.distributed as dist
    from deepspeed.accelerator import get_accelerator

    accel = get_accelerator()
    on_cpu = accel.device_name() == "cpu"
    wait_for_store()
    deepspeed.init_distributed(dist_backend="gloo" if on_cpu else accel.communication_backend_name())
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    host = node_name(run_dir)
    if not on_cpu:
        accel.set_device(local_rank)
    device = torch.device("cpu") if on_cpu else torch.device(accel.device_name(local_rank))
    return Ranks(rank, world, local_rank, host, on_cpu, device)


def training_texts(args) -> list:
    """The documents to train on: the Hugging Face dataset, else the ``--data`` files, else the bundled corpus."""
    if args.dataset:
        return data_mod.hf_dataset_texts(args.dataset)
    if args.data:
        return data_mod.read_texts(args.data)
    return [d for d in data_mod.bundled_corpus().split("\n\n") if d.strip()]


def device_capabilities(args, ranks) -> tuple:
    """(memory per device in GiB, bf16 support): the options as given, where a GPU fills in what they leave open."""
    import torch

    memory_gib, bf16 = args.device_memory_gib, args.bf16
    if not ranks.on_cpu and torch.cuda.is_available():
        # What the device really has, unless the user said otherwise.
        if memory_gib is None:
            memory_gib = torch.cuda.get_device_properties(ranks.local_rank).total_memory / dsc.GIB
        bf16 = bf16 or torch.cuda.is_bf16_supported()
    return memory_gib, bf16


def deepspeed_config(args, ranks, n_params) -> dict:
    """The DeepSpeed config generated for the model, the ranks and their devices, with ``--ds-config`` merged over it."""
    memory_gib, bf16 = device_capabilities(args, ranks)
    config = dsc.generate(n_params, ranks.world, accelerator="cpu" if ranks.on_cpu else "gpu",
                          device_memory_gib=memory_gib, bf16_capable=bf16, micro_batch=args.micro_batch,
                          grad_accum=max(1, args.grad_accum), run_dir=args.run_dir)
    if getattr(args, "load_universal", False):
        # A checkpoint of another world size, converted by DeepSpeed's ds_to_universal (universal_resume).
        config["checkpoint"] = {"load_universal": True}
    if args.ds_config:
        config = dsc.merge(config, dsc.load_override(args.ds_config))
    return config


def deepspeed_builds_optimizer(config) -> bool:
    """Whether DeepSpeed builds the optimizer: the config offloads it (ZeRO-Offload's CPU optimizer) or names one."""
    return "offload_optimizer" in config.get("zero_optimization", {}) or "optimizer" in config


def describe_optimizer(config, lr, warmup) -> dict:
    """The trainer's AdamW and linear warmup in DeepSpeed's terms, where the config names none of its own."""
    config.setdefault("optimizer", {"type": "AdamW", "params": {
        "lr": lr, "betas": [0.9, 0.95], "weight_decay": 0.01}})
    config.setdefault("scheduler", {"type": "WarmupLR", "params": {
        "warmup_min_lr": 0, "warmup_max_lr": lr, "warmup_num_steps": warmup}})
    return config


def build_engine(args, model, config):
    """The DeepSpeed engine around ``model``: DeepSpeed's optimizer where the config wants it, else torch's AdamW
    with a linear warmup over ``--warmup`` steps."""
    import deepspeed
    import torch

    if "activation_checkpointing" in config and hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable()
    warmup = max(1, args.warmup)
    if deepspeed_builds_optimizer(config):
        # ZeRO-Offload wants DeepSpeed's own CPU optimizer: describe it in the config.
        describe_optimizer(config, args.lr, warmup)
        return deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)[0]
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    return deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                config=config)[0]


def build_training(args, ranks) -> tuple:
    """The model, its data cut into blocks and the engine around them: (spec, parameters, blocks, engine).

    Rank 0 keeps the DeepSpeed config the run has in ``<run-dir>/ds_config.json``.
    """
    spec = get_spec(args.model)
    model, tokenizer = load_model_and_tokenizer(spec, args)
    blocks = data_mod.make_blocks(training_texts(args), tokenizer, args.seq_len)
    n_params = sum(p.numel() for p in model.parameters())
    config = deepspeed_config(args, ranks, n_params)
    engine = build_engine(args, model, config)
    if ranks.rank == 0:
        with open(Path(args.run_dir) / "ds_config.json", "w", encoding="utf-8") as fh:
            json.dump(config, fh, indent=2, sort_keys=True)
    return spec, n_params, blocks, engine


def universal_resume(args, ckpt_dir, ranks):
    """Where to load from when the checkpoint to resume was written by another number of ranks (its ZeRO optimizer
    states are partitioned by them, and DeepSpeed refuses it): rank 0 converts it once with DeepSpeed's own
    ``ds_to_universal`` into ``<checkpoint-dir>.universal/<tag>``, every rank waits for it, and the engine then
    loads it with ``checkpoint.load_universal``.  None: a plain load (or nothing to resume)."""
    import subprocess
    import torch.distributed as dist

    if not (args.resume or args.resume_if_any):
        return None
    try:
        tag = checkpoints.choose(ckpt_dir, own_run(args))["tag"]
    except checkpoints.CheckpointError:
        return None
    saved = checkpoints.dp_world(Path(ckpt_dir) / tag)
    if saved in (None, ranks.world):
        return None
    out = Path(str(ckpt_dir) + ".universal")
    source = Path(ckpt_dir) / tag
    if ranks.rank == 0 and not checkpoints.conversion_current(out / tag, source):
        print(f"multinode_ds: {tag} was saved by {saved} ranks, this run has {ranks.world}: converting it with "
              f"DeepSpeed's ds_to_universal into {out / tag}", flush=True)
        # A conversion of another run's tag of the same name, or one cut short, is made again.
        shutil.rmtree(out / tag, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                        str(source), "--output_folder", str(out / tag), "--inject_missing_state",
                        "--num_extract_workers", "1", "--num_merge_workers", "1"], check=True)
        checkpoints.record_conversion(out / tag, source)
    dist.barrier()
    return str(out)


def resume_checkpoint(args, engine, ckpt_dir, rank, load_dir=None) -> tuple:
    """With ``--resume``, load the checkpoint the dry run chose too: (the step to go on from, the choice);
    without it, (0, None).  ``load_dir``: where its universal form is (universal_resume), else None."""
    if not (args.resume or args.resume_if_any):
        return 0, None
    # The same choice as the dry run's: latest when it is whole, else the newest whole tag.
    try:
        resumed = checkpoints.choose(ckpt_dir, own_run(args))
    except checkpoints.CheckpointError as exc:
        if args.resume:
            raise
        if rank == 0:
            print(f"multinode_ds: no whole checkpoint to resume from, starting from step 0 ({exc})", flush=True)
        return 0, None
    if rank == 0:
        for skip in resumed["skipped"]:
            print(f"multinode_ds: skipping checkpoint {skip['tag']}: {skip['why']}", flush=True)
    load_path, client = engine.load_checkpoint(load_dir or ckpt_dir, tag=resumed["tag"])
    if load_dir:
        resumed["universal"] = load_dir
    if load_path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {resumed['tag']} from {ckpt_dir}")
    start_step = int((client or {}).get("step", resumed["step"]))
    if rank == 0:
        print(f"multinode_ds: resumed from {load_path} at step {start_step}", flush=True)
    return start_step, resumed


def start_record(ranks, model, n_params, start_step, resumed) -> dict:
    """The metrics line a rank writes before its first step: where it runs, what it trains, where it starts."""
    return {"event": "start", "rank": ranks.rank, "local_rank": ranks.local_rank, "world_size": ranks.world,
            "host": ranks.host, "machine": socket.gethostname(),
            "model": model, "n_params": n_params, "start_step": start_step, "time": time.time(),
            "resumed_from": resumed and resumed["tag"],
            "skipped_checkpoints": resumed and resumed["skipped"],
            "process_start": process_start_time(),
            # "warm" (forked from the node's warm process), "cold", or "cold: why" (multinode_ds.rank, .warm).
            "started": os.environ.get("MULTINODE_DS_START") or "cold"}


def step_record(args, ranks, done, loss, loss_local, lr, step_time, compute=None) -> dict:
    """The metrics line of step ``done`` (counted from 1): the loss averaged over the ranks, this rank's, the rates,
    and ``compute``, this rank's own work outside collectives in the step (its forward passes), which the watch
    compares across ranks to name a straggler (module_utils/run/stragglers.py)."""
    accum = max(1, getattr(args, "grad_accum", 1))
    tokens_per_step = args.micro_batch * args.seq_len * ranks.world * accum
    return {
        "event": "step", "step": done, "total_steps": args.steps, "loss": loss,
        "loss_local": loss_local, "lr": lr, "step_time": step_time, "compute": compute,
        "samples_per_sec": args.micro_batch * ranks.world * accum / step_time,
        "tokens_per_sec": tokens_per_step / step_time,
        "rank": ranks.rank, "local_rank": ranks.local_rank, "world_size": ranks.world, "host": ranks.host,
        "time": time.time(),
    }


def progress_due(done, steps, every) -> bool:
    """Whether rank 0 prints a progress line after ``done`` steps: every ``every`` steps, and after the last."""
    return done % every == 0 or done == steps


def progress_line(rec, elapsed, steps_run) -> str:
    """Rank 0's progress line after a step: the time left is the pace of the ``steps_run`` so far."""
    eta = elapsed / steps_run * (rec["total_steps"] - rec["step"])
    return (f"multinode_ds: step {rec['step']}/{rec['total_steps']} loss {rec['loss']:.4f} "
            f"{rec['tokens_per_sec']:.0f} tok/s eta {eta:.0f}s")


def checkpoint_due(done, steps, interval) -> bool:
    """Whether to checkpoint after ``done`` steps: every ``interval`` steps (0: never); the last step's is the final save."""
    return bool(interval) and done % interval == 0 and done < steps


def run_steps(args, ranks, engine, blocks, metrics, ckpt_dir, start_step, t_start) -> float:
    """Train from ``start_step`` to ``--steps``: a metrics line per step, rank 0's progress lines, the checkpoints
    every ``--save-interval`` steps; the last loss averaged over the ranks (NaN when no step ran)."""
    import torch
    import torch.distributed as dist

    loss_val = float("nan")
    accum = max(1, getattr(args, "grad_accum", 1))
    sync = torch.cuda.synchronize if getattr(ranks.device, "type", "cpu") == "cuda" else (lambda: None)
    asked = {"path": os.path.join(args.run_dir, "control", "SAVE"), "done": False, "looked": 0.0}
    for step in range(start_step, args.steps):
        t0 = time.time()
        local = compute = 0.0
        # With --grad-accum N, rank r takes the micro-batches of ranks r*N..r*N+N-1 of a world N times larger.
        for micro in range(accum):
            batch = data_mod.rank_batches(blocks, ranks.rank * accum + micro, ranks.world * accum, args.micro_batch,
                                          args.seed, step)
            ids = torch.tensor(batch, dtype=torch.long, device=ranks.device)
            # The forward pass is this rank's own work (no collective below ZeRO stage 3): timed, on a GPU to the
            # end of its kernels.
            sync()
            c0 = time.perf_counter()
            out = engine(input_ids=ids, labels=ids)
            sync()
            compute += time.perf_counter() - c0
            engine.backward(out.loss)
            engine.step()
            local += out.loss.detach().float().item() / accum
        # The loss summed over the ranks, and whether the watch asked for a checkpoint (rank 0 looks): one collective.
        summed = torch.tensor([local, 1.0 if ranks.rank == 0 and save_asked(asked, time.time()) else 0.0])
        dist.all_reduce(summed)
        loss_val = summed[0].item() / ranks.world
        save_now = summed[1].item() > 0 and not asked["done"]
        asked["done"] = asked["done"] or save_now
        dt = time.time() - t0
        rec = step_record(args, ranks, step + 1, loss_val, local, engine.get_lr()[0], dt, compute)
        metrics.write(rec)
        monitor_loss(engine, loss_val)
        if ranks.rank == 0 and progress_due(step + 1, args.steps, args.print_every):
            print(progress_line(rec, time.time() - t_start, step + 1 - start_step), flush=True)
        if checkpoint_due(step + 1, args.steps, args.save_interval) or (save_now and step + 1 < args.steps):
            save(engine, ckpt_dir, step + 1, ranks, metrics)
            if save_now and ranks.rank == 0:
                save_answered(asked["path"], step + 1)
    return loss_val


def save_asked(asked, now, every=1.0):
    """Whether the run's ``control/SAVE`` exists (the watch asks for a checkpoint, e.g. before it moves the run off a
    straggler): looked for at most once every ``every`` seconds, and never again once a save answered it
    (``asked``: ``{"path", "done", "looked"}``)."""
    if asked["done"] or now - asked["looked"] < every:
        return False
    asked["looked"] = now
    return os.path.exists(asked["path"])


def save_answered(asked_path, step) -> None:
    """``control/SAVED`` beside the watch's ``control/SAVE``: the step of the checkpoint that answered it, written
    once every rank has saved it (``save`` ends with a barrier).  The watch reads it, not the ranks' metrics, whose
    save records a poll may not see among a fast run's last lines."""
    path = os.path.join(os.path.dirname(asked_path), "SAVED")
    part = path + ".part"
    with open(part, "w") as fh:
        json.dump({"step": int(step), "time": time.time()}, fh)
    os.replace(part, path)


def monitor_loss(engine, loss) -> None:
    """The step's loss (averaged over the ranks) to DeepSpeed's monitor (-e tracking=tensorboard|csv|wandb|comet),
    beside the learning rate DeepSpeed logs itself, at the same x (samples seen): its engine logs no loss."""
    monitor = getattr(engine, "monitor", None)
    if monitor is not None and monitor.enabled:
        monitor.write_events([("Train/Samples/train_loss", loss, engine.global_samples)])


def save(engine, ckpt_dir, step, ranks, metrics=None) -> None:
    """DeepSpeed's checkpoint of ``step``, tagged ``<run id>-step<N>`` (checkpoints.tag_name: the checkpoint
    directory is the model's, and another run's tags are never overwritten) and marked by rank 0 with the run that
    saved it.  A ``save`` record before and after it (``metrics``): the watch gives a save under way its own
    allowance, learned from the saves before it, instead of calling the run hung."""
    import torch.distributed as dist

    run_id = os.environ.get("MULTINODE_DS_RUN_ID") or None
    tag = checkpoints.tag_name(step, run_id)
    t0 = time.time()
    if metrics is not None:
        metrics.write(save_record("begin", ranks, step, t0))
    engine.save_checkpoint(ckpt_dir, tag=tag, client_state={"step": step})
    if ranks.rank == 0 and run_id:
        checkpoints.mark_run(Path(ckpt_dir) / tag, run_id)
    dist.barrier()
    if metrics is not None:
        metrics.write(save_record("end", ranks, step, t0))


def save_record(phase, ranks, step, t0) -> dict:
    """The metrics line of a checkpoint save's ``phase`` (begin, end: with the save's seconds)."""
    now = time.time()
    rec = {"event": "save", "phase": phase, "step": step, "rank": ranks.rank, "host": ranks.host, "time": now}
    if phase == "end":
        rec["seconds"] = round(now - t0, 3)
    return rec


def own_run(args):
    """The run whose checkpoints a resume may load: a later attempt's (``--resume-if-any``) only its own run's;
    ``-e resume=true`` (``--resume``) any."""
    return os.environ.get("MULTINODE_DS_RUN_ID") if args.resume_if_any and not args.resume else None


def train(args) -> int:
    """Train on this rank: join the ranks, build the engine, resume, run the steps, save, write the final records."""
    import torch.distributed as dist

    ranks = join_ranks(args.run_dir)
    ckpt_dir = checkpoint_dir(args)
    load_dir = universal_resume(args, ckpt_dir, ranks)
    args.load_universal = load_dir is not None
    spec, n_params, blocks, engine = build_training(args, ranks)
    start_step, resumed = resume_checkpoint(args, engine, ckpt_dir, ranks.rank, load_dir)
    metrics = MetricsWriter(args.run_dir, ranks.rank)
    metrics.write(start_record(ranks, spec.name, n_params, start_step, resumed))
    if ranks.rank == 0:
        print(f"multinode_ds: training {spec.name} ({n_params / 1e6:.2f}M params) on {ranks.world} ranks, "
              f"steps {start_step}..{args.steps}", flush=True)
    t_start = time.time()
    loss_val = run_steps(args, ranks, engine, blocks, metrics, ckpt_dir, start_step, t_start)
    if args.steps > start_step:
        save(engine, ckpt_dir, args.steps, ranks, metrics)
    metrics.write({"event": "done", "rank": ranks.rank, "host": ranks.host, "steps": args.steps, "final_loss": loss_val,
                   "wall_time": time.time() - t_start, "time": time.time()})
    metrics.close()
    dist.barrier()
    print(f"multinode_ds: rank {ranks.rank} on {ranks.host} finished {args.steps} steps", flush=True)
    dist.destroy_process_group()
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    return train(args)


if __name__ == "__main__":
    exit_after_work(main())
