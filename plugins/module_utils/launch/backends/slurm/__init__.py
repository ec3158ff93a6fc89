# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""slurm: the run is a batch job.  The coordinator's agent submits it (sbatch) and follows it; srun starts
every rank (``--kill-on-bad-exit=1``); a run stops with scancel.  No SSH between nodes.

The package is the slurm backend, all of it on the controller's side:

* ``__init__`` (this module): the backend (``SlurmBackend``), its options (``Options``: partition, account,
  sbatch's options) and its start (``Start``: the files it writes, the agent's argv);
* ``batch``: the batch script and the tasks file (``batch_script``, ``tasks_file``) from the job plan;
* ``drain``: a run's drains and their release (``drain_argvs``, ``resume_argvs``).

Slurm's names and configuration (slurm.conf) are in module_utils/provision/slurm_conf.py, the verdicts on a
cluster's Slurm (sinfo, munge, versions) in module_utils/preflight/slurm.py, the node side in multinode_ds/slurm.py
and multinode_ds/slurm_rank.py.

Where ranks start: ``srun --distribution=arbitrary`` with the plan's rank order (``slurm/tasks``), each rank
through ``multinode_ds.slurm_rank`` (the variables DeepSpeed's launcher gives a rank, from srun's).
What watches them: the coordinator's agent, running ``multinode_ds.slurm job`` (scontrol, sinfo, sacct).
How a run stops: the agent's SIGTERM makes ``multinode_ds.slurm job`` run scancel.
Preflight: roles/backend/tasks/slurm/preflight.yml (munge, the partition, Slurm's versions).
Recovery (``-e restarts=N``): a node lost in the run is set to DRAIN with the reason
(roles/backend/tasks/slurm/recover.yml), never waited for; the next attempt is a new job with it in ``--exclude``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import shlex

from ansible_collections.multinode.deepspeed.plugins.module_utils.common.flags import flag
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends.slurm import batch
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.slurm_conf import NAME_RE

# sbatch options the batch script sets from the plan, or that would break how the run is followed.
RESERVED = dict([(o, "the plan's layout: -e hosts/exclude and deepspeed_slots") for o in (
    "--nodes", "--ntasks", "--ntasks-per-node", "--nodelist", "--distribution", "--exclude")] + [
    (o, "the run directory, read back by the watch and the collection") for o in (
        "--output", "--error", "--chdir", "--export", "--parsable", "--wrap", "--array", "--hold")] + [
    ("--time", "-e timeout=<seconds>"), ("--partition", "-e slurm_partition=<name>"),
    ("--account", "-e slurm_account=<name>"), ("--requeue", "a run is resumed on purpose: -e resume=true"),
    ("--exclusive", "-e slurm_exclusive=false")])


class Options(backends.Options):
    """The partition, the account, sbatch's own options, whether to submit; Slurm's node names and GPUs per node."""

    # Inventory or -e variable -> default.
    defaults = {"slurm_partition": "gpu", "slurm_account": None, "slurm_submit": True, "slurm_exclusive": True,
                "slurm_sbatch_args": []}

    def read(self, settings, problems):
        opts = dict((k[len("slurm_"):], settings.get(k, v) if settings.get(k) is not None else v)
                    for k, v in self.defaults.items())
        for key in ("partition", "account"):
            value = opts[key]
            if value not in (None, "") and not NAME_RE.fullmatch(str(value)):
                problems.append("slurm_%s=%r is not a Slurm name (letters, digits, '_', '.', '-'). Fix: -e slurm_%s="
                                "<name>" % (key, value, key))
        extra = opts["sbatch_args"]
        if isinstance(extra, str):
            try:
                extra = shlex.split(extra)
            except ValueError as exc:
                problems.append("slurm_sbatch_args=%r cannot be split (%s). Fix: balance the quotes" % (extra, exc))
                extra = []
        for arg in extra or []:
            arg = str(arg)
            option = arg.split("=", 1)[0]
            if not arg.startswith("--") or any(c in arg for c in "\n\r\\"):
                problems.append("slurm_sbatch_args: %r is not a long sbatch option. Fix: --name=value items, one "
                                "per list element" % (arg,))
            elif option in RESERVED:
                problems.append("slurm_sbatch_args: %s is set from the job plan (%s). Fix: leave it out%s" % (
                    option, RESERVED[option], "" if not RESERVED[option].startswith("-e") else
                    ", and use " + RESERVED[option]))
        opts["sbatch_args"] = [str(a) for a in extra or []]
        for key in ("submit", "exclusive"):
            opts[key] = flag(opts[key])
        return opts

    def check(self, job):
        problems = []
        names = dict(job.get("scheduler_names") or {})
        for key in ("avoid_names", "unquarantine_names"):
            names.update(job.get(key) or {})
        for host, name in sorted(names.items()):
            if not NAME_RE.fullmatch(str(name)):
                problems.append("%s: slurm_node_name=%r is not a Slurm node name (letters, digits, '_', '.', '-'). "
                                "Fix: set it to the name sinfo shows for %s" % (host, name, host))
        slots = sorted(set(job["slots"].values()))
        if job["accelerator"] == "cuda" and len(slots) > 1:
            problems.append("backend=slurm gives every node the same number of GPUs (--gres=gpu:N), but the ranks per "
                            "node differ (%s). Fix: the same deepspeed_slots on every node, or -e hosts= the nodes "
                            "with as many GPUs" % ", ".join("%s=%s" % kv for kv in sorted(job["slots"].items())))
        return problems


class Start(backends.Start):
    """The coordinator's agent submits the batch script and follows the job; srun starts each rank (``rank_argv``).
    Ranks start cold: a rank forked from a warm process would run outside its job step's cgroup, beyond Slurm's
    limits, accounting and kill."""

    warm = False

    def argv(self, job, node):
        return [job["venv"] + "/bin/python", "-m", "multinode_ds.slurm", "job", "--run-dir", job["run_dir"],
                "--host", node]

    @staticmethod
    def rank_argv(job):
        return [job["venv"] + "/bin/python", "-m", "multinode_ds.slurm_rank", "--run-dir", job["run_dir"],
                "--master-addr", job["master_addr"], "--master-port", str(job["master_port"])]

    def files(self, job):
        opts = job["backend_options"]
        names = job.get("scheduler_names") or {}
        return {
            batch.BATCH_SCRIPT: batch.batch_script(job, {"partition": opts["partition"], "account": opts["account"],
                                                         "exclusive": opts["exclusive"],
                                                         "extra": opts["sbatch_args"]},
                                                   self.rank_argv(job), names),
            batch.TASKS_FILE: batch.tasks_file(job, names),
            # Slurm's node names -> the inventory's, for what the run reports.
            batch.NAMES_FILE: json.dumps(dict((v, k) for k, v in sorted(names.items())), sort_keys=True) + "\n",
        }

    def now(self, job):
        return job["backend_options"]["submit"]

    def handoff(self, job):
        script = "%s/%s" % (job["run_dir"], batch.BATCH_SCRIPT)
        return ("The batch script is written: %s (slurm_submit=false). Submit it with: sbatch %s ; the run writes "
                "its logs and metrics under %s." % (script, script, job["run_dir"]))


class SlurmBackend(backends.Backend):
    NAME = "slurm"
    DESCRIPTION = "a Slurm batch job: sbatch on the coordinator, srun starts the ranks, scancel stops them"
    # A node lost in a run is drained (its recover step) and the next attempt's job excludes it.
    ranks = backends.Ranks(launcher_per_node=False, reuse_lost=False)
    options = Options()
    start = Start()
    tasks = backends.Tasks(folder="slurm", steps=("preflight", "recover", "release"))
    # On an abort the workers' agents leave the ranks to scancel (the job ends CANCELLED in the accounting, not
    # FAILED by a rank they killed), then sweep what Slurm left: more than KillWait (the role's 10 s).
    stop = backends.Stop(mode="scancel", sweep_after=15)
