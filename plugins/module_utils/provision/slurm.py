# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slurm: its configuration from the inventory and the facts, its commands' output read back, the run's batch
script, and the verdicts on a cluster's Slurm.

* ``conf_nodes`` / ``conf_problems`` / ``render_conf`` / ``render_gres`` / ``render_dbd``: what role ``slurm``
  writes (slurm.conf, gres.conf, slurmdbd.conf);
* ``parse_sinfo`` / ``partition_verdicts``: ``sinfo -h -N -o '%N|%P|%T|%E'`` read back, and whether a partition
  has the job's nodes, idle;
* ``parse_sacct`` / ``parse_scontrol`` / ``job_record``: a job's record (id, state, exit code, elapsed, nodes);
* ``rank_failures``: srun's own lines on a rank that failed (node, rank, exit code or signal);
* ``batch_script`` / ``tasks_file``: the run as a batch job (sbatch), from the job plan.

Pure Python, no Ansible import: unit-tested on the controller with the commands' real output.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
import shlex

# Slurm's names (nodes, partitions, the cluster): what its config parser and hostlists take without quoting.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
CLUSTER_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")
# Node states (sinfo's %T, long form, flags like '*' or '~' stripped) where a node cannot run or keep a job.
BAD_NODE_STATES = ("down", "drained", "draining", "fail", "failing", "not_responding", "inval", "future",
                   "unknown", "power_down", "powered_down", "powering_down", "reboot_issued", "maint")
# Where the job's files go, under the run directory.
BATCH_SCRIPT = "slurm/job.sbatch"
TASKS_FILE = "slurm/tasks"
NAMES_FILE = "slurm/names.json"


class SlurmError(ValueError):
    """A Slurm setting or a command's output that cannot be used; the message names the fix."""


# --------------------------------------------------------------------------- configuration

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


# --------------------------------------------------------------------------- reading Slurm

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

    Returns verdicts (check, host, status, detail, fix) as module_utils/preflight/evaluate.verdict makes them."""
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


# --------------------------------------------------------------------------- the run as a batch job

def _time_limit(seconds):
    minutes = max(1, (int(seconds) + 59) // 60)
    return "%d:%02d:00" % (minutes // 60, minutes % 60)


def tasks_file(job, names=None):
    """One line per rank, in the plan's rank order (srun --distribution=arbitrary reads it as SLURM_HOSTFILE)."""
    names = names or {}
    lines = []
    for host in job["rank_hosts"]:
        lines += [names.get(host, host)] * int(job["slots"][host])
    return "\n".join(lines) + "\n"


def batch_script(job, options, rank_argv, names=None):
    """The run as an sbatch script: every value from the job plan, every argument quoted for bash.

    ``options``: partition, account (or None), exclusive (bool), extra (list of more #SBATCH arguments).
    ``rank_argv``: what srun starts for each rank (the rank shim and the program)."""
    names = names or {}
    q = shlex.quote
    hosts = [names.get(h, h) for h in job["rank_hosts"]]
    slots = [int(job["slots"][h]) for h in job["rank_hosts"]]
    run_dir = job["run_dir"]
    head = ["--job-name=%s" % ("mnds-" + job["run_id"])[:64],
            "--nodes=%d" % len(hosts), "--nodelist=%s" % ",".join(hosts), "--ntasks=%d" % job["world_size"]]
    if options.get("partition"):
        head.append("--partition=%s" % options["partition"])
    if options.get("account"):
        head.append("--account=%s" % options["account"])
    if len(set(slots)) == 1:
        head.append("--ntasks-per-node=%d" % slots[0])
    if job["accelerator"] == "cuda":
        # The backend's check refuses uneven ranks per node on GPUs: every node gets its slots' GPUs.
        head.append("--gres=gpu:%d" % max(slots))
    head.append("--time=%s" % _time_limit(job["timeout"]))
    if options.get("exclusive", True):
        head.append("--exclusive")
    avoid = [n for h, n in sorted((job.get("avoid_names") or {}).items())]
    if avoid:
        # The nodes that failed earlier in this run (drained by its recovery): never this job's, by name too.
        head.append("--exclude=%s" % ",".join(avoid))
    # A run fails fast and is resumed on purpose (-e resume=true), never started again behind the user's back.
    head.append("--no-requeue")
    head += ["--chdir=%s" % run_dir, "--output=%s/slurm/batch-%%j.out" % run_dir]
    head += list(options.get("extra") or [])
    srun = ["srun", "--kill-on-bad-exit=1", "--distribution=arbitrary", "--ntasks=%d" % job["world_size"],
            "--cpu-bind=none", "--output=%s/logs/slurm_rank%%t.log" % run_dir] + list(rank_argv)
    body = [
        "#!/bin/bash",
        "# A run as a Slurm batch job, written by multinode.deepspeed from its job plan.",
        "# Submit it with sbatch; rank r runs on line r+1 of the tasks file (rank 0 on the master).",
    ]
    body += ["#SBATCH %s" % q(x) for x in head]
    body += [
        "set -eu",
        "export SLURM_HOSTFILE=%s" % q(run_dir + "/" + TASKS_FILE),
        "echo \"multinode.deepspeed: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, %d ranks\"" % job["world_size"],
        "exec " + " ".join(q(x) for x in srun),
    ]
    return "\n".join(body) + "\n"


# --------------------------------------------------------------------------- preflight

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


# --------------------------------------------------------------------------- recovery

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
