# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The slurm backend's batch job: the run as an sbatch script, and the tasks file that places its ranks.

* ``BATCH_SCRIPT`` / ``TASKS_FILE`` / ``NAMES_FILE``: where the job's files go, under the run directory;
* ``batch_script`` / ``tasks_file``: the files' text, every value from the job plan.

Pure Python, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import shlex

# Where the job's files go, under the run directory.
BATCH_SCRIPT = "slurm/job.sbatch"
TASKS_FILE = "slurm/tasks"
NAMES_FILE = "slurm/names.json"


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
