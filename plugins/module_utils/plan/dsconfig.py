# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The user's DeepSpeed config: where it is given (``-e ds_config=`` or ``--deepspeed_config`` in ``args``), and
DeepSpeed's config errors worded as a message that names the key and the values, and a fix.

Pure Python, no DeepSpeed import.  The one table of wordings: the controller reads ``multinode_ds.ds_check``'s
output with it and the run's diagnosis a rank log's assertion line; the node package carries this file as
``multinode_ds/dsconfigcore.py`` (role stack, as ``bench/core.py`` is carried as ``benchcore.py``), so that
``ds_check`` words its problems from the same table.  The texts matched are DeepSpeed's own (0.19:
``runtime/config.py`` ``_batch_assertion``/``_set_batch_related_parameters``/``_do_error_check``,
``runtime/engine.py`` ``_do_sanity_check``/``_scheduler_from_config``/``_configure_basic_optimizer``, pydantic's
``ValidationError``), and the few ``ds_check`` writes for what DeepSpeed only finds mid-run or never.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import difflib
import json
import re
import shlex

# DeepSpeed's launcher flag for the config file, and its old alias.
FLAGS = ("--deepspeed_config", "--deepscale_config")
DOCS = "https://www.deepspeed.ai/docs/config-json/"


# Deeper than this, a file is no DeepSpeed config (DeepSpeed's own nest four levels at most), and Python's own walks
# of it (json, copy) would fail with a RecursionError.
MAX_DEPTH = 32


def too_deep(value, limit=MAX_DEPTH):
    """Where ``value`` (a JSON value) nests deeper than ``limit`` levels, as a key path (``a.b[0]``), or None.
    Walks without recursion."""
    stack = [(value, 0, "")]
    while stack:
        item, depth, where = stack.pop()
        if not isinstance(item, (dict, list)):
            continue
        if depth >= limit:
            return where or "(the top)"
        if isinstance(item, dict):
            pairs = (("%s.%s" % (where, k) if where else str(k), v) for k, v in item.items())
        else:
            pairs = (("%s[%d]" % (where, i), v) for i, v in enumerate(item))
        for path, child in pairs:
            stack.append((child, depth + 1, path))
    return None


def depth_problem(given, where, limit=MAX_DEPTH):
    """The refusal of a config nested deeper than ``limit`` (``where``: too_deep's answer, or None when the JSON
    parser itself gave up)."""
    if where and len(where) > 60:
        where = where[:57] + "..."
    return ("ds_config=%s nests deeper than %d levels%s: not a DeepSpeed config. Fix: give your DeepSpeed JSON "
            "config (its sections nest a few levels)" % (given, limit, " (at %s)" % where if where else ""))


def find_in_args(args):
    """(the config file given in ``args`` or None, ``args`` without it, re-quoted).

    ``args``: the user's shell-quoted arguments; ``--deepspeed_config X`` and ``--deepspeed_config=X`` (or
    ``--deepscale_config``).  ValueError when it is there twice, or has no file after it.
    """
    words = shlex.split(args or "")
    found, rest, i = [], [], 0
    while i < len(words):
        flag, eq, value = words[i].partition("=")
        if flag not in FLAGS:
            rest.append(words[i])
        elif eq:
            found.append((words[i], value))
        elif i + 1 < len(words) and not words[i + 1].startswith("--"):
            found.append(("%s %s" % (flag, words[i + 1]), words[i + 1]))
            i += 1
        else:
            raise ValueError("%s in args has no file after it" % flag)
        i += 1
    if len(found) > 1:
        raise ValueError("the DeepSpeed config is given twice in args: %s \u2014 keep one"
                         % " and ".join(given for given, _path in found))
    return (found[0][1] if found else None), shlex.join(rest)


def choose(flag_path, args):
    """(the config file, ``args`` without ``--deepspeed_config``): ``flag_path`` (``-e ds_config=``) or the one in
    ``args``; ValueError when both are given."""
    in_args, rest = find_in_args(args)
    if flag_path and in_args:
        raise ValueError("ds_config given twice: -e ds_config=%s and --deepspeed_config %s in args \u2014 keep one"
                         % (flag_path, in_args))
    return flag_path or in_args, rest


