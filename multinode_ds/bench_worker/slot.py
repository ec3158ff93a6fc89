"""The child process: one slot, from the work file to its result (load, warm up, ready, wait for the go,
measure, write the result); any failure ends it with exit status 1 and the reason as the log's last line."""
from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from pathlib import Path

from .engines import Engine, choose_engine, load_engine, registry_spec, resolve_device, vllm_installed
from .loadgen import LoadGenPlan, choose_loadgen, expected_qps
from .protocol import BenchError, Paths, file_appeared, say, write_json
from .runner import Progress, Runner, Tally, measure, slot_result
from .work import find_slot, read_work

POLL_S = 0.1


def set_threads() -> int:
    """torch's intra-op threads from OMP_NUM_THREADS (set by the node process); the count in use."""
    import torch

    threads = int(os.environ.get("OMP_NUM_THREADS") or 0)
    if threads > 0:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def wait_for_go(go: Path, timeout_s: float, poll_s: float = POLL_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not file_appeared(go):
        if time.monotonic() > deadline:
            raise BenchError(f"no {go} after {timeout_s:.0f} s: the other slots did not get ready (see their logs "
                             f"under {go.parent / 'logs'} and the node logs), or the driver stopped. Raise "
                             f"start_timeout_s if loading the model takes longer.")
        time.sleep(poll_s)


def die_with_parent() -> None:
    """Linux: TERM this slot when its node process dies, even by SIGKILL (nothing is left running)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the node process died before the line above
        raise SystemExit(143)


def slot_main(args) -> int:
    where = f"bench_worker: host {args.host} slot {args.slot} (phase {args.phase})"
    die_with_parent()
    try:
        run_slot(args)
    except BenchError as exc:
        print(f"{where}: {exc}", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:  # pylint: disable=broad-except  # the log must end with what went wrong
        traceback.print_exc()
        print(f"{where} failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


def prepare(args, work: dict, entry: dict) -> tuple[Engine, dict, tuple[bool, str]]:
    """Checks and loading before the go: the engine, the result's fields that describe the slot, and
    whether LoadGen is used (and why)."""
    if not work["model_path"] and work["engine"] != "vllm":
        registry_spec(work["model"])  # an unknown model fails here, before torch is imported
    loadgen = choose_loadgen(work["loadgen"])
    threads = set_threads()
    device = resolve_device(work["device"])
    engine_name, reason = choose_engine(work["engine"], device, work["model_path"], vllm_installed())
    t0 = time.perf_counter()
    engine = load_engine(engine_name, work, device)
    engine.validate([work["prompts"][i] for i in entry["samples"]])
    say(f"slot {args.slot}: engine {engine_name} ({reason}), device {device}, dtype {engine.dtype}, "
        f"{threads} torch threads, model {work['model']} loaded in {time.perf_counter() - t0:.1f} s")
    ctx = {"host": args.host, "slot": args.slot, "local_slot": entry["local_slot"], "phase": args.phase,
           "engine": engine_name, "engine_reason": reason, "device": device, "dtype": engine.dtype,
           "model": work["model"], "model_path": work["model_path"], "max_new_tokens": int(work["max_new_tokens"]),
           "torch_threads": threads, "assigned": len(entry["samples"])}
    return engine, ctx, loadgen


def warm_up(engine: Engine, prompts: list[str], samples: list[int]) -> float:
    """Run the slot's first sample once (or the first prompt when the slot has none); the seconds it took."""
    if not prompts:
        return 0.0
    t0 = time.perf_counter()
    engine.infer(prompts[samples[0] if samples else 0])
    return time.perf_counter() - t0


def report(args, tally: Tally, wall: float, ctx: dict, loadgen: dict) -> None:
    rate = 1.0 / wall if wall > 0 else 0.0
    say(f"slot {args.slot} ({args.host}, {args.phase}): {tally.samples} samples in {wall:.3f} s: "
        f"{tally.samples * rate:.2f} samples/s, {tally.generated_tokens * rate:.1f} tokens/s "
        f"(engine {ctx['engine']}, LoadGen {(loadgen.get('result') or 'used') if loadgen['used'] else 'not used'})")


def run_slot(args) -> None:
    """One slot, from the work file to its result.  The result document's keys: host, slot, local_slot,
    phase, engine, engine_reason, device, dtype, model, model_path, max_new_tokens, torch_threads,
    assigned (samples in the work file), samples (samples run: more than assigned when LoadGen repeats
    indexes), prompt_tokens, generated_tokens, decode_tokens, wall_s, prefill_s and decode_s (sums), latencies_s (one
    per sample run), started and finished (epoch s), warmup_s, and loadgen: used, reason, dir,
    summary_file, plus when used issued, result (VALID/INVALID), expected_qps, min_query_count and
    min_duration_ms."""
    work = read_work(args.work)
    entry = find_slot(work, args.host, args.phase, args.slot)
    paths = Paths(Path(work["out_dir"]), args.phase, args.slot)
    samples = list(entry["samples"])
    engine, ctx, (use_lg, lg_reason) = prepare(args, work, entry)
    warm = warm_up(engine, work["prompts"], samples)
    plan = None
    if use_lg and samples:
        plan = LoadGenPlan(paths.loadgen_dir, expected_qps(warm), int(work["loadgen_min_duration_ms"]))
    elif use_lg:
        lg_reason = "no samples in this slot"
    progress = Progress(paths.progress, args.host, args.slot, len(samples))
    write_json(paths.ready, {"host": args.host, "slot": args.slot, "pid": os.getpid(), "warmup_s": warm})
    say(f"slot {args.slot}: warm-up {warm:.3f} s; ready, waiting for {paths.go}")
    wait_for_go(paths.go, float(work["start_timeout_s"]))
    progress.update(force=True)
    runner = Runner(engine, work["prompts"], progress)
    started, wall, details = measure(runner, samples, plan)
    loadgen = {"used": plan is not None, "reason": lg_reason, "dir": str(plan.outdir) if plan else None,
               "summary_file": None, **(details or {})}
    write_json(paths.result, {**slot_result(ctx, runner.tally, started, wall, loadgen), "warmup_s": warm})
    report(args, runner.tally, wall, ctx, loadgen)
