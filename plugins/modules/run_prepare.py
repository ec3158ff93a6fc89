#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: run_prepare
short_description: Check a planned run on the coordinator, then write its directory, in one call
version_added: "0.3.0"
description:
  - Checks first, writing nothing - the run id is new (its directory has no hostfile yet; one a failed preflight left
    is reused), the user's script exists (with a workdir - C(job.workdir) - that C(<shared_dir>/workspaces) can take
    it, and whether this content is there already - RV(workspace_present)), and the bundled trainer's dry run (C(job.dry_run)) accepts the model, data,
    config and memory.
  - For the bundled trainer, the run's checkpoint directory must not be held by another live run (its
    C(<checkpoint_dir>.lock) names a run that is not done or aborted and whose controller renewed its lease in the
    last minute, or that was handed to the user, whose heartbeats, metrics or logs changed in the last minute and
    whose ranks have not all finished; a lock that cannot be read is held);
    writing takes the lock (the watch gives it back when the run ends). The lock is written whole (a temporary file
    and a rename) under an exclusive C(flock) of C(<lock>.guard), so of two runs only one takes it.
  - Writing first claims the run directory - C(control/claim), created exclusively with the play's token - so the
    same C(-e run_id) from two terminals gets one run, and the other play fails naming it.
  - Then, unless O(write=false), creates the run directory (C(logs/), C(control/), C(nodes/)) and writes the
    hostfile, C(program.json) (the argv each rank becomes, read by C(multinode_ds.rank)), the DeepSpeed config the
    ranks read (C(job.ds_config), the user's C(-e ds_config) with the trackers' monitor sections), C(rank.env) (the
    ranks' whole environment, mode 0600), the C(.deepspeed_env) each node's shell exports before DeepSpeed's launcher
    starts (with pdsh; only the values a shell reads as they are; mode 0600) and the controller's lease (C(control/lease)) the
    agents watch.
  - One call where C(train.yml) had six tasks; C(job) is M(multinode.deepspeed.job_plan)'s result. C(train.yml) runs
    it on the coordinator (C(run_once), as the run's user) - with O(write=false) when a preflight runs first, then
    again with O(check=false) after the preflight.
extends_documentation_fragment:
  - multinode.deepspeed.job
options:
  write:
    description: Write the run directory after the checks (C(false) - check only, before a preflight).
    type: bool
    default: true
  check:
    description: Run the checks (C(false) - they ran in an earlier call of this run).
    type: bool
    default: true
  agent:
    description:
      - Start this node's agent once the directory is written, as M(multinode.deepspeed.agent_start) would (the same
        keys - V(argv), V(log), V(chdir), V(environment) - and V(node), the inventory name it is started for,
        returned as RV(agent_node)), saving the launch one round trip.
      - Not started when nothing is written (O(write=false), check mode) or when the job's workdir is not on the
        shared directory yet (RV(workspace_present) false - the play copies it, then starts the agent).
      - C(train.yml) passes it when nothing else has to happen on the nodes before the launcher starts (no preflight
        to run, no secrets to install, no backend start step) and the node running it starts an agent over SSH.
    type: dict
attributes:
  check_mode:
    support: full
    description: Checks; writes nothing.
  diff_mode:
    support: none
    description: Shows no diff.
notes:
  - 'Each check fails with the value and the fix - V(run_id=X exists already (<run_dir> on <coordinator>\). Fix: pick
    another -e run_id, or leave it out for a new one.); V(entrypoint=<path> does not exist on <coordinator>. Fix: put
    the script on the shared directory (<shared_dir>\) or at the same path on every node, and pass its absolute
    path.); and, when the dry run (run with C(DS_ACCELERATOR) set) exits non-zero, V(The bundled trainer refuses this
    run (checked on <coordinator>\): <the last line of its stderr>), without the trainer''s C(multinode_ds:) prefix
    (C(exit code N) when stderr is empty).'
  - Every file is written through a temporary file and a rename. The launch backend's own files (C(job.launch.files),
    a batch script for example) are written under the run directory too. It reports C(changed) only when it wrote the
    files.