def _num(text):
    value = float(text)
    return int(value) if value.is_integer() else value


def _batch_sum(m, _ctx):
    train, micro, acc, world = (_num(g) for g in m.groups())
    right = micro * acc * world
    return ("train_batch_size",
            "ds_config: train_batch_size %s \u2260 micro batch %s \u00d7 accumulation %s \u00d7 world %s"
            % (train, micro, acc, world),
            "set train_batch_size to %s, or remove it and DeepSpeed derives it" % right)


def _batch_positive(m, ctx):
    what, value = m.group(1), m.group(2)
    world = ctx.get("world_size")
    at = " at world size %s" % world if world else ""
    if what == "Train batch size":
        return ("train_batch_size", "ds_config: train_batch_size is %s; it must be at least 1" % value,
                "set train_batch_size to micro batch \u00d7 accumulation \u00d7 world size, or remove it and "
                "DeepSpeed derives it")
    if what == "Micro batch size per gpu":
        return ("train_micro_batch_size_per_gpu",
                "ds_config: the micro batch per GPU is %s%s (given, or train_batch_size \u00f7 world size "
                "\u00f7 accumulation)" % (value, at),
                "set train_micro_batch_size_per_gpu to 1 or more, or train_batch_size to at least the world size")
    return ("gradient_accumulation_steps",
            "ds_config: gradient_accumulation_steps is %s%s (given, or train_batch_size \u00f7 micro batch "
            "\u00f7 world size)" % (value, at),
            "set train_batch_size to at least micro batch \u00d7 world size, or remove it and DeepSpeed derives it")


def _batch_missing(_m, _ctx):
    return ("train_micro_batch_size_per_gpu",
            "ds_config: neither train_batch_size nor train_micro_batch_size_per_gpu is set",
            "set train_micro_batch_size_per_gpu (DeepSpeed derives train_batch_size from it)")


def _not_defined(m, _ctx):
    return (m.group(1), "ds_config: %s is 0 or not set" % m.group(1), "set %s to 1 or more" % m.group(1))


def _both_precisions(_m, _ctx):
    return ("fp16.enabled", "ds_config: fp16.enabled and bf16.enabled are both true",
            "keep one: bf16 where the accelerator has it, fp16 otherwise")


def _precision(m, ctx):
    kind, acc = m.group(1), (ctx.get("accelerator") or "").lower()
    if kind == "fp16" and acc == "cpu":
        return ("fp16.enabled", "ds_config: fp16.enabled on CPU workers (no fp16 kernels)",
                "set it false, or bf16 if the workers' CPUs support it")
    where = "%s workers" % acc.upper() if acc else "workers whose accelerator has none"
    other = "bf16" if kind == "fp16" else "fp16"
    return ("%s.enabled" % kind, "ds_config: %s.enabled on %s (no %s support)" % (kind, where, kind),
            "set it false (fp32), or %s if the accelerator has it" % other)


def _names(known, fallback):
    return "one of %s" % ", ".join(known) if known else fallback


def _optimizer(m, ctx):
    return ("optimizer.type", "ds_config: optimizer.type %s is not an optimizer DeepSpeed knows" % m.group(1),
            "use %s, or a torch.optim class name such as AdamW or SGD"
            % _names(ctx.get("known"), "one of DeepSpeed's (adam, adamw, lamb, ...)"))


def _scheduler(m, ctx):
    return ("scheduler.type", "ds_config: scheduler.type %s is not a schedule DeepSpeed knows" % m.group(1),
            "use %s, or a torch.optim.lr_scheduler class name"
            % _names(ctx.get("known"), "one of DeepSpeed's (WarmupLR, WarmupDecayLR, ...)"))


def _nvme_path(_m, ctx):
    key = ctx.get("key") or "zero_optimization.offload_param.nvme_path"
    part = key.rsplit(".", 1)[0]
    return (key, "ds_config: %s.device is nvme but %s is not set" % (part, key),
            "set %s to a directory on the workers' NVMe drive, or device cpu" % key)


