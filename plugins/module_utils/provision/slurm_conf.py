# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slurm's configuration: what role ``slurm`` writes (slurm.conf, gres.conf, slurmdbd.conf) from the inventory
and the facts, and the Slurm names it validates.

* ``NAME_RE`` / ``CLUSTER_RE``: the node, partition and cluster names Slurm takes without quoting;
* ``node_from_hostvars``: what slurm.conf needs of one node, from its hostvars;
* ``conf_nodes`` / ``conf_problems`` / ``scheduler_parameters``: the NodeName lines' values, every reason the
  settings cannot make a slurm.conf, and its SchedulerParameters;
* ``render_conf`` / ``render_gres`` / ``render_dbd``: the files' text.

The verdicts on a running cluster's Slurm are in module_utils/preflight/slurm.py, the slurm launch backend (its
batch script, its drains) in module_utils/launch/backends/slurm/.

Pure Python, no Ansible import: unit-tested on the controller.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

# Slurm's names (nodes, partitions, the cluster): what its config parser and hostlists take without quoting.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
CLUSTER_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")


class SlurmError(ValueError):
    """A Slurm setting that cannot be used; the message names the fix."""


def node_from_hostvars(hv):
    """What slurm.conf needs of one node, from its hostvars (facts gathered): Slurm's name for it
    (``slurm_node_name``, default the inventory name), its own hostname, the address the cluster reaches it at,
    CPUs, memory and GPUs."""
    facts = hv.get("ansible_facts") or {}
    name = hv.get("slurm_node_name") or hv.get("inventory_hostname")
    gpus = (hv.get("multinode_accelerators") or {}).get("count") or hv.get("deepspeed_gpu_count") or 0
    return {"name": name, "hostname": facts.get("hostname") or hv.get("ansible_hostname") or name,
            "addr": hv.get("cluster_hosts_address") or hv.get("ansible_host") or name,
            "cpus": facts.get("processor_vcpus") or hv.get("ansible_processor_vcpus") or 1,
            "memtotal_mb": facts.get("memtotal_mb") or hv.get("ansible_memtotal_mb") or 0, "gpus": int(gpus)}


def conf_nodes(hosts, memory_fraction=0.95):
    """``hosts``: [{"name", "hostname", "addr", "cpus", "memtotal_mb", "gpus"}] -> the NodeName lines' values.
    RealMemory is a fraction of what the kernel reports, in 512 MB steps: slurmd refuses a node whose configured
    memory is more than it finds, and the kernel's total moves by a few MB between boots."""
    out = []
    for h in hosts:
        # Whole 512 MB steps: the kernel's total moves by a few MB between boots, slurm.conf should not.
        mem = int(int(h.get("memtotal_mb") or 0) * float(memory_fraction)) // 512 * 512
        out.append({"name": h["name"], "hostname": h.get("hostname") or h["name"], "addr": h.get("addr") or h["name"],
                    "cpus": int(h.get("cpus") or 1), "real_memory": max(mem, 1), "gpus": int(h.get("gpus") or 0)})
    return out


