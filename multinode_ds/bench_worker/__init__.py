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
    up to date: at the go, after a sample when the last write is ``runner.PROGRESS_EVERY_S`` old, and after
    the last sample.  At the end it writes the result ``<out_dir>/slots/<phase>-slot<N>.json`` (see
    ``runner.slot_result`` and ``slot.run_slot``).  JSON files are written to a temporary name and renamed into place.
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

Modules
    ``cli`` the command line; ``node`` the node process (starts, supervises and stops the slots); ``slot``
    one slot, from the work file to its result; ``engines`` the device and engine, the model, one prompt's
    timing; ``loadgen`` MLPerf LoadGen; ``runner`` running the samples, the progress file, the result
    document; ``work`` the work file; ``protocol`` the error, the run directory's files, the printed lines.
    The names other code uses are imported here: ``from multinode_ds.bench_worker import BenchError``.
"""
from __future__ import annotations

from .cli import main, parse_args
from .engines import Engine, Sample, choose_engine, load_hf, registry_spec, resolve_device
from .loadgen import LoadGenPlan, choose_loadgen, expected_qps
from .node import child_env, describe_exit
from .protocol import BenchError, Paths
from .runner import Progress, Runner, Tally, measure, slot_result
from .slot import run_slot, wait_for_go
from .work import find_slot, host_slots, read_work

__all__ = [
    "BenchError", "Engine", "LoadGenPlan", "Paths", "Progress", "Runner", "Sample", "Tally", "child_env",
    "choose_engine", "choose_loadgen", "describe_exit", "expected_qps", "find_slot", "host_slots", "load_hf", "main",
    "measure", "parse_args", "read_work", "registry_spec", "resolve_device", "run_slot", "slot_result", "wait_for_go",
]
