"""Check a user's DeepSpeed config before launch, with DeepSpeed's own config class at the job's world size.

    python -m multinode_ds.ds_check --config FILE|- --world-size N [--accelerator cpu|cuda] [--op Builder ...]
                                    [--json] [--bundled [-- TRAINER_ARGS...]]

Runs in the stack's venv on a worker (DeepSpeed installed), without torch.distributed: DeepSpeedConfig reads the
world size from ``deepspeed.comm``, which is swapped for a stand-in giving rank 0 and N while it is built.  Beside
what DeepSpeedConfig asserts (the batch sizes, fp16 with bf16, pydantic's checks of the sections), it checks what
DeepSpeed only finds once the engine starts, or never: fp16/bf16 on an accelerator without them, offload devices,
the optimizer and scheduler names, and top-level keys DeepSpeedConfig does not read (DeepSpeed ignores them).
Before DeepSpeedConfig, the types of the top-level values it reads without checking them (their DeepSpeed defaults'
types, from ``deepspeed.runtime.constants``; the batch sizes: whole numbers of at least 1), and sections given as
something else than an object; a file nested deeper than any config is refused unread.  With ``--op``: whether this
node's accelerator has each op (the ops the config makes the engine load, from the plan: plan/dsops.py).  With
``--bundled``: the config as the bundled trainer has it, merged over the batch sizes it gives (``--micro-batch``,
``--grad-accum`` among the trainer's arguments after ``--``) and, on CPU, over the config it generates.

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
import re
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
    table = translation()
    limit = table.MAX_DEPTH if table else 32
    with (contextlib.nullcontext(sys.stdin) if path == "-" else open(path, encoding="utf-8")) as fh:
        try:
            data = json.load(fh, object_pairs_hook=dict_raise_error_on_duplicate_keys)
        except json.JSONDecodeError as exc:
            raise BadFile(f"{path} is not JSON: line {exc.lineno} column {exc.colno}: {exc.msg}") from None
        except RecursionError:
            raise BadFile(f"{path} nests deeper than {limit} levels: not a DeepSpeed config") from None
    if not isinstance(data, dict):
        raise BadFile(f"{path} must hold a JSON object, not {type(data).__name__}")
    where = table.too_deep(data, limit) if table else None
    if where:
        shown = where if len(where) <= 60 else where[:57] + "..."
        raise BadFile(f"{path} nests deeper than {limit} levels (at {shown}): not a DeepSpeed config")
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


def bare_keys() -> set:
    """The top-level keys DeepSpeedConfig reads from a bare config (it reads them whatever else is set)."""
    bare = ReadKeys({"train_micro_batch_size_per_gpu": 1})
    build(bare, 1)
    return bare.read


def construct(checker: Checker, cfg: dict):
    """DeepSpeedConfig at the job's world size (None when it refused the config: a problem), and the top-level
    keys it read."""
    from pydantic import ValidationError
    from deepspeed.runtime.config import DeepSpeedConfigError
    recorded = ReadKeys(cfg)
    try:
        return build(recorded, checker.world_size), recorded.read
    except ValidationError as exc:
        checker.add(section_key(cfg, exc), str(exc))
    except (AssertionError, ValueError, TypeError, AttributeError, KeyError, DeepSpeedConfigError) as exc:
        section = not_a_section(cfg)
        if section:
            checker.add(section, f"DeepSpeedConfig reads {section} as a section, not {json.dumps(cfg[section])}")
        else:
            checker.add("", str(exc) or type(exc).__name__)
    return None, recorded.read


def not_a_section(cfg: dict) -> str | None:
    """The top-level key whose value is not an object where DeepSpeedConfig reads a section: alone in a bare
    config, that value makes it fail with a TypeError or an AttributeError, and ``{}`` does not."""
    for key, value in cfg.items():
        if isinstance(value, dict) or key in SCALARS_OF_DEEPSPEED:
            continue
        if _breaks_alone(key, value) and not _breaks_alone(key, {}):
            return key
    return None


def _breaks_alone(key: str, value) -> bool:
    try:
        build({"train_micro_batch_size_per_gpu": 1, key: value}, 1)
    except (TypeError, AttributeError):
        return True
    except Exception:  # pylint: disable=broad-except  # another refusal is not this one
        return False
    return False


# Top-level keys DeepSpeedConfig reads as plain values: their kinds come from deepspeed.runtime.constants (scalars).
SCALARS_OF_DEEPSPEED: dict = {}
# The batch sizes (no default there): DeepSpeed computes with them, and a text fails there with a TypeError.
WHOLE_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "steps_per_print")


def scalar_kinds() -> dict:
    """Top-level key -> the kind DeepSpeed reads it as: ``whole`` (the batch sizes, steps_per_print), else the type
    of its default in deepspeed.runtime.constants (``KEY = "name"`` beside ``KEY_DEFAULT``), where that is one of
    bool, int, float for every constant of that name."""
    from deepspeed.runtime import constants
    seen: dict = {}
    for name in dir(constants):
        key = getattr(constants, name[:-len("_DEFAULT")], None) if name.endswith("_DEFAULT") else None
        if isinstance(key, str):
            seen.setdefault(key, set()).add(type(getattr(constants, name)).__name__)
    kinds = dict((k, v.pop()) for k, v in seen.items() if len(v) == 1 and next(iter(v)) in ("bool", "int", "float"))
    kinds.update((k, "whole") for k in WHOLE_KEYS)
    SCALARS_OF_DEEPSPEED.clear()
    SCALARS_OF_DEEPSPEED.update(kinds)
    return kinds


def kind_ok(value, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == "whole":
        return isinstance(value, int) and value >= 1
    return isinstance(value, int) or (kind == "float" and isinstance(value, float))


def check_types(checker: Checker, cfg: dict, read: set) -> set:
    """The top-level values DeepSpeedConfig reads and computes with unchecked, of the kind it reads them as
    (``train_batch_size: "sixteen"`` fails deep in DeepSpeed with a TypeError, ``"prescale_gradients": "false"`` is
    taken as true): a problem for each other one.  Returns the keys that were not."""
    kinds = scalar_kinds()
    wrong = set()
    for key, value in cfg.items():
        kind = kinds.get(key)
        if key in read and kind and value is not None and not kind_ok(value, kind):
            words = {"whole": "a whole number of at least 1", "bool": "true or false", "int": "a whole number",
                     "float": "a number"}[kind]
            checker.add(key, f"DeepSpeedConfig reads {key} as {words}, not {json.dumps(value)}")
            wrong.add(key)
    return wrong


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


def check_ops(checker: Checker, builders) -> list:
    """Whether this node's accelerator has each op builder of ``builders`` (DeepSpeed's own answer:
    ``get_accelerator().create_op_builder``; the CPU accelerator answers one it lacks with NotImplementedBuilder),
    and whether it can be built here (the builder's ``is_compatible``).  Returns the ops it has."""
    from deepspeed.accelerator import get_accelerator
    accelerator = get_accelerator()
    name = accelerator.device_name()
    found = []
    for builder_name in builders or []:
        builder = accelerator.create_op_builder(builder_name)
        # The op's name as its builder has it (CPUAdamBuilder: cpu_adam), also for one the accelerator lacks.
        op = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_",
                    re.sub(r"Builder$", "", builder_name)).lower()
        if builder is None or type(builder).__name__ == "NotImplementedBuilder":
            checker.add("", f"DeepSpeed's {op} ({builder_name}) does not exist for the {name} accelerator")
        elif not builder.is_compatible(verbose=True):  # verbose: its reason goes to error_log (and stderr)
            why = str(getattr(builder, "error_log", None) or "") or "is_compatible() is false"
            checker.add("", f"DeepSpeed's {op} ({builder_name}) cannot be built on this node for the {name} "
                            f"accelerator: {why}")
        else:
            found.append(op)
    return found


