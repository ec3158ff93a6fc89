"""The slot runner: runs a slot's samples from the go, one at a time (plainly or under LoadGen), summing
times, tokens and latencies, keeping the progress file up to date, and making the slot's result document."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

from .engines import Engine, Sample
from .loadgen import LoadGenPlan, run_loadgen
from .protocol import write_json

PROGRESS_EVERY_S = 0.5


@dataclass
class Tally:
    """Sums over the samples run so far."""

    samples: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    decode_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    latencies_s: list[float] = field(default_factory=list)

    def add(self, s: Sample) -> None:
        self.samples += 1
        self.prompt_tokens += s.prompt_tokens
        self.generated_tokens += s.generated_tokens
        self.decode_tokens += s.decode_tokens
        self.prefill_s += s.prefill_s
        self.decode_s += s.decode_s
        self.latencies_s.append(s.prefill_s + s.decode_s)


class Progress:
    """``progress/<phase>-slot<N>.json``, rewritten at most every ``every`` seconds unless forced."""

    def __init__(self, path: Path | None, host: str, slot: int, total: int, every: float = PROGRESS_EVERY_S):
        self.path, self.host, self.slot, self.total, self.every = path, host, slot, total, every
        self.done = 0
        self.written = -math.inf

    def update(self, done: int | None = None, total: int | None = None, force: bool = False) -> None:
        if done is not None:
            self.done = done
        if total is not None:
            self.total = max(self.total, total)
        now = time.monotonic()
        if self.path is None or (not force and now - self.written < self.every):
            return
        write_json(self.path, {"host": self.host, "slot": self.slot, "done": self.done, "total": self.total})
        self.written = now


class Runner:
    """Runs prompts through the engine one at a time, keeping the tally and the progress."""

    def __init__(self, engine: Engine, prompts: list[str], progress: Progress):
        self.engine, self.prompts, self.progress = engine, prompts, progress
        self.tally = Tally()
        self.last_done = time.perf_counter()

    def run(self, index: int) -> None:
        self.tally.add(self.engine.infer(self.prompts[index]))
        self.last_done = time.perf_counter()
        self.progress.update(done=self.tally.samples)


def run_plain(runner: Runner, samples: list[int]) -> None:
    for index in samples:
        runner.run(index)


def measure(runner: Runner, samples: list[int], plan: LoadGenPlan | None) -> tuple[float, float, dict | None]:
    """Run the samples from now (the go): (started epoch s, wall s, LoadGen details or None)."""
    started, t0 = time.time(), time.perf_counter()
    runner.last_done = t0
    details = None
    if plan is None or not samples:
        run_plain(runner, samples)
    else:
        details = run_loadgen(runner, samples, plan)
    runner.progress.update(force=True)
    return started, runner.last_done - t0, details


def slot_result(ctx: dict, tally: Tally, started: float, wall_s: float, loadgen: dict) -> dict:
    """The slot's result document (``slots/<phase>-slot<N>.json``)."""
    return {**ctx, "samples": tally.samples, "prompt_tokens": tally.prompt_tokens,
            "generated_tokens": tally.generated_tokens, "decode_tokens": tally.decode_tokens, "wall_s": wall_s,
            "prefill_s": tally.prefill_s, "decode_s": tally.decode_s, "latencies_s": tally.latencies_s,
            "started": started, "finished": started + wall_s, "loadgen": loadgen}
