# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The slurm backend's drains: a node lost in a run is set to DRAIN (the reason starts with ``DRAIN_PREFIX``),
and only such a drain is given back (``-e unquarantine=``).

* ``drain_argvs`` / ``resume_argvs``: the ``scontrol update`` argvs (the ``slurm_drain`` filter).

Pure Python, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.slurm_conf import NAME_RE

# The start of every DRAIN reason this collection sets: only such a drain is given back by -e unquarantine=.
DRAIN_PREFIX = "multinode-deepspeed"


def drain_argvs(job, nodes, why):
    """``scontrol update`` setting ``nodes`` (inventory names of the job's) to DRAIN with ``why``: a node lost in a
    run is kept out of every job until the user (or ``-e unquarantine=``) resumes it.  ``[argv]``."""
    names = [(job.get("scheduler_names") or {}).get(n, n) for n in nodes]
    names = [n for n in names if NAME_RE.fullmatch(str(n))]
    if not names:
        return []
    # A Slurm reason is one line of text; scontrol gets it as one argv element (no shell).
    reason = re.sub(r"[^A-Za-z0-9 _.,:;()=/-]+", " ", "%s: %s" % (DRAIN_PREFIX, why))[:200]
    return [["scontrol", "update", "NodeName=%s" % ",".join(names), "State=DRAIN", "Reason=%s" % reason]]


def resume_argvs(job, sinfo_lines):
    """``scontrol update State=RESUME`` for each node the user let out of quarantine (``job["unquarantine_names"]``)
    that this collection drained, from ``sinfo -h -N -o '%N|%E'``'s lines.  ``[argv]``."""
    wanted = set((job.get("unquarantine_names") or {}).values())
    out = []
    for line in sinfo_lines or []:
        name, _sep, reason = str(line).partition("|")
        if name in wanted and reason.startswith(DRAIN_PREFIX) and NAME_RE.fullmatch(name):
            out.append(["scontrol", "update", "NodeName=%s" % name, "State=RESUME"])
            wanted.discard(name)
    return out
