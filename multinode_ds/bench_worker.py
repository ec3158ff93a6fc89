"""Data-parallel inference benchmark: the worker side of ``multinode_ds.bench``.

::

    python -m multinode_ds.bench_worker --work WORK_JSON --host HOST --phase single|parallel [--watch-stdin]

The driver on the coordinator (``multinode_ds.bench``) splits one sample set across every accelerator
slot of the workers, writes the work file (WORK_JSON) on shared storage and starts this module on each
worker over ssh, once per phase: ``single`` (one slot runs every sample alone: the baseline) and
``parallel`` (every slot of every worker runs its share at the same time).

Work file (read-only here)
    ``run_id``, ``out_dir`` (shared; everything below is written under it), ``model`` (a name of
    ``multinode_ds.models``, or a label when ``model_path`` is set), ``model_path`` (a local directory or
    a hub id for ``from_pretrained``; empty: the registry model with random weights, seed 0, so every
    slot runs the same model), ``engine`` (auto|hf|vllm), ``device`` (auto|cpu|cuda), ``max_new_tokens``,
    ``loadgen`` (auto|on|off), ``loadgen_min_duration_ms``, ``start_timeout_s``, ``prompts`` and
    ``phases``: ``{phase: {host: [{"slot": global slot, "local_slot": index on the host (= GPU index),
    "samples": [indexes into prompts]}]}}``.

Node process (no ``--slot``)
    Starts one child per slot of its host in the phase (``--slot N`` added), each in its own session
    with ``MULTINODE_DS_RUN_ID=<run_id>`` (the run's cleanup marker, see ``multinode_ds.agent``),
    ``CUDA_VISIBLE_DEVICES=<local_slot>`` when the device is cuda, and ``OMP_NUM_THREADS`` = cpu count //
    local slots (the child also calls ``torch.set_num_threads``).  A child's stdout and stderr go to
    ``<out_dir>/logs/<phase>-slot<N>.log``; the node process prints short lines of its own (slots started,
    each exit, the last 15 log lines of a failed slot).  When a child fails, the others are stopped
    (SIGTERM to their process groups, SIGKILL 5 s later).  With ``--watch-stdin``, end of file on stdin
    (the driver's ssh connection went away) stops the children the same way; so do SIGTERM and SIGHUP.

Child (one slot)
    Resolves device and engine, loads the model, runs the slot's first sample once as a warm-up (not
    counted), writes ``<out_dir>/ready/<phase>-slot<N>`` (JSON: host, slot, pid, warmup_s) and waits for
    ``<out_dir>/go-<phase>`` (any content), which the driver writes once every slot of the phase is ready,
    so all slots start together; after ``start_timeout_s`` seconds of waiting without it the child fails.
    Then it runs its samples, batch size 1, greedy, exactly ``max_new_tokens`` new tokens each (EOS
    ignored), keeping ``<out_dir>/progress/<phase>-slot<N>.json`` (``{"host", "slot", "done", "total"}``)
    up to date: at the go, after a sample when the last write is PROGRESS_EVERY_S old, and after the last
    sample.  At the end it writes the result ``<out_dir>/slots/<phase>-slot<N>.json`` (see
    ``slot_result`` and ``run_slot``).  JSON files are written to a temporary name and renamed into place.
    A file's arrival is checked by listing its directory, not by stat(): on NFS, opening a directory
    revalidates it (close-to-open), whereas a stat() of a missing name may be answered from the client's
    negative lookup cache for up to the attribute cache time.

Timing
    ``wall_s`` runs from the go (seen by this slot) to the end of its last sample.  A sample's latency is
    its own service time, prefill + decode.  hf engine: prefill is one forward pass over the prompt
    (producing the first token), decode the max_new_tokens - 1 further one-token steps with the KV cache.
    vllm engine: prefill is a generate of 1 token, the sample a generate of max_new_tokens tokens (prefix
    caching off, so it prefills again); decode = sample - prefill.  On cuda the device is synchronised
    before each clock reading.

LoadGen
    With ``mlperf_loadgen`` (``loadgen`` auto and installed, or on), the samples are run under MLPerf
    LoadGen: Offline scenario, PerformanceOnly, a QSL over this slot's samples (n of them),
    ``offline_expected_qps`` = 1 / warm-up seconds (at least 1), ``min_query_count`` = n,
    ``min_duration_ms`` from the work file; logs in ``<out_dir>/loadgen/<phase>-slot<N>/``.  Checked with
    mlperf_loadgen 6.0.17: with min_duration_ms 0, LoadGen issues exactly n samples, each index once, for
    n = 1, 3, 8, 50 and expected qps 1, 2.5, 10, 100, 1000, 1e5 (and the summary says VALID).  With
    min_duration_ms > 0 it issues max(n, ceil(expected_qps * min_duration_s * 1.1)) samples, repeating
    indexes, and the run is VALID only if it lasted min_duration_ms; every issued sample is counted.

Exit status
    Node process: 0 when every child exited 0; 1 when a child failed (or the work file is unusable);
    2 for a bad command line; 143 when stopped from outside (stdin closed, SIGTERM, SIGHUP).
    Child: 0 with a result written, 1 on any failure (the log's last line says why).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from .agent import MARKER

PHASES = ("single", "parallel")
ENGINES = ("auto", "hf", "vllm")
DEVICES = ("auto", "cpu", "cuda")
LOADGEN_MODES = ("auto", "on", "off")
KILL_GRACE_S = 5.0
POLL_S = 0.1
PROGRESS_EVERY_S = 0.5
TAIL_LINES = 15
STOPPED_EXIT = 143


class BenchError(Exception):
    """The slot or node cannot run as asked; the message says why and what to do."""


# -- files ---------------------------------------------------------------------------------------

def write_json(path: Path, data: dict) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True) + "\n")
    os.replace(tmp, path)


def file_appeared(path: Path) -> bool:
    """Whether ``path`` exists, by listing its directory (see the module docstring on NFS)."""
    try:
        return path.name in os.listdir(path.parent)
    except FileNotFoundError:
        return False


def slot_name(phase: str, slot: int) -> str:
    return f"{phase}-slot{slot}"


@dataclass(frozen=True)
class Paths:
    """Where the worker reads and writes, all under the run's ``out_dir``."""

    out_dir: Path
    phase: str
    slot: int = 0

    @property
    def name(self) -> str:
        return slot_name(self.phase, self.slot)

    @property
    def log(self) -> Path:
        return self.out_dir / "logs" / f"{self.name}.log"

    @property
    def ready(self) -> Path:
        return self.out_dir / "ready" / self.name

    @property
    def go(self) -> Path:
        return self.out_dir / f"go-{self.phase}"

    @property
    def progress(self) -> Path:
        return self.out_dir / "progress" / f"{self.name}.json"

    @property
    def result(self) -> Path:
        return self.out_dir / "slots" / f"{self.name}.json"

    @property
    def loadgen_dir(self) -> Path:
        return self.out_dir / "loadgen" / self.name