def check(cfg: dict, world_size: int, builders=None) -> dict:
    """The report on ``cfg`` at ``world_size`` on this node's accelerator (``builders``: the ops it needs)."""
    from deepspeed.accelerator import get_accelerator
    checker = Checker(world_size, get_accelerator().device_name())
    read = bare_keys()
    wrong = check_types(checker, cfg, read)
    built = None
    if not wrong:  # DeepSpeedConfig would only fail computing with them
        built, seen = construct(checker, cfg)
        read |= seen
    check_precision(checker, cfg)
    check_offload(checker, cfg)
    check_names(checker, cfg)
    check_keys(checker, cfg, read)
    ops = check_ops(checker, builders)
    derived = {}
    if built is not None:
        derived = {k: getattr(built, k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu",
                                                  "gradient_accumulation_steps")}
    return {"ok": not checker.problems, "accelerator": checker.accelerator, "problems": checker.problems,
            "derived": derived, "ops": ops}


def trainer_config(cfg: dict, world_size: int, accelerator: str | None, trainer_args) -> dict:
    """``cfg`` as the bundled trainer has it (multinode_ds/train.py ``deepspeed_config``): merged over the config it
    generates on CPU, or over the batch sizes it gives on GPU (there the rest depends on the device's memory), with
    ``--micro-batch`` and ``--grad-accum`` from ``trainer_args`` (its defaults without them)."""
    from multinode_ds import ds_config as dsc
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--grad-accum", type=int, default=1)
    known, _rest = parser.parse_known_args(list(trainer_args or []))
    micro, accum = max(1, known.micro_batch), max(1, known.grad_accum)
    if (accelerator or os.environ.get("DS_ACCELERATOR")) == "cpu":
        base = dsc.generate(1, world_size, accelerator="cpu", micro_batch=micro, grad_accum=accum)
    else:
        base = {"train_micro_batch_size_per_gpu": micro, "gradient_accumulation_steps": accum}
    return dsc.merge(base, cfg)


def check_file(path: str, world_size: int, builders=None, bundled=None, accelerator=None) -> dict:
    """The report on the file (``bundled``: the trainer's arguments, when the bundled trainer merges it)."""
    try:
        cfg = load(path)
    except (BadFile, ValueError) as exc:
        checker = Checker(world_size)
        checker.add("", str(exc))
        return {"ok": False, "accelerator": None, "problems": checker.problems, "derived": {}, "ops": []}
    if bundled is not None:
        cfg = trainer_config(cfg, world_size, accelerator, bundled)
    return check(cfg, world_size, builders)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m multinode_ds.ds_check",
                                     description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--config", required=True, help="the DeepSpeed config (JSON); - reads standard input")
    parser.add_argument("--world-size", type=int, required=True, help="the job's data-parallel world size")
    parser.add_argument("--accelerator", choices=("cpu", "cuda"), help="DeepSpeed's accelerator (DS_ACCELERATOR)")
    parser.add_argument("--op", action="append", default=[], metavar="Builder",
                        help="an op builder the config needs (CPUAdamBuilder): does this accelerator have it?")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--bundled", action="store_true",
                        help="check the config as the bundled trainer merges it (its arguments after --)")
    parser.add_argument("trainer_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trainer_args and args.trainer_args[0] == "--":
        args.trainer_args = args.trainer_args[1:]
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
        report = check_file(args.config, args.world_size, args.op,
                            args.trainer_args if args.bundled else None, args.accelerator)
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
