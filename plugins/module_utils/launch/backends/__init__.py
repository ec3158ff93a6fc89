# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Launch backends: how the ranks of a planned job start, what watches them, how a run stops.

A backend is one file in this package with one ``Backend`` subclass, listed in ``REGISTRY`` below
(the only place, with the backends' own files, that names them).  It answers from the job plan
(``module_utils/plan/job.py``) alone; it never runs anything:

* ``launchers(job)``: the nodes whose agent starts a DeepSpeed launcher;
* ``agents(job)``: every node that runs the run's agent (launchers and watchers);
* ``launch_argv(job, node)``: the launcher's argv on that node;
* ``ssh_pairs(job)``: the (source, target) SSH logins the launch needs (what preflight checks);
* ``ranks_over_ssh``: whether the ranks start in an SSH login (their limits are that login's);
* ``stop``: how a run is stopped (the agents' lease and ABORT file; scancel for slurm);
* ``SETTINGS`` / ``options(settings, problems)``: the backend's own variables (name -> default), checked;
* ``check(job)``: problems of the planned job that only this backend has;
* ``files(job)``: more files of the run directory (path under it -> text), written with the hostfile;
* ``start(job)`` / ``handoff(job)``: whether the play starts the run, and what it says when it does not;
* ``checks``: the preflight role's tasks file for this backend (``tasks/backend/<checks>.yml``), or None;
* ``ssh_agents(job)``: the agents the play starts over SSH (default: all); the others are started by the
  backend's scheduler (a Kubernetes pod runs its own);
* ``tasks``: the backend's one tasks file for the run, in role ``backend`` (``tasks/<tasks>.yml``), included
  with ``backend_step`` ``start`` (before the agents start) and ``finish`` (after the run is collected,
  whatever its end), or None;
* ``follow(job)`` / ``follower(spec)``: what the watch follows beside the agents' heartbeats (a scheduler's
  view of the ranks), as JSON, and the object that follows it on the controller (``poll``, ``progress``,
  ``record``, ``stop``), or None;
* ``probe_nodes``: whether the watch may probe the rank nodes' SSH port to name one that is cut off.

Pure Python, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class BackendError(ValueError):
    """An unknown backend; the message lists the known ones."""


def flag(value):
    """An inventory or -e boolean as Ansible reads it (its BOOLEANS_FALSE): false, no, off, n, f, 0 are false."""
    if isinstance(value, str):
        return value.strip().lower() not in ("false", "no", "off", "n", "f", "0", "0.0", "")
    return bool(value)


class Backend(object):
    """The interface; see the package's docstring."""

    NAME = None
    DESCRIPTION = ""
    ranks_over_ssh = False
    stop = "lease"
    checks = None
    tasks = None
    probe_nodes = True
    # Seconds a watcher agent waits after an abort for the run's processes to end by themselves (a scheduler
    # stopping its job) before it kills them; 0: at once.
    sweep_after = 0
    # The first signal the agent gives the launcher's process group when the run stops.
    stop_signal = "TERM"
    SETTINGS = {}

    def options(self, settings, problems):
        """The backend's own settings (``SETTINGS``' keys) from ``settings``, checked: each problem is appended
        to ``problems`` with its fix."""
        return {}

    def files(self, job):
        return {}

    def check(self, job):
        """Problems (each with its fix) of the planned job that only this backend has."""
        return []

    def start(self, job):
        return True

    def handoff(self, job):
        return None

    def launchers(self, job):
        raise NotImplementedError

    def ssh_agents(self, job):
        return self.agents(job)

    def follow(self, job):
        return None

    def follower(self, spec):
        return None

    def extra(self, job):
        """What the backend's tasks file reads of the plan, beyond the common description (JSON)."""
        return {}

    def agents(self, job):
        """Launchers first, then every rank node not yet listed."""
        out = list(self.launchers(job))
        out += [h for h in job["rank_hosts"] if h not in out]
        return out

    def launch_argv(self, job, node):
        raise NotImplementedError

    def ssh_pairs(self, job):
        return []

    def ssh_targets(self, job):
        """Per source node, the nodes it must reach over SSH (preflight tries them from there)."""
        out = {}
        for src, dst in self.ssh_pairs(job):
            out.setdefault(src, []).append(dst)
        return out

    @staticmethod
    def deepspeed_argv(job):
        """What every DeepSpeed launch of the job shares: hostfile, master, per-rank logs."""
        return [job["venv"] + "/bin/deepspeed", "--hostfile", job["run_dir"] + "/hostfile",
                "--master_addr", job["master_addr"], "--master_port", str(job["master_port"]),
                "--enable_each_rank_log", job["run_dir"] + "/logs"]

    @staticmethod
    def rank_program(job):
        """What DeepSpeed's launcher starts on each rank: ``multinode_ds.rank``, which reads the program
        (``program.json``) and the environment (``rank.env``, the secrets) from files, so that no value of the
        user's passes through a shell (DeepSpeed's pdsh runner pastes its command line into one)."""
        return ["--module", "multinode_ds.rank", "--run-dir", job["run_dir"]]

    def agent_argv(self, job, node, launch):
        """The node's agent (multinode_ds.agent): it starts ``launch`` (the launcher's argv, or none: it
        only watches), beats, and stops the run's processes on abort or a stale lease."""
        argv = [job["venv"] + "/bin/python", "-m", "multinode_ds.agent", "--run-dir", job["run_dir"],
                "--host", node, "--max-time", str(job["timeout"])]
        if not launch and self.sweep_after:
            argv += ["--sweep-after", str(self.sweep_after)]
        if launch and self.stop_signal != "TERM":
            argv += ["--stop-signal", self.stop_signal]
        return argv + (["--"] + list(launch) if launch else [])

    def describe(self, job):
        """What the playbooks and the watch read: launchers, agents, the argv per launcher and per agent,
        SSH pairs."""
        launchers = self.launchers(job)
        argv = dict((node, self.launch_argv(job, node)) for node in launchers)
        agents = self.agents(job)
        return {"name": self.NAME, "launchers": launchers, "agents": agents, "argv": argv,
                "agent_argv": dict((node, self.agent_argv(job, node, argv.get(node))) for node in agents),
                "ssh_pairs": [list(p) for p in self.ssh_pairs(job)], "ssh_targets": self.ssh_targets(job),
                "ranks_over_ssh": self.ranks_over_ssh, "ssh_agents": self.ssh_agents(job),
                "stop": self.stop, "checks": self.checks, "files": self.files(job), "start": self.start(job),
                "handoff": self.handoff(job), "tasks": self.tasks, "follow": self.follow(job),
                "probe_nodes": self.probe_nodes, "extra": self.extra(job)}


# The registry: one import and one entry per backend.
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends import pdsh  # noqa: E402
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends import ssh_free  # noqa: E402
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends import slurm  # noqa: E402
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends import kubernetes  # noqa: E402

REGISTRY = dict((b.NAME, b) for b in (pdsh.PdshBackend, ssh_free.SshFreeBackend, slurm.SlurmBackend,
                                      kubernetes.KubernetesBackend))
# The backend of a job that names none: DeepSpeed's own default launcher.
DEFAULT = pdsh.PdshBackend.NAME


def get(name):
    """The backend called ``name``, or BackendError naming the known ones."""
    if name not in REGISTRY:
        raise BackendError("backend=%s is not a launch backend. Fix: -e backend=%s (%s)" % (
            name, " or -e backend=".join(sorted(REGISTRY)),
            "; ".join("%s: %s" % (n, REGISTRY[n].DESCRIPTION) for n in sorted(REGISTRY))))
    return REGISTRY[name]()


def setting_names():
    """Every backend's own variables (what the job_plan action reads from the play)."""
    return sorted(set(k for b in REGISTRY.values() for k in b.SETTINGS))
