"""Check a user's DeepSpeed config before launch, with DeepSpeed's own config class at the job's world size.

    python -m multinode_ds.ds_check --config FILE|- --world-size N [--accelerator cpu|cuda] [--json]

Runs in the stack's venv on a worker (DeepSpeed installed), without torch.distributed: DeepSpeedConfig reads the
world size from ``deepspeed.comm``, which is swapped for a stand-in giving rank 0 and N while it is built.  Beside
what DeepSpeedConfig asserts (the batch sizes, fp16 with bf16, pydantic's checks of the sections), it checks what
DeepSpeed only finds once the engine starts, or never: fp16/bf16 on an accelerator without them, offload devices,
the optimizer and scheduler names, and top-level keys DeepSpeedConfig does not read (DeepSpeed ignores them).

Output (``--json``): {"ok", "accelerator", "problems": [{"key", "message", "fix", "text"}], "derived": {...}}, where
``text`` is DeepSpeed's own wording; the message and fix come from the collection's table
(plugins/module_utils/plan/dsconfig.py).  Exit 0 when ok, 1 with problems, 2 on a usage error.
"""
from __future__ import annotations

# DeepSpeed and torch are imported where they are used: after DS_ACCELERATOR is set, and not for a usage error.
# pylint: disable=import-outside-toplevel

import argparse
import contextlib
import importlib.util
import json
import os
import sys
from collections.abc import KeysView
from pathlib import Path


class BadFile(Exception):
    """The file is not a JSON object: one problem, nothing else is checked."""