def conf_problems(settings, controller, nodes):
    """Every reason the settings cannot make a slurm.conf, each naming the host, the variable and the fix."""
    problems = []
    if not CLUSTER_RE.fullmatch(str(settings.get("cluster_name") or "")):
        problems.append("slurm_cluster_name=%r: lower-case letters, digits, '_' and '-', at most 40 (Slurm's "
                        "accounting keeps it in lower case). Fix: -e slurm_cluster_name=<such a name>"
                        % settings.get("cluster_name"))
    partition = str(settings.get("partition") or "")
    if not NAME_RE.fullmatch(partition) or partition.lower() == "default":
        problems.append("slurm_partition=%r is not a partition name (letters, digits, '_', '.', '-'; not DEFAULT). "
                        "Fix: -e slurm_partition=<name>" % partition)
    if not nodes:
        problems.append("no workers for Slurm's compute nodes. Fix: put the GPU nodes in the inventory's workers group")
    for node in nodes:
        if not NAME_RE.fullmatch(node["name"]):
            problems.append("%s: its inventory name is not a Slurm node name (letters, digits, '_', '.', '-'). Fix: "
                            "rename it in the inventory" % node["name"])
    names = [n["name"] for n in nodes]
    for extra in settings.get("partition_nodes") or []:
        if extra not in names:
            problems.append("slurm_partition_nodes lists %s, which is not a worker of this inventory, so slurm.conf "
                            "would not define it. Fix: add %s to the workers group, or remove it from "
                            "slurm_partition_nodes" % (extra, extra))
    if controller and controller in names:
        problems.append("%s is both the Slurm controller (the coordinator) and a compute node. Fix: keep the "
                        "coordinator out of the workers group" % controller)
    for key in ("slurmd_timeout", "kill_wait"):
        value = settings.get(key)
        if isinstance(value, bool) or not str(value).isdigit() or int(str(value)) < 1:
            problems.append("slurm_%s=%r must be a whole number of seconds >= 1. Fix: -e slurm_%s=<seconds>"
                            % (key, value, key))
    delay = settings.get("batch_sched_delay", 0)
    if isinstance(delay, bool) or not str(delay).isdigit():
        problems.append("slurm_batch_sched_delay=%r must be a whole number of seconds >= 0. Fix: -e "
                        "slurm_batch_sched_delay=0" % (delay,))
    interval = settings.get("backfill_interval", 1)
    if isinstance(interval, bool) or not str(interval).isdigit() or not 1 <= int(str(interval)) <= 10800:
        problems.append("slurm_backfill_interval=%r must be a whole number of seconds from 1 to 10800 (Slurm's "
                        "range). Fix: -e slurm_backfill_interval=1" % (interval,))
    if settings.get("accounting") not in ("slurmdbd", "none"):
        problems.append("slurm_accounting=%r: slurmdbd or none. Fix: -e slurm_accounting=slurmdbd"
                        % settings.get("accounting"))
    return problems


def scheduler_parameters(settings):
    """``SchedulerParameters``: ``slurm_conf_extra``'s, with ``bf_interval`` and ``batch_sched_delay`` where it
    does not set them itself.

    slurmctld does not place a batch job when sbatch submits it: its background loop schedules the queued batch
    jobs about once a second, and not within ``batch_sched_delay`` seconds (Slurm's default 3) of the last
    scheduling pass.  So a run's job that follows another job's start or end (the next attempt of a run, a run
    right after another) would wait up to that long; the role's default, 0, leaves only the loop's second.  The
    backfill scheduler starts a job that can run now too, every ``bf_interval`` seconds (Slurm's default 30); at
    the role's 1 its pass falls between the loop's, and a new job waits about a third of a second on average
    instead of half of one."""
    given = [p for p in str((settings.get("extra") or {}).get("SchedulerParameters") or "").split(",") if p]
    keys = set(p.split("=", 1)[0] for p in given)
    if "bf_interval" not in keys:
        given.append("bf_interval=%d" % int(str(settings.get("backfill_interval", 1))))
    if "batch_sched_delay" not in keys:
        given.append("batch_sched_delay=%d" % int(str(settings.get("batch_sched_delay", 0))))
    return ",".join(given)


def _hostlist(names):
    return ",".join(names)