# -- the work file -------------------------------------------------------------------------------

WORK_DEFAULTS = {"model_path": "", "engine": "auto", "device": "auto", "max_new_tokens": 16, "loadgen": "auto",
                 "loadgen_min_duration_ms": 0, "start_timeout_s": 600}
WORK_REQUIRED = ("run_id", "out_dir", "model", "prompts", "phases")


def read_work(path: str) -> dict:
    """The work file with defaults filled in; BenchError when it cannot be used."""
    try:
        work = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise BenchError(f"cannot read the work file {path}: {exc.strerror}. It must lie on storage this "
                         f"node shares with the coordinator.") from None
    except ValueError as exc:
        raise BenchError(f"work file {path} is not valid JSON: {exc}") from None
    missing = [k for k in WORK_REQUIRED if k not in work]
    if missing:
        raise BenchError(f"work file {path} lacks {', '.join(missing)}")
    work = {**WORK_DEFAULTS, **work}
    for key, allowed in (("engine", ENGINES), ("device", DEVICES), ("loadgen", LOADGEN_MODES)):
        if work[key] not in allowed:
            raise BenchError(f"work file {path}: {key}={work[key]!r}; expected one of {', '.join(allowed)}")
    if int(work["max_new_tokens"]) < 1:
        raise BenchError(f"work file {path}: max_new_tokens={work['max_new_tokens']}; at least 1 is needed")
    return work


def host_slots(work: dict, host: str, phase: str) -> list[dict]:
    """This host's slots in ``phase``; BenchError naming host and phase when it has none."""
    hosts = work["phases"].get(phase) or {}
    slots = hosts.get(host) or []
    if not slots:
        known = ", ".join(sorted(hosts)) or "none"
        raise BenchError(f"the work file has no slots for host {host!r} in phase {phase!r} (hosts in that phase: "
                         f"{known}). Pass --host with the name the driver used for this node.")
    return sorted(slots, key=lambda s: s["slot"])