def translation():
    """The wording table (plugins/module_utils/plan/dsconfig.py): installed next to this file by the stack role as
    dsconfigcore.py, or read from the collection's source tree; None when neither is there (the problems then carry
    DeepSpeed's text alone, and the controller words them)."""
    try:
        from multinode_ds import dsconfigcore
        return dsconfigcore
    except ImportError:
        path = Path(__file__).resolve().parent.parent / "plugins" / "module_utils" / "plan" / "dsconfig.py"
        if not path.is_file():
            return None
        spec = importlib.util.spec_from_file_location("multinode_ds_dsconfigcore", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


class Checker:
    """The problems found in one config, worded for ``world_size`` workers of ``accelerator``."""

    def __init__(self, world_size: int, accelerator: str | None = None):
        self.world_size = world_size
        self.accelerator = accelerator
        self.table = translation()
        self.problems: list[dict] = []

    def add(self, key: str, text: str, known=None) -> None:
        worded = self.table.translate(text, world_size=self.world_size, accelerator=self.accelerator, key=key,
                                      known=known) if self.table else None
        if worded:
            self.problems.append({"key": key or worded[0], "message": worded[1], "fix": worded[2], "text": text})
        else:
            self.problems.append({"key": key, "message": "ds_config: " + text, "fix": "", "text": text})


def load(path: str) -> dict:
    """The config, with DeepSpeed's own refusal of a key given twice; BadFile with the line and column when it is
    not JSON."""
    from deepspeed.runtime.config_utils import dict_raise_error_on_duplicate_keys
    with (contextlib.nullcontext(sys.stdin) if path == "-" else open(path, encoding="utf-8")) as fh:
        try:
            data = json.load(fh, object_pairs_hook=dict_raise_error_on_duplicate_keys)
        except json.JSONDecodeError as exc:
            raise BadFile(f"{path} is not JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(data, dict):
        raise BadFile(f"{path} must hold a JSON object, not {type(data).__name__}")
    return data


class ReadKeys(dict):
    """A config that records the top-level keys DeepSpeed reads from it (``get``, ``[]``, ``in``, ``.keys()``);
    a shallow copy shares the record (DeepSpeedConfig copies the dict before reading it)."""

    def __init__(self, data, read=None):
        super().__init__(data)
        self.read = set() if read is None else read

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)

    def keys(self):
        return KeysView(self)


class WorldOf:
    """A stand-in for ``deepspeed.comm`` while DeepSpeedConfig is built: rank 0 of ``size``."""

    def __init__(self, size: int):
        self.size = size

    def get_rank(self, group=None):  # pylint: disable=unused-argument
        return 0

    def get_world_size(self, group=None):  # pylint: disable=unused-argument
        return self.size


def build(config: dict, world_size: int):
    """DeepSpeedConfig of ``config`` at ``world_size`` (the world it reads from deepspeed.comm)."""
    from unittest import mock
    import deepspeed.runtime.config as ds_config
    with mock.patch.object(ds_config, "dist", WorldOf(world_size)):
        return ds_config.DeepSpeedConfig(config)


def construct(checker: Checker, cfg: dict):
    """DeepSpeedConfig at the job's world size (None when it refused the config: a problem), and the top-level
    keys DeepSpeed reads: those it read here and those it reads from a bare config (read whatever else is set)."""
    from pydantic import ValidationError
    from deepspeed.runtime.config import DeepSpeedConfigError
    recorded = ReadKeys(cfg)
    bare = ReadKeys({"train_micro_batch_size_per_gpu": 1}, recorded.read)
    build(bare, 1)
    try:
        return build(recorded, checker.world_size), recorded.read
    except ValidationError as exc:
        checker.add(section_key(cfg, exc), str(exc))
    except (AssertionError, ValueError, TypeError, DeepSpeedConfigError) as exc:
        checker.add("", str(exc) or type(exc).__name__)
    return None, recorded.read


def section_key(cfg: dict, exc) -> str:
    """Where pydantic's first error is in the file (``zero_optimization.stage``): the one section that holds the
    field it names ("" when none or several do)."""
    loc = [str(part) for part in exc.errors()[0]["loc"]] if exc.errors() else []
    sections = [key for key, value in cfg.items() if loc and isinstance(value, dict) and loc[0] in value]
    return ".".join([sections[0]] + loc) if len(sections) == 1 else ""


def check_precision(checker: Checker, cfg: dict) -> None:
    """fp16/bf16 enabled where the accelerator has neither (DeepSpeed's engine refuses it at start)."""
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.precision_config import get_bfloat16_config, get_float16_config
    accelerator = get_accelerator()
    for name, read, supported in (("fp16", get_float16_config, accelerator.is_fp16_supported),
                                  ("bf16", get_bfloat16_config, accelerator.is_bf16_supported)):
        try:
            enabled = read(cfg).enabled
        except Exception:  # pylint: disable=broad-except  # DeepSpeedConfig named it already
            continue
        if enabled and not supported():
            checker.add(f"{name}.enabled", f"Type {name} is not supported on your device.")


def check_offload(checker: Checker, cfg: dict) -> None:
    """Offload devices DeepSpeedConfig accepts and the run does not: nvme without a path, a device the ZeRO stage
    ignores (parameters: stage 3; NVMe: stage 3; the optimizer: stage 1)."""
    from deepspeed.runtime.zero.offload_config import OffloadDeviceEnum
    zero = cfg.get("zero_optimization")
    if not isinstance(zero, dict) or not isinstance(zero.get("stage", 0), int):
        return
    stage = zero.get("stage", 0)
    for part in ("offload_optimizer", "offload_param"):
        sub = zero.get(part)
        device = str(sub.get("device", "none")) if isinstance(sub, dict) else "none"
        key = f"zero_optimization.{part}"
        if device == "nvme" and not sub.get("nvme_path"):
            # DeepSpeed's own assertion (zero/partition_parameters.py), which it makes only for parameters, at start.
            checker.add(f"{key}.nvme_path",
                        f'"nvme_path" in DeepSpeed Config cannot be None if remote device is {OffloadDeviceEnum.nvme}')
        need = 3 if part == "offload_param" or device == "nvme" else 1
        if device != "none" and stage < need:
            checker.add(f"{key}.device", f"{key}.device {device} needs ZeRO stage {need} (stage is {stage})")


def check_names(checker: Checker, cfg: dict) -> None:
    """The optimizer and scheduler types the engine builds: DeepSpeed's own names or torch's classes."""
    import torch
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS
    from deepspeed.runtime.lr_schedules import VALID_LR_SCHEDULES
    optimizer, scheduler = _type_of(cfg, "optimizer"), _type_of(cfg, "scheduler")
    if optimizer is not None and optimizer.lower() not in DEEPSPEED_OPTIMIZERS \
            and not isinstance(getattr(torch.optim, optimizer, None), type):
        checker.add("optimizer.type", f"module 'torch.optim' has no attribute '{optimizer}'", DEEPSPEED_OPTIMIZERS)
    if scheduler is not None and scheduler not in VALID_LR_SCHEDULES \
            and not isinstance(getattr(torch.optim.lr_scheduler, scheduler, None), type):
        checker.add("scheduler.type", f"DeepSpeed does not recognize LR scheduler {scheduler}", VALID_LR_SCHEDULES)


def _type_of(cfg: dict, section: str) -> str | None:
    value = cfg.get(section)
    return str(value["type"]) if isinstance(value, dict) and value.get("type") is not None else None


def check_keys(checker: Checker, cfg: dict, read: set) -> None:
    for key in cfg:
        if key not in read:
            checker.add(key, f"DeepSpeedConfig does not read key '{key}'", sorted(k for k in read if k))


def check(cfg: dict, world_size: int) -> dict:
    """The report on ``cfg`` at ``world_size`` on this node's accelerator."""
    from deepspeed.accelerator import get_accelerator
    checker = Checker(world_size, get_accelerator().device_name())
    built, read = construct(checker, cfg)
    check_precision(checker, cfg)
    check_offload(checker, cfg)
    check_names(checker, cfg)
    check_keys(checker, cfg, read)
    derived = {}
    if built is not None:
        derived = {k: getattr(built, k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                  "gradient_accumulation_steps")}
    return {"ok": not checker.problems, "accelerator": checker.accelerator, "problems": checker.problems,
            "derived": derived}


def check_file(path: str, world_size: int) -> dict:
    try:
        cfg = load(path)
    except (BadFile, ValueError) as exc:
        checker = Checker(world_size)
        checker.add("", str(exc))
        return {"ok": False, "accelerator": None, "problems": checker.problems, "derived": {}}
    return check(cfg, world_size)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m multinode_ds.ds_check",
                                     description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--config", required=True, help="the DeepSpeed config (JSON); - reads standard input")
    parser.add_argument("--world-size", type=int, required=True, help="the job's data-parallel world size")
    parser.add_argument("--accelerator", choices=("cpu", "cuda"), help="DeepSpeed's accelerator (DS_ACCELERATOR)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    if args.world_size < 1:
        parser.error(f"--world-size must be at least 1, not {args.world_size}")
    if args.config != "-" and not Path(args.config).is_file():
        parser.error(f"--config {args.config}: no such file")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.accelerator:
        os.environ["DS_ACCELERATOR"] = args.accelerator
    # DeepSpeed logs to stdout: keep it for the report.
    with contextlib.redirect_stdout(sys.stderr):
        report = check_file(args.config, args.world_size)
    if args.json:
        print(json.dumps(report, indent=1, sort_keys=True))
    else:
        for problem in report["problems"]:
            print(f"{problem['message']} \u2014 {problem['fix']}" if problem["fix"] else problem["message"])
        if report["ok"]:
            print("ds_config: ok at world size %d (%s)" % (args.world_size, ", ".join(
                f"{k} {v}" for k, v in report["derived"].items())))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
