# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Node health in preflight (issue 47, point 3): a node far slower than its peers, or than it was, is kept out of a
run before it costs one.

Each rank node measured itself (multinode_ds/health.py: its matmul GFLOP/s, its memory copy GB/s, its write speed
to the shared directory), all nodes at once.  Each figure is compared with the median of the other rank nodes'
and with the median of the node's own figures in its last passing preflights (the controller keeps them, one file
beside the preflight records).  Below ``health_fraction`` of its peers it is a failure (``health_action=fail``) or
a warning (``warn``), with the figure, the reference and the fix; below that share of its own past only a warning,
unless the node has no peer in the job (the past was measured under another load; the peers at the same moment).
A slow memory copy or write to the shared directory is only a warning.  On a GPU node, what nvidia-smi and the
kernel log say of its GPUs is judged too (gpu_health.py).

Pure functions, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight import gpu_health
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.verdicts import FAIL, PASS, WARN, verdict

# figure -> (what the node does, unit, what to look at when it is low)
METRICS = (
    ("compute_gflops", "computes", "GFLOP/s",
     "check what else runs on it, its CPU or GPU clocks and cooling, and any CPU quota (nvidia-smi -q -d "
     "PERFORMANCE on a GPU node)"),
    ("memory_gbps", "copies memory at", "GB/s", "check what else runs on it and its memory configuration"),
    ("shared_write_mbps", "writes to the shared directory at", "MB/s",
     "check its network link and the shared directory's server"),
    ("gpu_gflops", "computes on its slowest GPU at", "GFLOP/s", gpu_health.COOLING_FIX),
)
# A shared directory's speed also depends on its server and its other clients at that moment, and one memory copy's
# on what shares the memory bus then (on the local cluster, under the suite's load, a healthy worker copied at 39% of
# its peer): a slow figure of these is named (a warning), never the reason a run does not start.
WARN_ONLY = ("memory_gbps", "shared_write_mbps")
FRACTION = 0.5
# Past figures kept per node, and how many make a reference.
HISTORY = 10
LEAST_HISTORY = 3


def parse(result):
    """The figures from the health command's registered result (its last stdout line, JSON), or ``{"error"}``."""
    if not isinstance(result, dict) or result.get("skipped"):
        return None
    if result.get("failed") or result.get("rc"):
        return {"error": str(result.get("stderr") or result.get("msg") or "exit code %s" % result.get("rc"))[-300:]}
    lines = [ln for ln in str(result.get("stdout") or "").splitlines() if ln.strip()]
    try:
        figures = json.loads(lines[-1])
    except (IndexError, ValueError):
        return {"error": "no figures in its output"}
    return figures if isinstance(figures, dict) else {"error": "no figures in its output"}


def _number(value):
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def _shown(value):
    """A figure as people read it: 1360, 243, 38.1, 2.5."""
    return "%.0f" % value if value >= 100 else "%.3g" % value


def _median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2.0


def _figure_problems(host, mine, figures, history, fraction):
    """(message, fix, refuses) for the node's figures below ``fraction`` of its peers' median or its own past's."""
    out = []
    for key, does, unit, fix in METRICS:
        value = _number(mine.get(key))
        if value is None:
            continue
        peers = [_number((figures[h] or {}).get(key)) for h in figures if h != host]
        peers = [p for p in peers if p is not None]
        # Its peers, measured at the same moment, are the fair reference; its own past (another load, another
        # day) decides alone only when it has no peer.
        if peers and value < fraction * _median(peers):
            out.append(("%s %s %s %s, %.0f%% of the other nodes' median %s %s" % (
                host, does, _shown(value), unit, 100 * value / _median(peers), _shown(_median(peers)), unit), fix,
                key not in WARN_ONLY))
        past = [_number(p.get(key)) for p in (history or {}).get(host) or [] if isinstance(p, dict)]
        past = [p for p in past if p is not None]
        if len(past) >= LEAST_HISTORY and value < fraction * _median(past):
            out.append(("%s %s %s %s, %.0f%% of its own median %s %s over its last %d passing preflights" % (
                host, does, _shown(value), unit, 100 * value / _median(past), _shown(_median(past)), unit, len(past)),
                fix, key not in WARN_ONLY and not peers))
    return out


def _gpu_past(history, host):
    """The kernel log lines the node's last passing preflights recorded, and the most GPUs they listed."""
    past = [p for p in (history or {}).get(host) or [] if isinstance(p, dict)]
    counts = [p["gpus"] for p in past if isinstance(p.get("gpus"), int)]
    return (set(line for p in past for line in p.get("xid") or [] if isinstance(line, str)),
            max(counts) if counts else None)


def health_verdicts(figures, history=None, fraction=FRACTION, action="fail"):
    """One verdict per rank node (``figures``: node -> parse's result; ``history``: node -> its past figures)."""
    status = WARN if action == "warn" else FAIL
    out = []
    for host in sorted(figures):
        mine = figures[host] or {}
        if mine.get("error"):
            out.append(verdict("health", host, WARN, "not measured: %s" % mine["error"],
                               "check that the stack's venv on %s has numpy (run site.yml)" % host))
            continue
        problems = _figure_problems(host, mine, figures, history, fraction)
        gpu_problems, note = gpu_health.problems(host, mine.get("gpu"), *_gpu_past(history, host), fraction=fraction)
        problems += gpu_problems
        if problems:
            refusing = [p for p in problems if p[2]]
            out.append(verdict("health", host, status if refusing else WARN, "; ".join(p[0] for p in problems),
                               "%s; or run without it (-e exclude=%s), or -e preflight_health_action=warn" % (
                                   (refusing or problems)[0][1], host)))
        else:
            shown = ["%s%s %s" % ("slowest GPU " if key == "gpu_gflops" else "", _shown(_number(mine.get(key))), unit)
                     for key, _does, unit, _fix in METRICS
                     if _number(mine.get(key)) is not None] + ([note] if note else [])
            out.append(verdict("health", host, PASS, ", ".join(shown) or "no figures"))
    return out


def updated_history(history, figures, keep=HISTORY):
    """``history`` with each node's figures of a passing preflight added (its newest ``keep`` kept), the Xid lines
    of its kernel log then (seen: not judged again) and how many GPUs nvidia-smi listed."""
    out = dict((h, list(v)) for h, v in (history or {}).items() if isinstance(v, list))
    for host, mine in sorted((figures or {}).items()):
        if isinstance(mine, dict) and not mine.get("error"):
            kept = dict((k, mine.get(k)) for k, _d, _u, _f in METRICS if _number(mine.get(k)) is not None)
            gpu = mine.get("gpu") if isinstance(mine.get("gpu"), dict) else {}
            if isinstance(gpu.get("xid"), list) and gpu["xid"]:
                kept["xid"] = [str(line)[:300] for line in gpu["xid"]][-gpu_health.XID_KEPT:]
            if gpu_health.listed(gpu):
                kept["gpus"] = gpu_health.listed(gpu)
            if kept:
                out[host] = (out.get(host, []) + [kept])[-keep:]
    return out