def _offload_stage(m, _ctx):
    part, device, need, stage = m.groups()
    section = part.rsplit(".", 1)[1]
    instead = "offloads to CPU memory instead" if section == "offload_optimizer" and stage != "0" else "ignores it"
    return ("%s.device" % part,
            "ds_config: %s.device %s needs ZeRO stage %s, and zero_optimization.stage is %s (DeepSpeed %s)"
            % (part, device, need, stage, instead),
            "set zero_optimization.stage to %s, or remove %s" % (need, section))


def _unknown_key(m, ctx):
    close = difflib.get_close_matches(m.group(1), ctx.get("known") or [], n=1)
    return (m.group(1), "ds_config: %s is not a key DeepSpeed reads (it ignores it)" % m.group(1),
            "remove it%s" % (", or did you mean %s?" % close[0] if close else " or correct its spelling (%s)" % DOCS))


# DeepSpeed's pydantic models -> where their fields are in the file (a rank's log names the model, not the section).
# deepspeed/runtime/zero/config.py, runtime/precision_config.py, comm/config.py, compile/config.py,
# runtime/tensor_parallel/config.py, inference/config.py, runtime/config.py; DeepSpeedMonitorConfig's fields are
# top-level keys (tensorboard, wandb, csv_monitor, comet).
SECTIONS = {"DeepSpeedZeroConfig": "zero_optimization", "DeepSpeedFP16Config": "fp16", "DeepSpeedBF16Config": "bf16",
            "DeepSpeedZeroOffloadOptimizerConfig": "zero_optimization.offload_optimizer",
            "DeepSpeedZeroOffloadParamConfig": "zero_optimization.offload_param", "CommsLoggerConfig": "comms_logger",
            "CompileConfig": "compile", "HybridEngineConfig": "hybrid_engine", "TPTrainingConfig": "tensor_parallel",
            "WeightQuantConfig": "weight_quantization", "DeepSpeedMonitorConfig": ""}


def _in_section(model, field):
    section = SECTIONS.get(model)
    return "%s.%s" % (section, field) if section else field


def _pydantic(m, ctx):
    model, field, why, value = m.groups()
    key = ctx.get("key") or _in_section(model, field)
    if "extra_forbidden" in m.group(0):
        return (key, "ds_config: %s is not a key of DeepSpeed's %s" % (key, model),
                "remove it or correct its spelling (%s)" % DOCS)
    want = _wanted(why)
    return (key, "ds_config: %s %s: %s (DeepSpeed's %s)" % (key, value, why, model),
            "set %s to %s" % (key, want) if want else "give %s a value DeepSpeed accepts" % key)


def _wanted(why):
    """What pydantic's "Input should be ..." asks for: ``one of 0, 1, 2, 3`` for a choice, else its words."""
    if not why.startswith("Input should be "):
        return None
    want = why[len("Input should be "):]
    parts = re.split(r", | or ", want)
    if len(parts) > 1 and all(re.fullmatch(r"'?[\w.+-]+'?", x) for x in parts):
        return "one of " + ", ".join(sorted(set(parts), key=parts.index))
    return want.split(", ")[0]


def _duplicate(m, _ctx):
    keys = ", ".join(re.findall(r"'([^']*)'", m.group(1))) or m.group(1)
    return (keys, "ds_config: %s given twice in the file" % keys,
            "keep one (DeepSpeed refuses a file with a key twice)")


def _not_json(m, _ctx):
    return ("", "ds_config: %s is not JSON (line %s, column %s: %s)" % m.groups(),
            "correct the JSON there (python -m json.tool %s shows where)" % m.group(1))


KINDS = {"whole": "a whole number of at least 1", "bool": "true or false", "int": "a whole number",
         "float": "a number"}


def _kind(m, _ctx):
    key, kind, value = m.groups()
    example = {"true or false": "true", "a number": "1.0"}.get(kind, "16" if key == "train_batch_size" else "1")
    fix = "set %s to %s, such as %s (JSON, without quotes)" % (key, kind, example)
    if key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        fix += ", or remove it and DeepSpeed derives it from the other batch sizes"
    return (key, "ds_config: %s is %s; DeepSpeed reads it as %s" % (key, value, kind), fix)


