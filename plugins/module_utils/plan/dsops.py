# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The DeepSpeed ops a config makes the engine load, known from the config before launch, and the node-side steps
that have them built before the ranks start.

DeepSpeed compiles an op the first time a process loads it (JIT, into ``TORCH_EXTENSIONS_DIR``), silently and for
minutes on a CPU node; a compile killed half-way leaves torch's build lock (``<op>/lock``) behind, and every later
load waits on it forever.  So: ``needed(config)`` says which ops the config will load; the plan carries them
(``job["ds_ops"]``), ``multinode_ds.ds_check`` checks that the workers' accelerator has them, and module ``ds_ops``
runs ``multinode_ds.ops_ready`` on every rank node before the agents start: it removes stale build locks and builds
what is missing (``ops_argv``, ``ops_result``).

The rules follow DeepSpeed 0.19.8 (``deepspeed/runtime/engine.py`` and its callers), cited where each is used.
Pure Python, no Ansible or DeepSpeed import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import signal
import subprocess

# DeepSpeed's op builder class -> the op's name (its ``NAME``: the directory under TORCH_EXTENSIONS_DIR).
# deepspeed/ops/op_builder/cpu/{cpu_adam,cpu_adagrad,cpu_lion,fused_adam,async_io}.py, op_builder/{fused_lamb,
# fused_lion,gds,quantizer}.py.
OP_NAMES = {
    "CPUAdamBuilder": "cpu_adam",
    "CPUAdagradBuilder": "cpu_adagrad",
    "CPULionBuilder": "cpu_lion",
    "FusedAdamBuilder": "fused_adam",
    "FusedLambBuilder": "fused_lamb",
    "FusedLionBuilder": "fused_lion",
    "AsyncIOBuilder": "async_io",
    "GDSBuilder": "gds",
    "QuantizerBuilder": "quantizer",
}
# Seconds the node step may take (a CPU node builds CPU Adam in about 100 s of two cores; a GPU node FusedAdam and
# CPU Adam in about 90 s).
DEFAULT_TIMEOUT = 1800


def _section(config, key):
    value = (config or {}).get(key)
    return value if isinstance(value, dict) else {}


def _device(zero, part, legacy):
    """The offload device of ``zero_optimization.<part>`` (``none`` when unset); DeepSpeed's deprecated boolean
    ``<legacy>: true`` means ``cpu`` (deepspeed/runtime/zero/config.py: ``cpu_offload`` and ``cpu_offload_param``,
    whose ``new_param_fn`` makes an offload config with device cpu)."""
    section = zero.get(part)
    if isinstance(section, dict):
        return str(section.get("device") or "none").lower()
    return "cpu" if zero.get(legacy) is True else "none"


def _optimizer(config, zero, bundled):
    """The optimizer type the engine builds from the config (None: the script's own, or none).

    The bundled trainer (multinode_ds/train.py ``deepspeed_builds_optimizer``, ``describe_optimizer``) lets
    DeepSpeed build an ``AdamW`` when the config names no optimizer but has an ``offload_optimizer`` section."""
    optimizer = _section(config, "optimizer")
    if optimizer.get("type") is not None:
        return str(optimizer["type"])
    if bundled and "offload_optimizer" in zero:
        return "AdamW"
    return None