def find_slot(work: dict, host: str, phase: str, slot: int) -> dict:
    for entry in host_slots(work, host, phase):
        if entry["slot"] == slot:
            bad = [i for i in entry["samples"] if not 0 <= i < len(work["prompts"])]
            if bad:
                raise BenchError(f"sample index {bad[0]} out of range: the work file has {len(work['prompts'])} "
                                 f"prompts")
            return entry
    raise BenchError(f"the work file has no slot {slot} for host {host!r} in phase {phase!r}")


# -- choices -------------------------------------------------------------------------------------

def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def resolve_device(asked: str) -> str:
    """``cpu`` or ``cuda`` for the work file's ``device`` (auto: cuda when torch sees a GPU)."""
    if asked == "cpu":
        return "cpu"
    import torch

    available = torch.cuda.is_available()
    if asked == "cuda" and not available:
        raise BenchError("device=cuda but torch.cuda.is_available() is False on this node (CUDA_VISIBLE_DEVICES="
                         f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}). Use device=auto or cpu, or install "
                         "a CUDA build of torch.")
    return "cuda" if available else "cpu"


def choose_engine(asked: str, device: str, model_path: str, have_vllm: bool) -> tuple[str, str]:
    """The engine to run and why, in words."""
    if asked == "hf":
        return "hf", "engine=hf asked for"
    if asked == "vllm":
        if not have_vllm:
            raise BenchError("engine=vllm but vllm is not installed in this node's venv. Install it on the GPU "
                             "nodes, or use engine=auto or hf.")
        if not model_path:
            raise BenchError("engine=vllm needs model_path (a local directory or hub id); the registry's random "
                             "models run only on engine=hf.")
        return "vllm", "engine=vllm asked for"
    if not have_vllm:
        return "hf", "vllm is not installed: Hugging Face transformers"
    if device != "cuda":
        return "hf", f"vllm is installed but the device is {device}: Hugging Face transformers"
    if not model_path:
        return "hf", "vllm is installed but the model has random weights (no model_path): Hugging Face transformers"
    return "vllm", "vllm is installed and the device is cuda"


def choose_loadgen(mode: str) -> tuple[bool, str]:
    """Whether to run under MLPerf LoadGen, and why (its version when used)."""
    if mode == "off":
        return False, "loadgen=off"
    try:
        importlib.import_module("mlperf_loadgen")
    except ImportError:
        if mode == "on":
            raise BenchError("loadgen=on but mlperf_loadgen is not installed in this node's venv. Install the "
                             "mlcommons-loadgen wheel on every node, or use loadgen=auto or off.") from None
        return False, "not installed"
    import importlib.metadata as md

    try:
        return True, f"mlperf_loadgen {md.version('mlcommons-loadgen')}"
    except md.PackageNotFoundError:
        return True, "mlperf_loadgen"


# -- engines -------------------------------------------------------------------------------------

class Sample(NamedTuple):
    """One sample's measurement."""

    prompt_tokens: int
    generated_tokens: int
    prefill_s: float
    decode_s: float
    # Tokens made in the decode time: the first generated token comes out of the prefill.
    decode_tokens: int


class Engine:
    """What the benchmark needs from an engine: ``infer`` one prompt, batch size 1."""

    name = "none"
    dtype: str | None = None

    def validate(self, prompts: list[str]) -> None:
        """Raise BenchError before the go when a prompt cannot be run."""

    def infer(self, prompt: str) -> Sample:
        raise NotImplementedError