def _not_section(m, _ctx):
    key, value = m.groups()
    return (key, "ds_config: %s is %s, not a section; DeepSpeed reads it as a JSON object" % (key, value),
            "give %s an object ({...}) of its keys, or remove it (%s)" % (key, DOCS))


JSON_KINDS = {"int": "a number", "float": "a number", "str": "text", "list": "a list", "bool": "true or false",
              "NoneType": "null"}


def _mapping(m, _ctx):
    model, kind = m.groups()
    key = SECTIONS.get(model) or model
    return (key, "ds_config: %s is %s, not a section; DeepSpeed reads it as a JSON object"
            % (key, JSON_KINDS.get(kind, kind)),
            "give %s an object ({...}) of its keys, or remove it (%s)" % (key, DOCS))


def _batch_type(m, _ctx):
    return ("train_batch_size",
            "ds_config: a batch size is not a number (DeepSpeed computed with it: %s)" % m.group(0).strip(),
            "give train_batch_size, train_micro_batch_size_per_gpu and gradient_accumulation_steps whole numbers "
            "(16, not \"16\" or \"sixteen\")")


def _no_op(m, _ctx):
    op, builder, accelerator = m.groups()
    optimizer = op.startswith(("fused_", "cpu_"))
    fix = ("use an optimizer the %s workers have: Adam or AdamW (with or without offload_optimizer), Adagrad, or a "
           "torch.optim class name; Lamb and Lion without offload need GPU workers" % accelerator if optimizer else
           "leave out the setting that needs it on %s workers (aio.use_gds, zero_quantized_*), or use workers whose "
           "accelerator has it" % accelerator)
    return ("optimizer.type" if optimizer else "zero_optimization",
            "ds_config: needs DeepSpeed's %s op (%s), which the %s accelerator does not have (the engine would fail "
            "at its start)" % (op, builder, accelerator), fix)


def _op_incompatible(m, _ctx):
    op, builder, accelerator, why = m.groups()
    return ("optimizer.type" if op.startswith(("fused_", "cpu_")) else "zero_optimization",
            "ds_config: needs DeepSpeed's %s op (%s), which cannot be built on the %s workers: %s"
            % (op, builder, accelerator, why),
            "install what it needs on the workers (the stack role's stack_system_packages), or change the config so "
            "that it does not need %s" % op)