def _optimizer_ops(name, params, cpu_optimizer, where):
    """The op the engine loads for optimizer ``name`` (DeepSpeed lowers the names it knows: runtime/config.py
    lines 518-520); [] for torch's own."""
    lname = name.lower()
    if lname in ("adam", "adamw", "muon"):
        # engine.py get_optimizer_configuration (lines 2377-2409), called by _configure_basic_optimizer for Adam,
        # AdamW (lines 2486-2493) and Muon's Adam half (lines 2530-2534): torch_adam -> torch's; an offloaded
        # optimizer -> DeepSpeedCPUAdam (CPUAdamBuilder().load(), ops/adam/cpu_adam.py line 93); else FusedAdam
        # (FusedAdamBuilder().load(), ops/adam/fused_adam.py line 94).
        if params.get("torch_adam"):
            return []
        if cpu_optimizer:
            return [("CPUAdamBuilder", "optimizer %s with %s (DeepSpeed's CPU Adam)" % (name, where))]
        return [("FusedAdamBuilder", "optimizer %s on the accelerator (DeepSpeed's FusedAdam; \"torch_adam\": true "
                 "in its params uses torch's instead)" % name)]
    if lname == "adagrad" and cpu_optimizer:
        # engine.py lines 2495-2500: DeepSpeedCPUAdagrad when offloaded, torch.optim.Adagrad otherwise.
        return [("CPUAdagradBuilder", "optimizer %s with %s (DeepSpeed's CPU Adagrad)" % (name, where))]
    if lname == "lamb":
        # engine.py lines 2501-2504: always DeepSpeed's FusedLamb.
        return [("FusedLambBuilder", "optimizer %s (DeepSpeed's FusedLamb)" % name)]
    if lname == "lion":
        # engine.py lines 2505-2511: DeepSpeedCPULion when offloaded, FusedLion otherwise.
        if cpu_optimizer:
            return [("CPULionBuilder", "optimizer %s with %s (DeepSpeed's CPU Lion)" % (name, where))]
        return [("FusedLionBuilder", "optimizer %s on the accelerator (DeepSpeed's FusedLion)" % name)]
    return []


def _swap_ops(config, zero, opt_device, param_device):
    """NVMe offload swaps through DeepSpeed's async I/O op (runtime/swap_tensor/partitioned_optimizer_swapper.py
    line 29, pipelined_optimizer_swapper.py line 55; parameters: partitioned_param_swapper.py lines 95-96, GDS when
    ``aio.use_gds``); ZeRO-3's quantized weights and gradients load the quantizer op
    (runtime/zero/partition_parameters.py lines 1153-1154, runtime/comm/coalesced_collectives.py line 34)."""
    out = []
    if opt_device == "nvme":
        out.append(("AsyncIOBuilder", "zero_optimization.offload_optimizer.device nvme (DeepSpeed's async I/O)"))
    if param_device == "nvme":
        if _section(config, "aio").get("use_gds") is True:
            out.append(("GDSBuilder", "zero_optimization.offload_param.device nvme with aio.use_gds (GPUDirect "
                                      "Storage)"))
        else:
            out.append(("AsyncIOBuilder", "zero_optimization.offload_param.device nvme (DeepSpeed's async I/O)"))
    quantized = [k for k in ("zero_quantized_weights", "zero_quantized_nontrainable_weights",
                             "zero_quantized_gradients") if zero.get(k) is True]
    if quantized and str(zero.get("stage")) == "3":
        out.append(("QuantizerBuilder", "zero_optimization.%s with ZeRO stage 3 (DeepSpeed's quantizer)"
                    % quantized[0]))
    return out


def needed(config, bundled=False):
    """The ops DeepSpeed loads for ``config`` (a dict), in order: ``[{"builder", "op", "why"}]``.

    ``bundled``: the config is merged over the bundled trainer's (which lets DeepSpeed build an AdamW when the
    config offloads the optimizer and names none).  A script's config that offloads the optimizer and names none
    gets CPU Adam too: DeepSpeed refuses any other client optimizer there (engine.py lines 2342-2346,
    ``zero_force_ds_cpu_optimizer``), so the script passes DeepSpeedCPUAdam.  What the script's own code loads is
    not known here."""
    zero = _section(config, "zero_optimization")
    opt_device = _device(zero, "offload_optimizer", "cpu_offload")
    param_device = _device(zero, "offload_param", "cpu_offload_param")
    # engine.py zero_use_cpu_optimizer (lines 1562-1565): an optimizer offloaded to cpu or nvme runs on the CPU.
    cpu_optimizer = opt_device in ("cpu", "nvme")
    where = "zero_optimization.offload_optimizer.device %s" % opt_device
    name = _optimizer(config, zero, bundled)
    if name is not None:
        found = _optimizer_ops(name, _section(_section(config, "optimizer"), "params"), cpu_optimizer, where)
    elif cpu_optimizer and not bundled and (config or {}).get("zero_force_ds_cpu_optimizer", True) is not False:
        found = [("CPUAdamBuilder", "%s with no optimizer section: DeepSpeed takes only its CPU Adam (or CPU Lion) "
                  "from the script there" % where)]
    else:
        found = []
    out, seen = [], set()
    for builder, why in found + _swap_ops(config, zero, opt_device, param_device):
        if builder not in seen:
            seen.add(builder)
            out.append({"builder": builder, "op": OP_NAMES[builder], "why": why})
    return out