class HFEngine(Engine):
    """Hugging Face transformers: a prefill forward pass, then greedy one-token steps with the KV cache."""

    name = "hf"

    def __init__(self, model, tokenizer, device, max_new_tokens: int):
        import torch

        self.torch = torch
        self.model, self.tokenizer, self.device = model, tokenizer, device
        self.max_new_tokens = max_new_tokens
        self.dtype = str(next(model.parameters()).dtype).replace("torch.", "")
        cfg = model.config
        self.context = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)

    def validate(self, prompts: list[str]) -> None:
        if not self.context:
            return
        for text in prompts:
            n = len(self.tokenizer.encode(text))
            if n + self.max_new_tokens > self.context:
                raise BenchError(f"a prompt has {n} tokens; with max_new_tokens {self.max_new_tokens} it exceeds "
                                 f"the model's context of {self.context}. Use shorter prompts or fewer new tokens.")

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def infer(self, prompt: str) -> Sample:
        torch = self.torch
        ids = self.tokenizer.encode(prompt)
        with torch.inference_mode():
            x = torch.tensor([ids], dtype=torch.long, device=self.device)
            self.sync()
            t0 = time.perf_counter()
            out = self.model(input_ids=x, use_cache=True)
            token = out.logits[:, -1, :].argmax(-1, keepdim=True)
            self.sync()
            t1 = time.perf_counter()
            for _step in range(self.max_new_tokens - 1):
                out = self.model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
                token = out.logits[:, -1, :].argmax(-1, keepdim=True)
            self.sync()
            t2 = time.perf_counter()
        return Sample(len(ids), self.max_new_tokens, t1 - t0, t2 - t1, self.max_new_tokens - 1)


class VLLMEngine(Engine):
    """vLLM: a 1-token generate for the prefill time, then the sample's full generate."""

    name = "vllm"

    def __init__(self, model_path: str, max_new_tokens: int):
        import vllm

        # Prefix caching off: the full generate must prefill again, as a fresh request would.
        self.llm = vllm.LLM(model=model_path, enable_prefix_caching=False, seed=0)
        config = getattr(getattr(self.llm, "llm_engine", None), "model_config", None)
        self.dtype = str(getattr(config, "dtype", "")).replace("torch.", "") or None
        m = max_new_tokens
        self.first = vllm.SamplingParams(max_tokens=1, min_tokens=1, ignore_eos=True, temperature=0)
        self.full = vllm.SamplingParams(max_tokens=m, min_tokens=m, ignore_eos=True, temperature=0)

    def infer(self, prompt: str) -> Sample:
        t0 = time.perf_counter()
        self.llm.generate([prompt], self.first, use_tqdm=False)
        t1 = time.perf_counter()
        out = self.llm.generate([prompt], self.full, use_tqdm=False)[0]
        t2 = time.perf_counter()
        prefill = t1 - t0
        generated = len(out.outputs[0].token_ids)
        return Sample(len(out.prompt_token_ids), generated, prefill, max(0.0, (t2 - t1) - prefill),
                      max(0, generated - 1))


def load_hf(model: str, model_path: str, device: str, max_new_tokens: int) -> HFEngine:
    """The model (registry random weights, or from_pretrained) on ``device``, in eval mode."""
    import torch

    from . import data
    from .models import build_model

    dev = torch.device("cuda", 0) if device == "cuda" else torch.device("cpu")
    dtype = torch.float32
    if dev.type == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if not model_path:
        spec = registry_spec(model)
        net, tok = build_model(spec, seed=0), data.ByteTokenizer()
    else:
        import transformers

        net = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        try:
            tok = data.HFTokenizer(transformers.AutoTokenizer.from_pretrained(model_path))
        except (OSError, ValueError):
            if net.config.vocab_size < data.ByteTokenizer.vocab_size:
                raise BenchError(f"{model_path} has no tokenizer and a vocabulary too small for bytes") from None
            tok = data.ByteTokenizer()
    net = net.to(device=dev, dtype=dtype).eval()
    return HFEngine(net, tok, dev, max_new_tokens)


def registry_spec(model: str):
    """The registry entry for a run without model_path; BenchError when it cannot run with random weights."""
    from .models import get_spec

    try:
        spec = get_spec(model)
    except KeyError as exc:
        raise BenchError(f"{exc.args[0]}. Set model to one of them, or model_path to a local directory or "
                         f"hub id.") from None
    if not spec.byte_tokenizer:
        raise BenchError(f"model {model!r} needs its weights and tokenizer: set model_path (a local directory or "
                         f"hub id), or use a tiny registry model such as llama-tiny.")
    return spec


def load_engine(engine: str, work: dict, device: str) -> Engine:
    if engine == "vllm":
        return VLLMEngine(work["model_path"], int(work["max_new_tokens"]))
    return load_hf(work["model"], work["model_path"], device, int(work["max_new_tokens"]))


# -- measuring -----------------------------------------------------------------------------------

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


@dataclass(frozen=True)
class LoadGenPlan:
    outdir: Path
    expected_qps: float
    min_duration_ms: int


