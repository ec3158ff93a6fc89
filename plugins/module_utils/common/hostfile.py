# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""DeepSpeed hostfiles: which hosts are ranks, with how many slots, in which order.

Pure Python, no Ansible import: unit-tested on the controller.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

# What DeepSpeed's hostfile parser accepts as a host name, without spaces or '='.
_HOST_RE = re.compile(r"^[A-Za-z0-9_.:\-\[\]]+$")


class HostfileError(ValueError):
    """A hostfile cannot be built; the message names the host, the variable and the fix."""


def _as_slots(host, value):
    if isinstance(value, bool) or not (
            isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit())):
        raise HostfileError(
            "host %s: slots=%r is not a whole number. "
            "Fix: set the host's slots variable to a whole number >= 1." % (host, value))
    slots = int(value)
    if slots < 1:
        raise HostfileError(
            "host %s: slots=%d; a rank host needs at least one slot. "
            "Fix: give it slots >= 1, or leave it out of the hostfile (exclude)." % (host, slots))
    return slots


def slots_from_vars(hosts, vars_of):
    """Ranks per host: ``deepspeed_slots`` where set, else ``deepspeed_gpu_count`` when above 0.

    ``vars_of(host)`` returns the host's variables.  Hosts with neither are left out (a CPU node
    is never a rank unless the inventory says so); the values are validated by ``build``.
    """
    out = {}
    for host in hosts:
        hv = vars_of(host)
        if "deepspeed_slots" in hv and hv["deepspeed_slots"] is not None:
            out[host] = hv["deepspeed_slots"]
            continue
        try:
            gpus = int(hv.get("deepspeed_gpu_count", 0) or 0)
        except (TypeError, ValueError):
            gpus = 0
        if gpus > 0:
            out[host] = gpus
    return out


def with_slots(names, slots, default_slots=None, variable="deepspeed_slots"):
    """``[{'name', 'slots'}]`` for ``names`` from a name -> slots mapping."""
    out = []
    for name in names:
        value = slots.get(name)
        if value is None:
            value = default_slots
        if value is None:
            raise HostfileError(
                "host %s: no slots known (no accelerator facts and no %s). "
                "Fix: set %s for %s in the inventory, or leave it out of the workers group."
                % (name, variable, variable, name))
        out.append({"name": name, "slots": value})
    return out


def build(hosts, exclude=None, include=None):
    """Validate ``hosts`` (a list of ``{'name': str, 'slots': int}``) and lay out the ranks.

    ``include``: only these hosts (in the order of ``hosts``); ``exclude``: all but these.
    Returns a dict: ``text`` (the hostfile), ``world_size``, ``hosts`` (name, slots,
    first_rank), ``ranks`` (global rank -> host, local rank) and ``master`` (the first host).
    """
    exclude = set(exclude or [])
    names = [h.get("name") for h in hosts]
    for unknown in sorted((set(include or []) | exclude) - set(names)):
        raise HostfileError(
            "host %s is named in include/exclude but is not one of the candidate hosts (%s). "
            "Fix: use inventory names of the rank hosts." % (unknown, ", ".join(names) or "none"))
    seen = set()
    chosen = []
    for h in hosts:
        name = h.get("name")
        if not name or not _HOST_RE.match(str(name)):
            raise HostfileError(
                "host %r: not a valid host name for a hostfile (no spaces, '=' or '#'). "
                "Fix: rename the host in the inventory." % (name,))
        if name in seen:
            raise HostfileError(
                "host %s appears twice; DeepSpeed rejects duplicate hosts. "
                "Fix: list each host once and give it all its slots." % name)
        seen.add(name)
        if name in exclude or (include is not None and name not in include):
            continue
        chosen.append({"name": name, "slots": _as_slots(name, h.get("slots"))})
    if not chosen:
        raise HostfileError(
            "no rank hosts are left (candidates: %s). Fix: put at least one host with slots >= 1 "
            "in the workers group, or loosen include/exclude." % (", ".join(names) or "none"))
    ranks = []
    layout = []
    rank = 0
    for h in chosen:
        layout.append({"name": h["name"], "slots": h["slots"], "first_rank": rank})
        for local in range(h["slots"]):
            ranks.append({"rank": rank, "host": h["name"], "local_rank": local})
            rank += 1
    text = "".join("%s slots=%d\n" % (h["name"], h["slots"]) for h in chosen)
    return {
        "text": text,
        "world_size": rank,
        "hosts": layout,
        "ranks": ranks,
        "master": chosen[0]["name"],
    }


def parse(text):
    """Read a hostfile the way DeepSpeed does: ``host slots=N`` lines, ``#`` comments, blanks."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^(\S+)\s+slots=(\d+)$", line)
        if not m:
            raise HostfileError("bad hostfile line %r; expected 'host slots=N'" % line)
        out.append({"name": m.group(1), "slots": int(m.group(2))})
    return out