def check_args(ops, entrypoint, args):
    """What ``multinode_ds.ds_check`` gets beside the config: the ops to look for on the node's accelerator, and for
    the bundled trainer (no ``entrypoint``) its arguments, to check the config as the trainer merges it."""
    out = []
    for op in ops or []:
        out += ["--op", op["builder"]]
    if not entrypoint:
        out += ["--bundled", "--"] + list(args or [])
    return out


def ops_argv(venv, extensions_dir, ops, wait):
    """``multinode_ds.ops_ready``'s argv on a rank node: remove stale build locks under ``extensions_dir``, then
    have each op of ``ops`` built (``--op NAME=Builder``), waiting at most ``wait`` seconds for a build another
    process holds."""
    argv = [venv.rstrip("/") + "/bin/python", "-m", "multinode_ds.ops_ready", "--extensions-dir", extensions_dir,
            "--wait", str(int(wait)), "--json"]
    for op in ops or []:
        argv += ["--op", "%s=%s" % (op["op"], op["builder"])]
    return argv


def fix_for(op, accelerator=None):
    """The fix for an op that cannot be had on the node."""
    builder = dict((v, k) for k, v in OP_NAMES.items()).get(op, op)
    return ("change the config so that it does not need %s (for an optimizer: \"torch_adam\": true in the "
            "optimizer's params, or a torch.optim class name), or provision it: add %s to stack_ops%s in your "
            "inventory and run site.yml" % (op, builder, ".%s" % accelerator if accelerator else ""))


def ops_result(text, host, accelerator=None, err=""):
    """``(lines, problems)`` from ``ops_ready --json``'s output on ``host`` (``err``: its standard error): what it
    did (stale locks removed, ops built, with their seconds) and each problem as ``host: message \u2014 fix``."""
    try:
        report = json.loads(text)
    except ValueError:
        last = [x for x in ((text or "") + "\n" + (err or "")).splitlines() if x.strip()]
        if "No module named multinode_ds.ops_ready" in (err or ""):
            return [], ["%s: the node package there has no multinode_ds.ops_ready (it is older than the collection) "
                        "\u2014 run site.yml (it copies the package to every node)" % host]
        return [], ["%s: the DeepSpeed ops step gave no result: %s" % (host, last[-1] if last else "no output")]
    if not isinstance(report, dict):
        return [], ["%s: the DeepSpeed ops step gave no result: %r" % (host, report)]
    lines = []
    for lock in report.get("removed") or []:
        lines.append("%s: removed the stale build lock %s (%s)" % (host, lock.get("path"), lock.get("why")))
    for built in report.get("built") or []:
        lines.append("%s: built DeepSpeed's %s in %.0f s" % (host, built.get("op"), float(built.get("seconds") or 0)))
    for op in report.get("ready") or []:
        lines.append("%s: %s was built already" % (host, op))
    problems = ["%s: %s \u2014 %s" % (host, p.get("message"), p.get("fix") or fix_for(p.get("op"), accelerator))
                for p in report.get("problems") or []]
    return lines, problems


def call(argv, data=None, timeout=DEFAULT_TIMEOUT, env=None):
    """``(rc, stdout, stderr, timed_out)`` of ``argv`` with ``data`` on standard input, stopped (its whole process
    group: SIGTERM, then SIGKILL after 10 s) when it runs past ``timeout`` seconds.  ``rc`` is None when it could
    not start (``stderr`` says why)."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, env=env)
    except OSError as exc:
        return None, "", "cannot start %s: %s" % (argv[0], exc), False
    payload = data.encode("utf-8") if isinstance(data, str) else data
    try:
        out, err = proc.communicate(payload, timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
        out, err = _stop(proc)
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), timed_out


def _stop(proc):
    """Stop a command's process group; what it wrote until then."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except OSError:
            pass
        try:
            return proc.communicate(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
    return b"", b""
