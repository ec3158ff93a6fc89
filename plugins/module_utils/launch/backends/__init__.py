# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Launch backends: where the ranks of a planned job run, how they start, what follows them, how a run stops.

A backend is one module of this package (a file, or a package of its own when it has more to say, as
``kubernetes/`` and ``slurm/``) with one ``Backend`` subclass, listed in ``REGISTRY`` below (the only place, with the
backends' own modules, that names them), and at most one folder of tasks in role ``backend``, one file per step.
It answers from the job plan (``module_utils/plan/job.py``) alone; it never runs anything.  A backend is six small
parts, each with defaults; a backend changes what differs, a part's data with keyword arguments
(``Stop(signal="KILL")``), its logic in a subclass:

* ``ranks`` (``Ranks``): where the ranks run: the launchers, the agents, the SSH logins the launch needs;
* ``options`` (``Options``): the backend's own variables, read and checked, and its checks of the planned job;
* ``start`` (``Start``): how the ranks start: the launcher's argv, more files of the run directory, whether the play
  starts the run;
* ``tasks`` (``Tasks``): the backend's steps in role ``backend`` (``roles/backend/tasks/<folder>/<step>.yml``), and
  what they read of the plan;
* ``watch`` (``Watch``): what the watch follows beside the agents' heartbeats;
* ``stop`` (``Stop``): how a run stops: the agents' argv, their first signal, the scheduler's turn.

``Backend.describe(job)`` is what the plan records under ``launch``.  docs/backends.md lists the whole interface.

Pure Python, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json
import shlex
from collections import OrderedDict

from ansible_collections.multinode.deepspeed.plugins.module_utils.common.lease import lease_timeout


class BackendError(ValueError):
    """An unknown backend; the message lists the known ones."""


class Part(object):
    """One part of a backend: ``Part(name=value, ...)`` changes its data; a subclass changes its logic."""

    def __init__(self, **changes):
        for key, value in changes.items():
            if not hasattr(self, key):
                raise TypeError("%s has no %s" % (type(self).__name__, key))
            setattr(self, key, value)


class Ranks(Part):
    """Where the ranks run: the nodes that start a launcher, the nodes that run an agent, the SSH the launch needs."""

    # A launcher on every rank node (DeepSpeed's per-node launch.py), or one on the coordinator.
    launcher_per_node = True
    # The launcher logs in to every node over SSH, and the ranks start in that login (its limits: memlock).
    over_ssh = False
    # The play starts the agents over SSH; False: the backend's scheduler starts them (a Kubernetes pod runs its own).
    agents_over_ssh = True
    # The launcher starts the agent of every rank node that is not a launcher's (pdsh's remote command, before
    # DeepSpeed's launcher); the play starts the launchers' agents only.
    agents_by_launcher = False
    # A node lost, cut off or stalled may take ranks again in the run's next attempt once it answers and its stack
    # is unchanged; False: the backend's scheduler keeps it out (its ``recover`` tasks step, e.g. Slurm's DRAIN).
    reuse_lost = True

    def launchers(self, job):
        """The nodes whose agent starts a launcher."""
        return list(job["rank_hosts"] if self.launcher_per_node else job["coordinators"][:1])

    def agents(self, job):
        """Every node that runs the run's agent: the launchers first, then every rank node not yet listed."""
        out = list(self.launchers(job))
        out += [h for h in job["rank_hosts"] if h not in out]
        return out

    def ssh_agents(self, job):
        """The agents the play starts over SSH."""
        if not self.agents_over_ssh:
            return []
        return self.launchers(job) if self.agents_by_launcher else self.agents(job)

    def launcher_agents(self, job):
        """The agents the launcher starts (``agents_by_launcher``): every rank node's that is not a launcher's."""
        launchers = self.launchers(job)
        return [h for h in job["rank_hosts"] if h not in launchers] if self.agents_by_launcher else []

    def secret_hosts(self, job):
        """The rank nodes where the play writes the run's secrets over SSH (a scheduler's pods get them otherwise)."""
        return list(job["rank_hosts"]) if self.agents_over_ssh else []

    def ssh_pairs(self, job):
        """The (source, target) SSH logins the launch needs (what preflight checks)."""
        return []

    def ssh_targets(self, job):
        """Per source node, the nodes it must reach over SSH (preflight tries them from there)."""
        out = {}
        for src, dst in self.ssh_pairs(job):
            out.setdefault(src, []).append(dst)
        return out


class Options(Part):
    """The backend's own variables (inventory or -e), read and checked, and its checks of the planned job."""

    # Variable -> default: what the job_plan action reads from the play (``setting_names``).
    defaults = {}

    def read(self, settings, problems):
        """The backend's options (``job["backend_options"]``) from ``settings``: each problem is appended to
        ``problems`` with its fix."""
        return {}

    def check(self, job):
        """Problems (each with its fix) of the planned job that only this backend has."""
        return []


class Start(Part):
    """How the ranks start: the launcher's argv, more files of the run directory, whether the play starts the run."""

    # Ranks may fork from the node's warm process (multinode_ds.warm, -e warm_start): False where a rank must be the
    # launcher's own child (a scheduler's job step, whose cgroup and accounting a forked rank would escape).
    warm = True

    def argv(self, job, node):
        """The launcher's argv on ``node``: by default DeepSpeed's per-node launcher (``node_launch_argv``), whose
        program is ``rank_program`` (never ``job["program"]``)."""
        return self.node_launch_argv(job, node) + self.rank_program(job)

    @staticmethod
    def node_launch_argv(job, node):
        """DeepSpeed's per-node launcher, ``deepspeed.launcher.launch``, for ``node``: what ``deepspeed --hostfile H
        --no_ssh --node_rank <i>`` starts, with the same arguments, without that runner in front of it.  With
        ``--no_ssh`` the runner only turns the hostfile into ``--world_info`` (and reads no ``.deepspeed_env``), yet
        it is a Python start of its own that imports DeepSpeed and torch first: 1.5 s before every node's launcher
        here.  ``launch.py`` then starts the node's ranks, gives them their variables and stops them, as it does
        under the runner."""
        return launch_argv(job, str(list(job["rank_hosts"]).index(node)))

    def files(self, job):
        """More files of the run directory (path under it -> text), written with the hostfile."""
        return {}

    def now(self, job):
        """Whether the play starts the run; False: it writes the run directory and stops, saying ``handoff``."""
        return True

    def handoff(self, job):
        return None

    @staticmethod
    def rank_program(job):
        """What DeepSpeed's launcher starts on each rank: ``multinode_ds.rank``, which reads the program
        (``program.json``) and the environment (``rank.env``, the secrets) from files, so that no value of the
        user's passes through a shell (DeepSpeed's pdsh runner pastes its command line into one)."""
        return ["--module", "multinode_ds.rank", "--run-dir", job["run_dir"]]


def launch_argv(job, node_rank, sep=None):
    """``deepspeed.launcher.launch`` (``multinode_ds.node_launcher`` for warm ranks) with the job's world, master and
    per-rank logs, as node ``node_rank`` (a number, or pdsh's ``%n``); ``sep="="``: each option and its value as one
    word (``--node_rank=%n``), as DeepSpeed's pdsh runner writes them."""
    options = [("--world_info", world_info(job)), ("--node_rank", node_rank), ("--master_addr", job["master_addr"]),
               ("--master_port", str(job["master_port"])), ("--enable_each_rank_log", job["run_dir"] + "/logs")]
    # With warm ranks, multinode_ds.node_launcher: the same launcher, forked from the node's warm process (its
    # imports of DeepSpeed and torch done), cold when there is none.
    argv = [job["venv"] + "/bin/python", "-u", "-m",
            "multinode_ds.node_launcher" if job.get("warm") else "deepspeed.launcher.launch"]
    for name, value in options:
        argv += [name + sep + value] if sep else [name, value]
    return argv


def agent_shell(backend, job, node_index):
    """Shell words that start the node's agent (``backend.stop.agent_argv``, watching) when the launcher starts the
    rank nodes' agents (``Ranks.agents_by_launcher``), then go on (``... && ``); "" when it does not.  The node is
    known by its index in ``rank_hosts`` (``node_index``, e.g. pdsh's ``%n``): each rank node's name is a quoted word
    of the command, never text a remote tool pastes in.  A launcher's own node starts no second agent.  The agent
    gets a session of its own (no signal of the login's end reaches it), standard input from /dev/null and its
    output appended to its log, as ``agent_start`` starts it."""
    hosts = backend.ranks.launcher_agents(job)
    if not hosts:
        return ""
    index = dict((h, n) for n, h in enumerate(job["rank_hosts"]))
    name = "\0host"  # a word no argv holds: the node's name in the agent's argv, read from $h
    agent = " ".join('"$h"' if w == name else shlex.quote(w)
                     for w in backend.stop.agent_argv(job, name, None) + ["--ready-fd", "3"]
                     + (["--warm"] if job.get("warm") else []))  # every one a rank node's
    # The ranks start only once the agent watches the run: it writes "ready" to descriptor 3 (the command
    # substitution's pipe, which ends when the agent closes it or exits); else the node's command fails, naming it.
    return ('case %s in %s *) h= ;; esac && { [ -z "$h" ] || { r=$(setsid -f %s 3>&1 </dev/null '
            '>>%s/nodes/"$h".agent.log 2>&1) && [ "$r" = ready ]; } || { echo "the run\'s agent on $h is not '
            'running (nodes/$h.agent.log says why): its ranks are not started" >&2; exit 1; }; } && ' % (
                node_index, " ".join("%d) h=%s ;;" % (index[h], shlex.quote(h)) for h in hosts), agent,
                shlex.quote(job["run_dir"])))


def world_info(job):
    """DeepSpeed's ``--world_info``: the rank hosts in the hostfile's order, each with its local slot indices, as
    URL-safe base64 of JSON (the runner's ``encode_world_info`` of its parsed hostfile)."""
    info = OrderedDict((host, list(range(int(job["slots"][host])))) for host in job["rank_hosts"])
    return base64.urlsafe_b64encode(json.dumps(info).encode("utf-8")).decode("ascii")


class Tasks(Part):
    """The backend's steps in role ``backend``: one tasks file per step, ``roles/backend/tasks/<folder>/<step>.yml``
    (the role's entry point ``<folder>/<step>``, with its argument spec)."""

    # Where each step is included (the playbooks include a step only when the backend has it):
    #   preflight  role preflight's checks (sets backend_verdicts for its report)
    #   check      train.yml after the plan, when no preflight makes the checks (fails before anything changes)
    #   start      tasks/start.yml, every attempt, before the agents start
    #   finish     tasks/attempt.yml, after the attempt is collected, whatever its end
    #   recover    tasks/recover.yml, after a failed attempt is judged retried (backend_failed: the nodes to keep out)
    #   release    train.yml with -e unquarantine=, the nodes let out given back to the scheduler
    STEPS = ("preflight", "check", "start", "finish", "recover", "release")

    # The folder of its steps in role backend (roles/backend/tasks/<folder>/), or None; the steps it has there.
    folder = None
    steps = ()

    def entry_points(self):
        """``{step: "<folder>/<step>"}``: role backend's entry point (its ``tasks_from``) for each step it has."""
        unknown = sorted(set(self.steps) - set(self.STEPS))
        if unknown:
            raise ValueError("%s: unknown backend steps %s (the steps are %s)" % (
                self.folder, ", ".join(unknown), ", ".join(self.STEPS)))
        return dict((step, "%s/%s" % (self.folder, step)) for step in self.steps) if self.folder else {}

    def extra(self, job):
        """What the tasks files read of the plan, beyond the common description (JSON)."""
        return {}


class Watch(Part):
    """What the watch follows beside the agents' heartbeats."""

    # Whether the watch may probe the rank nodes' SSH port to name one that is cut off.
    probe_nodes = True

    def follow(self, job):
        """What the watch follows (a scheduler's view of the ranks), as JSON, or None."""
        return None

    def follower(self, spec):
        """The object that follows ``spec`` on the controller (``poll``, ``progress``, ``record``, ``stop``), or None."""
        return None


class Stop(Part):
    """How a run stops: the agents' lease and ABORT file, and what each agent does then."""

    # "lease": the agents stop their process groups; "scancel": the scheduler cancels the job.
    mode = "lease"
    # The first signal the agent gives the launcher's process group when the run stops.
    signal = "TERM"
    # Seconds a watcher agent waits after an abort for the run's processes to end by themselves (a scheduler
    # stopping its job) before it kills them; 0: at once.
    sweep_after = 0
    # Seconds what the run left running after its launcher's exit (a watcher: after DONE) gets to end by itself
    # before the agent stops it and names it (left_pids).
    leftover_grace = 5

    def agent_argv(self, job, node, launch):
        """The node's agent (multinode_ds.agent): it starts ``launch`` (the launcher's argv, or none: it
        only watches), beats, and stops the run's processes on abort or a stale lease (``--lease-timeout``: longer
        than the watch goes without renewing it while it still retries, ``common/lease.lease_timeout``)."""
        argv = [job["venv"] + "/bin/python", "-m", "multinode_ds.agent", "--run-dir", job["run_dir"],
                "--run-id", job["run_id"], "--host", node, "--max-time", str(job["timeout"]),
                "--lease-timeout", "%g" % lease_timeout(), "--leftover-grace", "%g" % self.leftover_grace]
        if not launch and self.sweep_after:
            argv += ["--sweep-after", str(self.sweep_after)]
        if launch and self.signal != "TERM":
            argv += ["--stop-signal", self.signal]
        if job.get("warm") and node in job["rank_hosts"]:
            argv += ["--warm"]  # a rank node's agent keeps a warm process for its ranks (multinode_ds.warm)
        return argv + (["--"] + list(launch) if launch else [])


class Backend(object):
    """A launch backend: its name and its parts (see the package's docstring)."""

    NAME = None
    DESCRIPTION = ""
    ranks = Ranks()
    options = Options()
    start = Start()
    tasks = Tasks()
    watch = Watch()
    stop = Stop()

    # What preflight and the watch ask of a backend directly.
    @property
    def ranks_over_ssh(self):
        return self.ranks.over_ssh

    def ssh_pairs(self, job):
        return self.ranks.ssh_pairs(job)

    def follower(self, spec):
        return self.watch.follower(spec)

    def describe(self, job):
        """What the playbooks and the watch read (the plan's ``launch``): launchers, agents, the argv per launcher
        and per agent, SSH pairs, and each part's answer."""
        ranks, start, tasks, watch = self.ranks, self.start, self.tasks, self.watch
        launchers = ranks.launchers(job)
        argv = dict((node, start.argv(job, node)) for node in launchers)
        agents = ranks.agents(job)
        return {"name": self.NAME, "launchers": launchers, "agents": agents, "argv": argv,
                "agent_argv": dict((node, self.stop.agent_argv(job, node, argv.get(node))) for node in agents),
                "ssh_pairs": [list(p) for p in ranks.ssh_pairs(job)], "ssh_targets": ranks.ssh_targets(job),
                "ranks_over_ssh": ranks.over_ssh, "ssh_agents": ranks.ssh_agents(job),
                "secret_hosts": ranks.secret_hosts(job),
                "stop": self.stop.mode, "steps": tasks.entry_points(), "files": start.files(job), "start": start.now(job),
                "handoff": start.handoff(job),
                "reuse_lost": ranks.reuse_lost, "follow": watch.follow(job),
                "probe_nodes": watch.probe_nodes, "extra": tasks.extra(job)}


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
    return sorted(set(k for b in REGISTRY.values() for k in b.options.defaults))