def render_conf(settings, controller, nodes):
    """slurm.conf for a controller ``{"name", "hostname", "addr"}`` and ``conf_nodes(...)``.

    ``settings``: cluster_name, partition, partition_nodes (default: every node), slurmd_timeout, kill_wait,
    batch_sched_delay, backfill_interval, accounting (slurmdbd or none), proctrack, task_plugin, select_parameters,
    extra (dict of more lines; its SchedulerParameters are merged with bf_interval and batch_sched_delay)."""
    problems = conf_problems(settings, controller and controller["name"], nodes)
    if problems:
        raise SlurmError("; ".join(problems))
    members = list(settings.get("partition_nodes") or [n["name"] for n in nodes])
    gres = sorted(set("gpu" for n in nodes if n["gpus"]))
    lines = [
        "# Written by the multinode.deepspeed.slurm role from the inventory and the nodes' facts: edits are replaced.",
        "ClusterName=%s" % settings["cluster_name"],
        "SlurmctldHost=%s(%s)" % (controller["hostname"], controller["addr"]),
        "SlurmUser=slurm",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "StateSaveLocation=/var/lib/slurm/slurmctld",
        "SlurmdSpoolDir=/var/lib/slurm/slurmd",
        "SlurmctldPidFile=/run/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd.pid",
        "SlurmctldLogFile=/var/log/slurm/slurmctld.log",
        "SlurmdLogFile=/var/log/slurm/slurmd.log",
        "ProctrackType=%s" % settings.get("proctrack", "proctrack/linuxproc"),
        "TaskPlugin=%s" % settings.get("task_plugin", "task/none"),
        "SelectType=select/cons_tres",
        "SelectTypeParameters=%s" % settings.get("select_parameters", "CR_Core_Memory"),
        "SchedulerType=sched/backfill",
        "SchedulerParameters=%s" % scheduler_parameters(settings),
        "ReturnToService=1",
        "SlurmdTimeout=%s" % settings.get("slurmd_timeout", 60),
        "KillWait=%s" % settings.get("kill_wait", 10),
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/linux",
        "JobAcctGatherFrequency=30",
    ]
    if settings.get("accounting", "slurmdbd") == "slurmdbd":
        lines += ["AccountingStorageType=accounting_storage/slurmdbd",
                  "AccountingStorageHost=%s" % controller["hostname"]]
    else:
        lines += ["AccountingStorageType=accounting_storage/none"]
    if gres:
        lines.append("GresTypes=%s" % ",".join(gres))
    for key, value in sorted((settings.get("extra") or {}).items()):
        if key != "SchedulerParameters":
            lines.append("%s=%s" % (key, value))
    for n in nodes:
        line = "NodeName=%s NodeHostname=%s NodeAddr=%s CPUs=%d RealMemory=%d" % (
            n["name"], n["hostname"], n["addr"], n["cpus"], n["real_memory"])
        if n["gpus"]:
            line += " Gres=gpu:%d" % n["gpus"]
        lines.append(line + " State=UNKNOWN")
    lines.append("PartitionName=%s Nodes=%s Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
                 % (settings["partition"], _hostlist(members)))
    return "\n".join(lines) + "\n"


def render_gres(nodes):
    """gres.conf: each GPU node's devices (/dev/nvidia0..N-1), or an empty file (no GPU nodes)."""
    lines = ["# Written by the multinode.deepspeed.slurm role: the GPUs nvidia-smi found on each node."]
    for n in nodes:
        if n["gpus"]:
            devices = "/dev/nvidia0" if n["gpus"] == 1 else "/dev/nvidia[0-%d]" % (n["gpus"] - 1)
            lines.append("NodeName=%s Name=gpu File=%s" % (n["name"], devices))
    return "\n".join(lines) + "\n"


def render_dbd(controller_hostname, storage_loc="slurm_acct_db"):
    """slurmdbd.conf: slurmdbd and MariaDB on the controller; the slurm user logs in to MariaDB over its Unix
    socket (unix_socket authentication), so there is no password to store, log or leak."""
    return "\n".join([
        "# Written by the multinode.deepspeed.slurm role.",
        "AuthType=auth/munge",
        "DbdHost=%s" % controller_hostname,
        "SlurmUser=slurm",
        "LogFile=/var/log/slurm/slurmdbd.log",
        "PidFile=/run/slurmdbd.pid",
        "StorageType=accounting_storage/mysql",
        "StorageHost=localhost",
        "StorageUser=slurm",
        "StorageLoc=%s" % storage_loc,
    ]) + "\n"
