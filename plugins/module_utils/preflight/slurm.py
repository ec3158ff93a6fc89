# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight: the verdicts on a cluster's Slurm, from its commands' output.

* ``parse_sinfo`` / ``partition_verdicts``: ``sinfo -h -N -o '%N|%P|%T|%E'`` read back, and whether a partition
  has the job's nodes, idle (module ``slurm_facts``);
* ``preflight_verdicts``: munge and Slurm's versions across the job's nodes (filter ``slurm_preflight``).

A job's record (scontrol, sacct) and srun's lines on failed ranks are read on the node, by ``multinode_ds.slurm``.
Pure Python, no Ansible import: unit-tested on the controller with the commands' real output.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

# Node states (sinfo's %T, long form, flags like '*' or '~' stripped) where a node cannot run or keep a job.
BAD_NODE_STATES = ("down", "drained", "draining", "fail", "failing", "not_responding", "inval", "future",
                   "unknown", "power_down", "powered_down", "powering_down", "reboot_issued", "maint")


def _node_state(text):
    """sinfo's long state without its flags: 'idle*' -> 'idle', 'mixed~' -> 'mixed', 'down*' -> 'down'."""
    return re.sub(r"[*~#!%$@^+-]+$", "", text.strip().lower())


def parse_sinfo(text):
    """``sinfo -h -N -o '%N|%P|%T|%E'`` -> [{"node", "partition" (without the default's '*'), "default",
    "state", "raw_state", "reason"}]."""
    rows = []
    for line in (text or "").splitlines():
        parts = line.strip().split("|")
        if len(parts) < 3 or not parts[0]:
            continue
        part = parts[1].strip()
        reason = parts[3].strip() if len(parts) > 3 else ""
        rows.append({"node": parts[0].strip(), "partition": part.rstrip("*"), "default": part.endswith("*"),
                     "state": _node_state(parts[2]), "raw_state": parts[2].strip(),
                     "reason": "" if reason == "none" else reason})
    return rows


def partition_verdicts(rows, partition, nodes, controller):
    """Does ``partition`` hold every one of ``nodes``, each able to take the job now?

    Returns verdicts (check, host, status, detail, fix) as ``verdicts.verdict`` (this folder) makes them."""
    out = []
    in_part = dict((r["node"], r) for r in rows if r["partition"] == partition)
    if not rows:
        return [{"check": "slurm partition", "host": controller, "status": "fail",
                 "detail": "sinfo lists no nodes", "fix": "start slurmctld and slurmd (ansible-playbook site.yml -e "
                 "slurm=true), or point the coordinator at the cluster's Slurm"}]
    if not in_part:
        known = sorted(set(r["partition"] for r in rows))
        return [{"check": "slurm partition", "host": controller, "status": "fail",
                 "detail": "partition %s does not exist (sinfo shows %s)" % (partition, ", ".join(known)),
                 "fix": "-e slurm_partition=<one of %s>" % ", ".join(known)}]
    for node in nodes:
        row = in_part.get(node)
        if row is None:
            where = sorted(r["partition"] for r in rows if r["node"] == node)
            out.append({"check": "slurm partition", "host": node, "status": "fail",
                        "detail": "%s is not in partition %s%s" % (
                            node, partition, " (it is in %s)" % ", ".join(where) if where else
                            " nor in any partition: slurm.conf does not define it"),
                        "fix": "add %s to partition %s in slurm.conf (site.yml -e slurm=true writes it from the "
                               "inventory), or leave it out with -e exclude=%s" % (node, partition, node)})
            continue
        state = row["state"]
        if state in BAD_NODE_STATES or row["raw_state"].endswith("*"):
            why = " (%s)" % row["reason"] if row["reason"] else ""
            out.append({"check": "slurm partition", "host": node, "status": "fail",
                        "detail": "%s is %s in Slurm%s" % (node, row["raw_state"], why),
                        "fix": "look at slurmd on %s (/var/log/slurm/slurmd.log), then scontrol update "
                               "nodename=%s state=resume" % (node, node)})
        elif state == "idle":
            out.append({"check": "slurm partition", "host": node, "status": "pass",
                        "detail": "idle in partition %s" % partition, "fix": None})
        else:
            out.append({"check": "slurm partition", "host": node, "status": "warn",
                        "detail": "%s is %s: the exclusive job waits until it is idle" % (node, row["raw_state"]),
                        "fix": "squeue -w %s shows what runs there" % node})
    return out


def preflight_verdicts(controller, munge, versions):
    """Verdicts on what the slurm backend needs beyond the partition: a munge credential made on the
    controller decodes on every node (one key, munged running, clocks close enough), and every node runs the
    controller's Slurm version.

    ``munge``: host -> {"rc", "stderr"} of ``unmunge`` fed the controller's credential; ``versions``: host ->
    the version its Slurm daemon or client reports (``slurmd -V`` / ``sinfo --version``), or None."""
    out = []
    for host in sorted(munge):
        res = munge[host] or {}
        if res.get("rc") == 0:
            out.append({"check": "slurm munge", "host": host, "status": "pass",
                        "detail": "decodes %s's munge credential" % controller, "fix": None})
        else:
            err = (res.get("stderr") or res.get("msg") or "exit code %s" % res.get("rc")).strip().splitlines()
            why = err[-1] if err else "no answer"
            fix = ("copy %s's /etc/munge/munge.key to %s and restart munge there (site.yml -e slurm=true does)"
                   % (controller, host))
            if "Expired" in why or "Rewound" in why:
                fix = "synchronize the clocks of %s and %s (chrony or systemd-timesyncd)" % (controller, host)
            elif "connect" in why.lower() or "socket" in why.lower():
                fix = "start munged on %s (service munge start)" % host
            out.append({"check": "slurm munge", "host": host, "status": "fail",
                        "detail": "cannot decode %s's munge credential: %s" % (controller, why), "fix": fix})
    want = _version(versions.get(controller))
    for host in sorted(versions):
        have = _version(versions[host])
        if have is None:
            out.append({"check": "slurm version", "host": host, "status": "fail",
                        "detail": "no Slurm found (%s)" % (versions[host] or "command missing"),
                        "fix": "install Slurm on %s (site.yml -e slurm=true)" % host})
        elif want is not None and have != want:
            out.append({"check": "slurm version", "host": host, "status": "fail",
                        "detail": "runs Slurm %s but %s runs %s" % (have, controller, want),
                        "fix": "install Slurm %s on %s (the same packages on every node)" % (want, host)})
        else:
            out.append({"check": "slurm version", "host": host, "status": "pass", "detail": "Slurm %s" % have,
                        "fix": None})
    return out


def _version(text):
    m = re.search(r"(\d+\.\d+\.\d+)", text or "")
    return m.group(1) if m else None
