# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight: do the nodes run the same stack?

The rank nodes must share one exact build (python, torch, CUDA, NCCL, DeepSpeed, transformers, the
trainer); the coordinator, which runs the launcher, shares the keys that do not depend on the
accelerator.  The odd node out is blamed, whichever it is.  Also the version table as site.yml
prints it.  Pure functions, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.verdicts import FAIL, PASS, verdict

# Stack keys every node shares (the coordinator runs the launcher), and the exact builds the
# rank nodes share (same as site.yml's check).
COMMON_KEYS = ("python", "deepspeed", "transformers", "trainer")
RANK_KEYS = ("python", "torch", "cuda", "nccl", "deepspeed", "transformers", "trainer")

# The columns of the version table.
VERSION_COLUMNS = ("python", "torch", "cuda", "nccl", "deepspeed", "transformers", "trainer")


def _majority(values, order):
    """The value most hosts have (ties: the one the earliest host in ``order`` has)."""
    counts = {}
    for host in order:
        if host in values:
            counts[values[host]] = counts.get(values[host], 0) + 1
    best = max(counts.values())
    for host in order:
        if host in values and counts[values[host]] == best:
            return values[host], [h for h in order if values.get(h) == values[host]]
    return None, []


def version_verdicts(versions, workers, coordinators):
    """The rank nodes share one exact stack; the coordinator shares its common keys.

    The reference is, per key, the value most rank nodes have (ties: the first rank node's), so the
    odd node out is the one blamed, whichever it is. ``versions``: host -> dict (python, torch, cuda,
    nccl, deepspeed, transformers, trainer), or a dict with ``error`` / a string: why they could not be read.
    """
    out = []
    readable = [w for w in workers if isinstance(versions.get(w), dict) and not versions[w].get("error")]
    ref = {}
    for key in RANK_KEYS:
        if readable:
            ref[key] = _majority(dict((w, versions[w].get(key)) for w in readable), readable)
    for host in list(workers) + [c for c in coordinators if c not in workers]:
        mine = versions.get(host)
        if not isinstance(mine, dict) or mine.get("error"):
            why = mine.get("error") if isinstance(mine, dict) else mine
            out.append(verdict("versions", host, FAIL, "cannot read the stack's versions: %s" % (why or "no answer"),
                               "run site.yml so that %s gets the venv and the trainer" % host))
            continue
        keys = RANK_KEYS if host in workers else COMMON_KEYS
        text = " ".join("%s %s" % (k, mine.get(k)) for k in keys)
        diff = []
        for k in keys:
            if k in ref and mine.get(k) != ref[k][0]:
                others = [h for h in ref[k][1] if h != host]
                names = ", ".join(others[:3]) + (" ..." if len(others) > 3 else "")
                verb = "has" if len(others) == 1 else "have"
                diff.append("%s %s (%s %s %s)" % (k, mine.get(k), names, verb, ref[k][0]))
        if diff:
            out.append(verdict("versions", host, FAIL, "differs: %s" % "; ".join(diff),
                               "run site.yml (without --limit) so that %s gets the chosen stack again" % host))
        else:
            out.append(verdict("versions", host, PASS, text))
    return out


def version_table(nodes, versions, gpus, workers):
    """The version table (as site.yml prints it): host, role, GPUs, then one column per version."""
    lines = ["%-14s%-8s%-26s" % ("host", "role", "gpus") + "".join("%-16s" % c for c in VERSION_COLUMNS)]
    for host in nodes:
        acc = gpus.get(host) or {}
        count = int(acc.get("count") or 0)
        gpu_text = "%d x %s" % (count, "/".join(acc.get("names") or [])) if count else "-"
        row = versions.get(host) or {}
        lines.append("%-14s%-8s%-26s" % (host, "worker" if host in workers else "coord", gpu_text)
                     + "".join("%-16s" % row.get(c, "?") for c in VERSION_COLUMNS))
    return "\n".join(lines)
