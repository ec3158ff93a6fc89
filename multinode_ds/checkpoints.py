"""Which checkpoint a resumed run loads, checked without torch.

DeepSpeed writes one directory per tag under the checkpoint directory and a ``latest`` file naming the newest tag.
The checkpoint directory is per model, shared by its runs, so the bundled trainer names its tags after the run
(``<run_id>-step<N>``, ``tag_name``): a new run never overwrites another run's tags; ``latest`` names the newest
save of any run, which ``-e resume=true`` loads.  A tag is usable when its model-states files are whole: every
``*.pt`` file of the tag is a non-empty zip archive whose central directory (written last) is there.  A run that
died while saving leaves a torn tag, or a ``latest`` naming a tag that was never finished.

``choose(ckpt_dir)`` returns the tag to load: ``latest``'s when it is whole, else the newest whole tag, with the
torn ones it skipped and why; CheckpointError when there is none.  The dry run (on the coordinator, before the
launch) and every rank (at load time) call it, so they agree.
"""
from __future__ import annotations

import hashlib
import io
import json
import pickletools
import re
import zipfile
from pathlib import Path

STEP = re.compile(r"step(\d+)$")


class CheckpointError(ValueError):
    """No checkpoint to resume from; the message names the directory, the files and the fix."""


def tag_problem(tag_dir: Path) -> str | None:
    """Why the tag cannot be loaded, or None."""
    if not tag_dir.is_dir():
        return "%s does not exist" % tag_dir
    files = sorted(tag_dir.glob("*.pt"))
    if not any(f.name.startswith("mp_rank_") and f.name.endswith("_model_states.pt") for f in files):
        return "%s has no mp_rank_*_model_states.pt" % tag_dir
    for f in files:
        if f.stat().st_size == 0:
            return "%s is empty" % f
        try:
            with zipfile.ZipFile(f) as z:
                z.namelist()
        except (zipfile.BadZipFile, OSError) as exc:
            return "%s is torn (%s)" % (f, exc)
    return missing_partitions(tag_dir, files)


ZERO_PARTITION = re.compile(r"zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")
_INTS = ("BININT1", "BININT2", "BININT", "LONG1", "INT")
_MEMO = ("PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE")


def saved_world(tag_dir: Path) -> int | None:
    """The data-parallel world size DeepSpeed recorded in the tag's ``mp_rank_00_model_states.pt``
    (``dp_world_size``), read from the pickle's opcodes without torch; None when it cannot be read."""
    try:
        with zipfile.ZipFile(Path(tag_dir) / "mp_rank_00_model_states.pt") as z:
            name = next(n for n in z.namelist() if n.endswith("/data.pkl"))
            ops = list(pickletools.genops(io.BytesIO(z.read(name))))
    except (OSError, zipfile.BadZipFile, StopIteration, ValueError):
        return None
    for i, (op, arg, _pos) in enumerate(ops):
        if arg == "dp_world_size":
            for nxt, value, _p in ops[i + 1:i + 4]:
                if nxt.name in _INTS:
                    return int(value)
                if nxt.name not in _MEMO:
                    break
    return None


def dp_world(tag_dir: Path) -> int | None:
    """The number of data-parallel ranks that saved the tag: the one DeepSpeed recorded, else one more than the
    highest ZeRO optimizer partition; None without either."""
    recorded = saved_world(tag_dir)
    if recorded:
        return recorded
    ranks = [int(m.group(1)) for m in (ZERO_PARTITION.search(f.name) for f in Path(tag_dir).glob("*.pt")) if m]
    return max(ranks) + 1 if ranks else None


def missing_partitions(tag_dir: Path, files) -> str | None:
    """Why a ZeRO tag is torn although each of its files is whole: a rank killed before it saved its optimizer
    partition leaves the others' (DeepSpeed's rank 0 may even have written ``latest``)."""
    have = set(int(m.group(1)) for m in (ZERO_PARTITION.search(f.name) for f in files) if m)
    world = saved_world(tag_dir)
    if not have or not world:
        return None
    missing = sorted(set(range(world)) - have)
    if missing:
        return "%s is torn: it was saved by %d ranks and has no ZeRO partition of rank %s" % (
            tag_dir, world, ", ".join(map(str, missing)))
    return None


# The file in a universal conversion (``<checkpoint-dir>.universal/<tag>/``) naming the tag it was made from.
SOURCE_FILE = "multinode_ds_source.json"