seealso:
  - module: multinode.deepspeed.job_plan
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Check the run and write its directory
  multinode.deepspeed.run_prepare:
    job: "{{ train_job }}"
"""

RETURN = r"""
run_dir:
  description: The run's directory.
  returned: always
  type: str
workspace_present:
  description: Whether the job's workdir (C(job.workdir)) is on the shared directory already, whole (its marker
    C(workspaces/<id>.json) is there); the play copies it when it is not.
  returned: when the job has a workdir and O(check) is true
  type: bool
dry_run:
  description: The trainer's plan (model, parameters, ZeRO stage, estimated GiB per rank), when it checked one.
  returned: when the job runs the bundled trainer and O(check) is true
  type: dict
written:
  description: The files written.
  returned: always
  type: list
  elements: str
agent_pid:
  description: The process id of the agent O(agent) started.
  returned: when it started the agent
  type: int
agent_node:
  description: O(agent)'s V(node) - whose agent was started, so that the play starts the other nodes' only.
  returned: when it started the agent
  type: str
"""

import json
import os
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.node import launcher_env
from ansible_collections.multinode.deepspeed.plugins.module_utils.run import lock
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.spawn import start_detached


def lock_holder(job):
    """The live run that holds the job's checkpoint directory, or None (module_utils/run/lock.py)."""
    path = job.get("checkpoint_lock")
    return lock.holder(path, job["run_id"]) if path else None


def lock_message(job, holder, where):
    how = ("it was handed to you and still runs" if holder.get("handoff")
           else "its controller renewed its lease %.0fs ago" % holder.get("lease_age", 0))
    return ("checkpoint directory %s is in use by run %s (%s; on %s). Fix: wait for %s to end or stop it, or train "
            "another model (-e model=...)" % (job["checkpoint_dir"], holder.get("run_id"), how, where,
                                              holder.get("run_id")))


def take_lock(module, job, where):
    """Hold the checkpoint directory for this run (a stale holder's lock is replaced; of two plays that find it
    stale, one takes it).  A run handed to the user keeps it while it runs."""
    path = job["checkpoint_lock"]
    holder = lock.take(path, job["run_id"], job["run_dir"], handoff=not (job.get("launch") or {}).get("start", True))
    if holder is not None:
        # This play does not start the run: its claim goes, so that the same run id can be tried again later.
        lock.unclaim(job["run_dir"], job.get("run_token") or job["run_id"])
        module.fail_json(msg=lock_message(job, holder, where))
    return path


def fail_checks(module, job):
    """The checks, in order; each failure names the value and the fix."""
    where = job["coordinators"][0] if job.get("coordinators") else "the coordinator"
    holder = lock_holder(job)
    if holder is not None:
        module.fail_json(msg=lock_message(job, holder, where))
    if os.path.exists(os.path.join(job["run_dir"], "hostfile")):
        module.fail_json(msg="run_id=%s exists already (%s on %s). Fix: pick another -e run_id, or leave it out for a "
                             "new one." % (job["run_id"], job["run_dir"], where))
    if job.get("workdir"):
        return workspace_check(module, job, where)
    if not job["metrics"]:
        if not os.path.isfile(job["entrypoint"]):
            module.fail_json(msg="entrypoint=%s does not exist on %s. Fix: put the script on the shared directory (%s) "
                                 "or at the same path on every node, and pass its absolute path."
                                 % (job["entrypoint"], where, job["shared_dir"]))
        return None
    env = dict(os.environ, DS_ACCELERATOR=job["accelerator"])
    argv = list(job["dry_run"])
    if job.get("ds_config"):
        # The run directory is written later: the dry run reads the config from a file of its own.
        handle, path = tempfile.mkstemp(prefix="multinode-ds-config-", suffix=".json")
        with os.fdopen(handle, "w") as fh:
            fh.write(job["ds_config"]["text"])
        module.add_cleanup_file(path)
        argv[argv.index("--ds-config") + 1] = path
    rc, out, err = module.run_command(argv, environ_update=env)
    if rc != 0:
        lines = [x for x in (err or "").splitlines() if x.strip()]
        why = lines[-1] if lines else "exit code %d" % rc
        if why.startswith("multinode_ds: "):
            why = why[len("multinode_ds: "):]
        module.fail_json(msg="The bundled trainer refuses this run (checked on %s): %s" % (where, why))
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {}


