"""The work file the driver writes: read with its defaults, checked, and a host's or a slot's share of it."""
from __future__ import annotations

import json
from pathlib import Path

from .protocol import BenchError


PHASES = ("single", "parallel")
ENGINES = ("auto", "hf", "vllm")
DEVICES = ("auto", "cpu", "cuda")
LOADGEN_MODES = ("auto", "on", "off")


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
