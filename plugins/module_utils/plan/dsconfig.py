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


def _pydantic(m, ctx):
    model, field, why, value = m.groups()
    key = ctx.get("key") or field
    if "extra_forbidden" in m.group(0):
        return (key, "ds_config: %s is not a key of DeepSpeed's %s" % (key, model),
                "remove it or correct its spelling (%s)" % DOCS)
    return (key, "ds_config: %s %s: %s (DeepSpeed's %s)" % (key, value, why, model),
            "give %s a value DeepSpeed accepts" % key)


def _duplicate(m, _ctx):
    keys = ", ".join(re.findall(r"'([^']*)'", m.group(1))) or m.group(1)
    return (keys, "ds_config: %s given twice in the file" % keys,
            "keep one (DeepSpeed refuses a file with a key twice)")


def _not_json(m, _ctx):
    return ("", "ds_config: %s is not JSON (line %s, column %s: %s)" % m.groups(),
            "correct the JSON there (python -m json.tool %s shows where)" % m.group(1))


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
    (r"(zero_optimization\.offload_\w+)\.device (\w+) needs ZeRO stage (\d) \(stage is (\S+)\)", _offload_stage),
    (r"DeepSpeedConfig does not read key '([^']*)'", _unknown_key),
    (r"^(.*) is not JSON: line (\d+) column (\d+): (.*)$", _not_json),
]
# For the run's diagnosis (run/diagnose.py): a log line that holds one of DeepSpeed's texts.
LOG_PATTERN = "|".join("(?:%s)" % rx for rx, _word in DEEPSPEED_TEXTS)
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