def workspace_check(module, job, where):
    """The shipped workdir's place: ``workspaces/`` the run's account can write, and whether this content is there
    already (its marker, written once it was copied whole); the play copies it when it is not."""
    parent = os.path.dirname(job["workdir"]["dest"])
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        module.fail_json(msg="%s on %s is not a directory the run's account can write, so workdir=%s cannot be copied "
                             "there. Fix: run site.yml (it creates it), or create it owned by the run's account"
                             % (parent, where, job["workdir"]["root"]))
    return {"workspace_present": os.path.isfile(job["workdir"]["marker"])}


def env_lines(env):
    return "".join("%s=%s\n" % kv for kv in sorted(env.items()))


def write_file(path, text, mode=0o644):
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def main():
    module = AnsibleModule(argument_spec=dict(job=dict(type="dict", required=True),
                                              write=dict(type="bool", default=True),
                                              check=dict(type="bool", default=True),
                                              agent=dict(type="dict")),
                           supports_check_mode=True)
    job = module.params["job"]
    result = {"changed": False, "run_dir": job["run_dir"], "written": []}
    if module.params["check"]:
        plan = fail_checks(module, job)
        if job.get("workdir"):
            result.update(plan)
        elif plan is not None:
            result["dry_run"] = plan
    if not module.params["write"] or module.check_mode:
        module.exit_json(**result)
    where = job["coordinators"][0] if job.get("coordinators") else "the coordinator"
    # The exclusive step: the same -e run_id from two terminals gets one run directory.
    taken = lock.claim(job["run_dir"], job.get("run_token") or job["run_id"], job["run_id"], where)
    if taken:
        module.fail_json(msg=taken)
    for sub in ("logs", "control", "nodes"):
        os.makedirs(os.path.join(job["run_dir"], sub), mode=0o755, exist_ok=True)
    # The launch backend's own files (a batch script...), paths under the run directory.
    for name, text in sorted(((job.get("launch") or {}).get("files") or {}).items()):
        path = os.path.normpath(os.path.join(job["run_dir"], name))
        if not path.startswith(job["run_dir"].rstrip("/") + "/"):
            module.fail_json(msg="the backend's file %s is not under the run directory %s" % (name, job["run_dir"]))
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        write_file(path, text, 0o755 if text.startswith("#!") else 0o644)
        result["written"].append(path)
    if job.get("checkpoint_lock"):
        result["written"].append(take_lock(module, job, where))
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
    agent = module.params["agent"]
    if agent and (not job.get("workdir") or os.path.isfile(job["workdir"]["marker"])):
        result.update(start_agent(module, agent))
    module.exit_json(**result)


def start_agent(module, agent):
    """Start the node's agent now that its run directory is there (``agent``: agent_start's options and ``node``)."""
    argv = agent.get("argv") or []
    if not isinstance(argv, list) or not agent.get("log") or not agent.get("node"):
        module.fail_json(msg="agent needs argv (a list), log and node, got keys %s" % sorted(agent))
    pid, problem = start_detached([str(a) for a in argv], str(agent["log"]), agent.get("chdir"),
                                  agent.get("environment") or {}, float(agent.get("settle", 0.1)))
    if problem is not None:
        msg, rc = problem
        module.fail_json(msg="%s (%s's agent)" % (msg, agent["node"]), **({} if rc is None else {"rc": rc}))
    return {"agent_pid": pid, "agent_node": str(agent["node"])}


if __name__ == "__main__":
    main()