def tag_fingerprint(tag_dir: Path) -> str:
    """What identifies a saved tag: its files' names, sizes and modification times.  Another run that saves a tag
    of the same name (the checkpoint directory is per model) has another fingerprint."""
    rows = sorted("%s %d %d" % (p.relative_to(tag_dir), p.stat().st_size, p.stat().st_mtime_ns)
                  for p in Path(tag_dir).rglob("*") if p.is_file())
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]


def conversion_current(universal_tag: Path, source_tag: Path) -> bool:
    """Whether ``universal_tag`` is a whole conversion of ``source_tag`` as it is now (not of an older run's tag of
    the same name, not one that stopped half-way: the source file is written last)."""
    try:
        recorded = json.loads((Path(universal_tag) / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return False
    return recorded.get("fingerprint") == tag_fingerprint(Path(source_tag)) and tag_problem(Path(universal_tag)) is None


def record_conversion(universal_tag: Path, source_tag: Path) -> None:
    (Path(universal_tag) / SOURCE_FILE).write_text(json.dumps({"source": str(source_tag),
                                                               "fingerprint": tag_fingerprint(Path(source_tag))}))


def step_of(tag: str) -> int:
    m = STEP.search(tag)
    return int(m.group(1)) if m else -1


def tag_name(step: int, run_id=None) -> str:
    """The tag run ``run_id`` saves ``step`` under: ``<run_id>-step<N>`` (``step<N>`` without a run id, a trainer
    started by hand), so that runs of one model never write the same tag."""
    return "%s-step%d" % (run_id, step) if run_id else "step%d" % step


# The file in a saved tag naming the run that saved it (the checkpoint directory is per model, shared by runs).
RUN_FILE = "multinode_ds_run.json"


def mark_run(tag_dir: Path, run_id: str) -> None:
    """Record that run ``run_id`` saved ``tag_dir``."""
    (Path(tag_dir) / RUN_FILE).write_text(json.dumps({"run_id": run_id}))


def saved_by(tag_dir: Path):
    """The run that saved ``tag_dir`` (``mark_run``), or None."""
    try:
        return json.loads((Path(tag_dir) / RUN_FILE).read_text()).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None


RUN_TAG = re.compile(r"^(.+)-step\d+$")


def run_of(root: Path, tag: str):
    """The run a tag is of: the one that marked it (``saved_by``), else the one its name says (``tag_name``), else
    None (a tag of a trainer started by hand, or of an older version)."""
    found = RUN_TAG.match(tag)
    return saved_by(Path(root) / tag) or (found.group(1) if found else None)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def resume_order(root: Path, latest) -> list:
    """The tags in the order a resume tries them: ``latest``, then the other tags of the run that saved it by step
    (newest first), then the other runs' tags by when they were saved (newest first).  Without ``latest``, every
    tag by step."""
    tags = [p.name for p in root.glob("*") if p.is_dir() and p.name != latest]
    if not latest:
        return sorted(tags, key=lambda t: (step_of(t), t), reverse=True)
    line = run_of(root, latest)
    mine = [t for t in tags if run_of(root, t) == line]
    others = [t for t in tags if t not in mine]
    return ([latest] + sorted(mine, key=lambda t: (step_of(t), t), reverse=True) +
            sorted(others, key=lambda t: (_mtime(root / t), step_of(t), t), reverse=True))


def choose(ckpt_dir, run_id=None) -> dict:
    """``{"tag", "step", "skipped": [{"tag", "why"}]}`` or CheckpointError.  With ``run_id``, only the tags that run
    saved (a later attempt of a run with restarts resumes its own checkpoints, never another run's)."""
    root = Path(ckpt_dir)
    latest = None
    try:
        latest = (root / "latest").read_text().strip() or None
    except OSError:
        pass
    order = resume_order(root, latest)
    if run_id is not None:
        order = [t for t in order if saved_by(root / t) == run_id]
        if not order:
            raise CheckpointError("%s holds no checkpoint of run %s" % (root, run_id))
    skipped = []
    for tag in order:
        why = tag_problem(root / tag)
        if why is None:
            return {"tag": tag, "step": step_of(tag), "skipped": skipped}
        skipped.append({"tag": tag, "why": why})
    if not order:
        raise CheckpointError("resume=true but %s holds no checkpoint (no 'latest', no tag directory). Fix: run "
                              "without -e resume=true, or resume the model whose checkpoints are there" % root)
    raise CheckpointError("resume=true but no checkpoint in %s can be loaded: %s. Fix: remove the torn tags, or "
                          "run without -e resume=true" % (root, "; ".join(s["why"] for s in skipped)))
