# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What module ``run_prepare`` does on the coordinator, as one function of its parameters: the run's checks (a new
run id, the script, the checkpoint directory free, the bundled trainer's dry run), then its directory, its files
and, when asked, its agent.

Pure Python, no Ansible import: the module runs it under ``AnsibleModule``, and its action plugin in a Python start
of its own on the coordinator (``plugin_utils/node_python``), without Ansible's module wrapper.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import tempfile
import time

from ansible_collections.multinode.deepspeed.plugins.module_utils.common.spawn import run, start_detached
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import lock
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan import workdir
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.node import launcher_env


# The module's argument spec (its action plugin checks a task's arguments against the same one).
ARGUMENT_SPEC = dict(job=dict(type="dict", required=True),
                     write=dict(type="bool", default=True),
                     check=dict(type="bool", default=True),
                     agent=dict(type="dict"))


class PrepareError(Exception):
    """A check that fails: its message names the value and the fix; ``extra`` goes into the module's result."""

    def __init__(self, msg, **extra):
        super(PrepareError, self).__init__(msg)
        self.extra = extra


def lock_holder(job):
    """The live run that holds the job's checkpoint directory, or None (module_utils/launch/lock.py)."""
    path = job.get("checkpoint_lock")
    return lock.holder(path, job["run_id"]) if path else None


def lock_message(job, holder, where):
    how = ("it was handed to you and still runs" if holder.get("handoff")
           else "its controller renewed its lease %.0fs ago" % holder.get("lease_age", 0))
    return ("checkpoint directory %s is in use by run %s (%s; on %s). Fix: wait for %s to end or stop it, or train "
            "another model (-e model=...)" % (job["checkpoint_dir"], holder.get("run_id"), how, where,
                                              holder.get("run_id")))


def take_lock(job, where):
    """Hold the checkpoint directory for this run (a stale holder's lock is replaced; of two plays that find it
    stale, one takes it).  A run handed to the user keeps it while it runs."""
    path = job["checkpoint_lock"]
    # A run with restarts keeps it between its attempts while it waits for its nodes (recover_wait).
    holder = lock.take(path, job["run_id"], job["run_dir"], handoff=not (job.get("launch") or {}).get("start", True),
                       recover_wait=job.get("recover_wait"))
    if holder is not None:
        # This play does not start the run: its claim goes, so that the same run id can be tried again later.
        lock.unclaim(job["run_dir"], job.get("run_token") or job["run_id"])
        raise PrepareError(lock_message(job, holder, where))
    return path


def fail_checks(job):
    """The checks, in order; each failure names the value and the fix."""
    where = job["coordinators"][0] if job.get("coordinators") else "the coordinator"
    holder = lock_holder(job)
    if holder is not None:
        raise PrepareError(lock_message(job, holder, where))
    if os.path.exists(os.path.join(job["run_dir"], "hostfile")):
        raise PrepareError("run_id=%s exists already (%s on %s). Fix: pick another -e run_id, or leave it out for a "
                           "new one." % (job["run_id"], job["run_dir"], where))
    if job.get("workdir"):
        return workspace_check(job, where)
    if not job["metrics"]:
        if not os.path.isfile(job["entrypoint"]):
            raise PrepareError("entrypoint=%s does not exist on %s. Fix: put the script on the shared directory (%s) "
                               "or at the same path on every node, and pass its absolute path."
                               % (job["entrypoint"], where, job["shared_dir"]))
        return None
    env = dict(os.environ, DS_ACCELERATOR=job["accelerator"])
    argv = list(job["dry_run"])
    path = None
    if job.get("ds_config"):
        # The run directory is written later: the dry run reads the config from a file of its own.
        handle, path = tempfile.mkstemp(prefix="multinode-ds-config-", suffix=".json")
        with os.fdopen(handle, "w") as fh:
            fh.write(job["ds_config"]["text"])
        argv[argv.index("--ds-config") + 1] = path
    try:
        rc, out, err = run(argv, env)
    finally:
        if path is not None:
            os.remove(path)
    if rc != 0:
        lines = [x for x in (err or "").splitlines() if x.strip()]
        why = lines[-1] if lines else "exit code %d" % rc
        if why.startswith("multinode_ds: "):
            why = why[len("multinode_ds: "):]
        raise PrepareError("The bundled trainer refuses this run (checked on %s): %s" % (where, why))
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}


def workspace_check(job, where):
    """The shipped workdir's place: ``workspaces/`` the run's account can write, and whether this content is there
    already (its marker, written once it was copied whole, and the tree still the content the marker names); the
    play copies it when it is not. A marked workspace that changed since is said in a warning (it is copied again:
    ``make_room``)."""
    parent = os.path.dirname(job["workdir"]["dest"])
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        raise PrepareError("%s on %s is not a directory the run's account can write, so workdir=%s cannot be copied "
                           "there. Fix: run site.yml (it creates it), or create it owned by the run's account"
                           % (parent, where, job["workdir"]["root"]))
    whole, problem = workspace_state(job)
    out = {"workspace_present": whole}
    if problem:
        out["warnings"] = ["workspace %s was marked whole and has changed since (%s): something wrote into it. It is "
                           "removed and copied again; the ranks' outputs belong in their working directory "
                           "(collected with the run) or $MULTINODE_DS_RUN_DIR" % (job["workdir"]["id"], problem)]
    return out