def run_plain(runner: Runner, samples: list[int]) -> None:
    for index in samples:
        runner.run(index)


def run_loadgen(runner: Runner, samples: list[int], plan: LoadGenPlan) -> dict:
    """Run the samples under LoadGen (Offline, PerformanceOnly); what it issued and its verdict."""
    import mlperf_loadgen as lg

    issued, failure = [0], []

    def issue_queries(query_samples):
        issued[0] += len(query_samples)
        runner.progress.update(total=issued[0])
        for qs in query_samples:
            if not failure:
                try:
                    runner.run(samples[qs.index])
                except Exception as exc:  # pylint: disable=broad-except  # re-raised after the test
                    failure.append(exc)
            lg.QuerySamplesComplete([lg.QuerySampleResponse(qs.id, 0, 0)])

    n = len(samples)
    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.Offline
    settings.mode = lg.TestMode.PerformanceOnly
    settings.offline_expected_qps = plan.expected_qps
    settings.min_query_count = n
    settings.min_duration_ms = plan.min_duration_ms
    log = lg.LogSettings()
    plan.outdir.mkdir(parents=True, exist_ok=True)
    log.log_output.outdir = str(plan.outdir)
    log.enable_trace = False
    sut = lg.ConstructSUT(issue_queries, lambda: None)
    qsl = lg.ConstructQSL(n, n, lambda indexes: None, lambda indexes: None)
    try:
        lg.StartTestWithLogSettings(sut, qsl, settings, log)
    finally:
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    if failure:
        raise failure[0]
    summary = plan.outdir / "mlperf_log_summary.txt"
    verdict = re.search(r"Result is : (\w+)", summary.read_text()) if summary.exists() else None
    return {"issued": issued[0], "summary_file": str(summary) if summary.exists() else None,
            "result": verdict.group(1) if verdict else None, "expected_qps": plan.expected_qps,
            "min_query_count": n, "min_duration_ms": plan.min_duration_ms}


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


def expected_qps(warmup_s: float) -> float:
    return max(1.0, 1.0 / warmup_s) if warmup_s > 0 else 1.0


def slot_result(ctx: dict, tally: Tally, started: float, wall_s: float, loadgen: dict) -> dict:
    """The slot's result document (``slots/<phase>-slot<N>.json``)."""
    return {**ctx, "samples": tally.samples, "prompt_tokens": tally.prompt_tokens,
            "generated_tokens": tally.generated_tokens, "decode_tokens": tally.decode_tokens, "wall_s": wall_s, "prefill_s": tally.prefill_s,
            "decode_s": tally.decode_s, "latencies_s": tally.latencies_s, "started": started,
            "finished": started + wall_s, "loadgen": loadgen}


# -- the child: one slot -------------------------------------------------------------------------

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


def say(msg: str) -> None:
    """A line on stdout; a vanished reader (the ssh connection went away) does not stop the caller."""
    try:
        print(msg, flush=True)
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


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
    indexes), prompt_tokens, generated_tokens, wall_s, prefill_s and decode_s (sums), latencies_s (one
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


# -- the node process ----------------------------------------------------------------------------

@dataclass
class Child:
    slot: int
    proc: subprocess.Popen
    log: Path
    started: float


class Stop:
    """Why the node process must stop its children; set by a signal handler or the stdin watcher."""

    def __init__(self):
        self.event = threading.Event()
        self.reason = ""

    def set(self, reason: str) -> None:
        if not self.event.is_set():
            self.reason = reason
            self.event.set()


def watch_stdin(stop: Stop, fd: int | None = None) -> threading.Thread:
    """A daemon thread that reads stdin to its end, then asks the node process to stop."""
    fd = sys.stdin.fileno() if fd is None else fd

    def watch():
        try:
            while os.read(fd, 4096):
                pass
        except OSError:
            pass
        stop.set("stdin closed (the driver's ssh connection went away)")

    thread = threading.Thread(target=watch, name="watch-stdin", daemon=True)
    thread.start()
    return thread


def child_env(run_id: str, device: str, local_slot: int, threads: int) -> dict:
    env = dict(os.environ)
    env[MARKER] = run_id
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    # The child imports this package from where this process found it, whatever its working directory.
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = str(local_slot)
    return env


def child_command(args, slot: int) -> list[str]:
    return [sys.executable, "-m", "multinode_ds.bench_worker", "--work", os.path.abspath(args.work),
            "--host", args.host, "--phase", args.phase, "--slot", str(slot)]


def start_child(args, work: dict, entry: dict, device: str, threads: int) -> Child:
    """One slot's process, in its own session (so its whole process group can be stopped), logging to a file."""
    log = Paths(Path(work["out_dir"]), args.phase, entry["slot"]).log
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as fh:
        proc = subprocess.Popen(child_command(args, entry["slot"]), stdin=subprocess.DEVNULL, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env=child_env(work["run_id"], device, entry["local_slot"], threads))
    return Child(entry["slot"], proc, log, time.monotonic())


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 65536))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return [f"(cannot read {path}: {exc.strerror})"]
    return text.rstrip("\n").splitlines()[-lines:]