# (regex, wording).  DeepSpeed's texts that fit on one line (what a rank's log holds when DeepSpeed refused the
# config); pydantic's, which take three; ds_check's own, for what DeepSpeedConfig does not check.
DEEPSPEED_TEXTS = [
    (r"train_batch_size is not equal to micro_batch_per_gpu \* gradient_acc_step \* world_size "
     r"(-?[\d.]+) != (-?[\d.]+) \* (-?[\d.]+) \* (-?[\d.]+)", _batch_sum),
    (r"(Train batch size|Micro batch size per gpu|Gradient accumulation steps): (-?[\d.]+) has to be greater than 0",
     _batch_positive),
    (r"Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided", _batch_missing),
    (r"DeepSpeedConfig: (\w+) is not defined", _not_defined),
    (r"bfloat16 and fp16 modes cannot be simultaneously enabled", _both_precisions),
    (r"Type (fp16|bf16) is not supported on your device", _precision),
    (r"module 'torch\.optim' has no attribute '([^']+)'", _optimizer),
    (r"DeepSpeed does not recognize LR scheduler (\S+)", _scheduler),
    (r"\"nvme_path\" in DeepSpeed Config cannot be None if remote device is (?:OffloadDeviceEnum\.)?nvme", _nvme_path),
    (r"Duplicate keys in DeepSpeed config: \[(.*)\]", _duplicate),
]
OTHER_TEXTS = [
    (r"validation errors? for (\w+)\n(\S+)\n\s+(.+?) \[type=[^,\]]+(?:, input_value=([^,\]]*))?", _pydantic),
    (r"(?:[\w.]+\.)?(\w+)\(\) argument after \*\* must be a mapping, not (\w+)", _mapping),
    (r"TypeError: (?:unsupported operand type\(s\) for [^:]+:|'[<>=!]+' not supported between instances of) "
     r"'(?:str|list|dict|NoneType|bool)' and '\w+'", _batch_type),
    (r"DeepSpeedConfig reads (\S+) as (%s), not (.*)$" % "|".join(KINDS.values()), _kind),
    (r"DeepSpeedConfig reads (\S+) as a section, not (.*)$", _not_section),
    (r"DeepSpeed's (\w+) \((\w+)\) does not exist for the (\w+) accelerator", _no_op),
    (r"DeepSpeed's (\w+) \((\w+)\) cannot be built on this node for the (\w+) accelerator: (.*)$", _op_incompatible),
    (r"(zero_optimization\.offload_\w+)\.device (\w+) needs ZeRO stage (\d) \(stage is (\S+)\)", _offload_stage),
    (r"DeepSpeedConfig does not read key '([^']*)'", _unknown_key),
    (r"^(.*) is not JSON: line (\d+) column (\d+): (.*)$", _not_json),
]
# For the run's diagnosis (run/diagnose.py): a log line that holds one of DeepSpeed's texts, the first line of
# pydantic's refusal of a section (the lines after it name the field: LOG_FOLLOW), and a type error DeepSpeed's config
# code raised computing with a batch size given as text (LOG_CONTEXT says where it must come from).
LOG_PATTERN = "|".join(["(?:%s)" % rx for rx, _word in DEEPSPEED_TEXTS] + [
    r"validation errors? for (?:%s)\b" % "|".join(sorted(SECTIONS)),
    r"(?:[\w.]+\.)?(?:%s)\(\) argument after \*\* must be a mapping" % "|".join(sorted(SECTIONS)),
    r"TypeError: (?:unsupported operand type\(s\) for [^:]+:|'[<>=!]+' not supported between instances of) "
    r"'(?:str|list|dict|NoneType|bool)' and '\w+'"])
# How many lines after a matching log line belong to it (pydantic's model, field and reason).
LOG_FOLLOW = 2
# A type error counts only after a frame of DeepSpeed's config code.
LOG_CONTEXT = re.compile(r"deepspeed/runtime/config\.py\", line \d+, in _(?:batch_assertion|set_batch_related_parameters|"
                         r"configure_train_batch_size)")
_COMPILED = [(re.compile(rx, re.S), word) for rx, word in DEEPSPEED_TEXTS + OTHER_TEXTS]


def translate(text, world_size=None, accelerator=None, key=None, known=None):
    """(key, message, fix) for one of DeepSpeed's config errors (``text``: its assertion or exception text, or a
    log line that holds it), or None when ``text`` is none of them.

    ``world_size``: the job's data-parallel world; ``accelerator``: ``cpu``/``cuda`` (the workers'); ``key``: the
    key ds_check found it at (where the text does not name it); ``known``: the names DeepSpeed accepts there.
    """
    ctx = {"world_size": world_size, "accelerator": accelerator, "key": key, "known": known}
    for rx, word in _COMPILED:
        m = rx.search(text or "")
        if m:
            return word(m, ctx)
    return None


def check_result(json_text):
    """The errors in ``multinode_ds.ds_check --json``'s output, each ``message \u2014 fix``, for the play."""
    try:
        report = json.loads(json_text)
    except ValueError:
        lines = (json_text or "").strip().splitlines()
        return ["ds_check gave no result: %s" % (lines[-1] if lines else "no output")]
    out = []
    for problem in report.get("problems", []):
        message, fix = problem.get("message"), problem.get("fix")
        if not fix:
            # A node package without this table: ds_check gave DeepSpeed's text alone.
            worded = translate(problem.get("text"), accelerator=report.get("accelerator"), key=problem.get("key"))
            message, fix = worded[1:] if worded else (message or problem.get("text"), fix)
        out.append("%s \u2014 %s" % (message, fix) if fix else message)
    if not report.get("ok", not out) and not out:
        out.append("ds_check found the config unusable but named no problem")
    return out