def workspace_state(job):
    """``(whole, problem)``: whether the workspace is marked and still hashes to the plan's content, and when it is
    marked but not, how it differs."""
    shipped = job["workdir"]
    if not os.path.isfile(shipped["marker"]):
        return False, None
    problem = workdir.verify(shipped["dest"], shipped["hash"])
    return problem is None, problem


def make_room(job, whole=None):
    """Before the copy: a marked workspace whose tree is no longer its content loses its marker and its tree (files
    written into it would stay beside a new copy); the ranks' working directory of this attempt, with a link to each
    top entry of the workspace (``plan/workdir.WORK_DIR``). ``whole``: this call's check found it whole (None: no
    check in this call, so it is hashed here). Returns the working directory."""
    shipped = job["workdir"]
    if whole is None:
        whole = workspace_state(job)[0]
    if os.path.isfile(shipped["marker"]) and not whole:
        os.remove(shipped["marker"])
        workdir.remove(shipped["dest"])
    work = os.path.join(job["run_dir"], workdir.WORK_DIR)
    os.makedirs(work, mode=0o755, exist_ok=True)
    for name in shipped.get("top") or []:
        if "/" in name or name in (".", "..", ""):
            raise PrepareError("the workspace's top entry %r is not a name" % name)
        link = os.path.join(work, name)
        if not os.path.lexists(link):
            os.symlink(os.path.join(shipped["dest"], name), link)
    return work


def env_lines(env):
    return "".join("%s=%s\n" % kv for kv in sorted(env.items()))


def write_file(path, text, mode=0o644):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def prepare(params, check_mode=False):
    """The module's result for its (checked) parameters; raises PrepareError (the message, and ``rc`` for an agent
    that exited at once) for a check that fails."""
    job = params["job"]
    result = {"changed": False, "run_dir": job["run_dir"], "written": []}
    if params["check"]:
        plan = fail_checks(job)
        if job.get("workdir"):
            result.update(plan)
        elif plan is not None:
            result["dry_run"] = plan
    if not params["write"] or check_mode:
        return result
    where = job["coordinators"][0] if job.get("coordinators") else "the coordinator"
    # The exclusive step: the same -e run_id from two terminals gets one run directory.
    taken = lock.claim(job["run_dir"], job.get("run_token") or job["run_id"], job["run_id"], where)
    if taken:
        raise PrepareError(taken)
    for sub in ("logs", "control", "nodes"):
        os.makedirs(os.path.join(job["run_dir"], sub), mode=0o755, exist_ok=True)
    if job.get("workdir"):
        result["written"].append(make_room(job, result.get("workspace_present")))
    # The launch backend's own files (a batch script...), paths under the run directory.
    for name, text in sorted(((job.get("launch") or {}).get("files") or {}).items()):
        path = os.path.normpath(os.path.join(job["run_dir"], name))
        if not path.startswith(job["run_dir"].rstrip("/") + "/"):
            raise PrepareError("the backend's file %s is not under the run directory %s" % (name, job["run_dir"]))
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        write_file(path, text, 0o755 if text.startswith("#!") else 0o644)
        result["written"].append(path)
    if job.get("checkpoint_lock"):
        result["written"].append(take_lock(job, where))
    files = {
        "hostfile": (job["hostfile"], 0o644),
        # The program each rank becomes (multinode_ds.rank reads it: no argument passes through a shell).
        "program.json": (json.dumps(job["program"]) + "\n", 0o644),
        # Strictly KEY=VALUE lines (the plan checked them): the ranks' whole environment, read by multinode_ds.rank,
        # and the part DeepSpeed's launcher may paste into its remote shell command as it is.
        "rank.env": (env_lines(job["env"]), 0o600),
        ".deepspeed_env": (env_lines(launcher_env(job["env"])), 0o600),
        "control/lease": ("%f\n" % time.time(), 0o644),
    }
    if job.get("ds_config"):
        # The user's config with the trackers' monitor sections: the ranks read it (--deepspeed_config/--ds-config).
        files[os.path.relpath(job["ds_config"]["path"], job["run_dir"])] = (job["ds_config"]["text"], 0o644)
    for name, (text, mode) in files.items():
        write_file(os.path.join(job["run_dir"], name), text, mode)
        result["written"].append(os.path.join(job["run_dir"], name))
    result["changed"] = True
    agent = params["agent"]
    if agent and (not job.get("workdir") or os.path.isfile(job["workdir"]["marker"])):
        result.update(start_agent(agent))
    return result


def run_prepare(params):
    """The module's result on the node without Ansible's module wrapper (``plugin_utils/node_python``)."""
    try:
        return prepare(params)
    except PrepareError as exc:
        return dict(exc.extra, failed=True, msg=str(exc))


def start_agent(agent):
    """Start the node's agent now that its run directory is there (``agent``: agent_start's options and ``node``)."""
    argv = agent.get("argv") or []
    if not isinstance(argv, list) or not agent.get("log") or not agent.get("node"):
        raise PrepareError("agent needs argv (a list), log and node, got keys %s" % sorted(agent))
    pid, problem = start_detached([str(a) for a in argv], str(agent["log"]), agent.get("chdir"),
                                  agent.get("environment") or {}, float(agent.get("settle", 0.1)))
    if problem is not None:
        msg, rc = problem
        raise PrepareError("%s (%s's agent)" % (msg, agent["node"]), **({} if rc is None else {"rc": rc}))
    return {"agent_pid": pid, "agent_node": str(agent["node"])}