def signal_group(child: Child, sig: int) -> None:
    try:
        os.killpg(child.proc.pid, sig)
    except OSError:
        pass


def stop_children(children: list[Child], grace: float = KILL_GRACE_S) -> None:
    """SIGTERM the children's process groups, SIGKILL them after ``grace`` seconds; reap the children."""
    running = [c for c in children if c.proc.poll() is None]
    if not running:
        return
    say(f"stopping slot(s) {', '.join(str(c.slot) for c in running)}")
    for c in running:
        signal_group(c, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(c.proc.poll() is None for c in running):
        time.sleep(0.1)
    for c in running:
        signal_group(c, signal.SIGKILL)  # also what the slot started itself (vLLM's engine processes)
    for c in running:
        say(f"slot {c.slot} stopped ({describe_exit(c.proc.wait())})")


def supervise(children: list[Child], stop: Stop) -> int:
    """Wait for the children: 0 when all exit 0, 1 as soon as one fails, 143 when stopped from outside."""
    pending = list(children)
    while pending:
        if stop.event.is_set():
            say(f"{stop.reason}: stopping")
            stop_children(pending)
            return STOPPED_EXIT
        for c in list(pending):
            code = c.proc.poll()
            if code is None:
                continue
            pending.remove(c)
            say(f"slot {c.slot} finished: {describe_exit(code)} after {time.monotonic() - c.started:.1f} s")
            if code != 0:
                say(f"slot {c.slot} failed; last lines of {c.log}:")
                for line in tail(c.log):
                    say(f"  | {line}")
                stop_children(pending)
                return 1
        stop.event.wait(0.2)
    return 0


def node_main(args) -> int:
    where = f"bench_worker: host {args.host} phase {args.phase}"
    try:
        work = read_work(args.work)
        slots = host_slots(work, args.host, args.phase)
        device = resolve_device(work["device"])
    except BenchError as exc:
        print(f"{where}: {exc}", file=sys.stderr, flush=True)
        return 1
    stop = Stop()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: stop.set(f"got {signal.Signals(signum).name}"))
    if args.watch_stdin:
        watch_stdin(stop)
    threads = max(1, (os.cpu_count() or 1) // len(slots))
    children: list[Child] = []
    try:
        for entry in slots:
            if stop.event.is_set():
                break
            children.append(start_child(args, work, entry, device, threads))
            say(f"{args.host} {args.phase}: started slot {entry['slot']} (local slot {entry['local_slot']}, "
                f"{len(entry['samples'])} samples, device {device}, {threads} threads, pid {children[-1].proc.pid}, "
                f"log {children[-1].log})")
        return supervise(children, stop)
    finally:
        stop_children(children)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python -m multinode_ds.bench_worker", description=__doc__.splitlines()[0],
        epilog="The protocol (work file, ready/go files, progress, results, exit codes) is described in the "
               "module's docstring: python -m pydoc multinode_ds.bench_worker")
    p.add_argument("--work", required=True, help="the work file the driver wrote (JSON, on shared storage)")
    p.add_argument("--host", default=socket.gethostname(),
                   help="this node's name in the work file's phases (default: the hostname)")
    p.add_argument("--phase", required=True, choices=PHASES,
                   help="single: one slot runs every sample (the baseline); parallel: every slot runs its share")
    p.add_argument("--watch-stdin", action="store_true",
                   help="stop the slots and exit 143 when stdin reaches its end (the driver's ssh went away)")
    p.add_argument("--slot", type=int, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.slot is not None:
        return slot_main(args)
    return node_main(args)


if __name__ == "__main__":
    sys.exit(main())
