# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Plan the job on the controller from the play's variables and the workers' hostvars (module_utils/plan/job.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import os
import secrets

from ansible.plugins.action import ActionBase
from ansible_collections.multinode.deepspeed.plugins.module_utils.common import records
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan import usercode, workdir
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import (JobError, host_list, plan,
                                                                                   unquarantine_problems)
from ansible_collections.multinode.deepspeed.plugins.module_utils.run import recovery

# Play variable -> job setting (the -e names users type, and the roles' variables).
SETTINGS = {
    "model": "model", "steps": "steps", "args": "args", "backend": "backend", "entrypoint": "entrypoint",
    "resume": "resume", "save_interval": "save_interval", "ds_config": "ds_config", "model_path": "model_path",
    "dataset": "dataset", "master_port": "master_port", "timeout": "timeout", "stall_timeout": "stall_timeout",
    "stall_floor": "stall_floor", "stall_ceiling": "stall_ceiling", "warm_start": "warm_start",
    "straggler_threshold": "straggler_threshold", "straggler_steps": "straggler_steps", "on_straggler": "on_straggler",
    "startup_timeout": "startup_timeout", "queue_timeout": "queue_timeout",
    "run_id": "run_id", "hosts": "hosts", "preflight": "preflight",
    "exclude": "exclude", "deepspeed_rank_env": "deepspeed_rank_env", "secret_env": "secret_env",
    "shared_dir_path": "shared_dir",
    # The inventory's train_restarts first, so that -e restarts wins.
    "train_restarts": "restarts", "restarts": "restarts", "train_recover_wait": "recover_wait",
    "recover_wait": "recover_wait", "train_min_nodes": "min_nodes", "min_nodes": "min_nodes",
    "unquarantine": "unquarantine",
    "workdir": "workdir", "workdir_exclude": "workdir_exclude", "workdir_max_mb": "workdir_max_mb",
    "workdir_include_secrets": "workdir_include_secrets", "workdir_allow_private": "workdir_allow_private",
    "tracking": "tracking", "mlflow_tracking_uri": "mlflow_tracking_uri",
    "stack_venv_dir": "venv", "stack_home": "home", "stack_torch_extensions_dir": "torch_extensions_dir",
}


def worker_facts(hv):
    """What the plan needs of one worker, from its hostvars."""
    facts = hv.get("ansible_facts") or {}
    node = hv.get("multinode_node") or {}
    accel = hv.get("multinode_accelerators") or {}
    gpus = int(accel.get("count") or hv.get("deepspeed_gpu_count") or 0)
    slots = hv.get("deepspeed_slots")
    if slots is None and gpus > 0:
        slots = gpus
    return {"slots": slots, "gpus": gpus, "accelerator": hv.get("deepspeed_accelerator") or None,
            "address": hv.get("ansible_host") or None,
            "memtotal_mb": node.get("memtotal_mb") or facts.get("memtotal_mb"),
            "interface": node.get("interface") or (facts.get("default_ipv4") or {}).get("interface"),
            "env": dict(hv.get("multinode_node_env") or {}),
            "scheduler_name": hv.get("slurm_node_name") or None,
            "trackers": node.get("trackers"),
            "stack_fingerprint": node.get("stack_fingerprint"),
            "answered": None}


FILE_LISTS = "~/.cache/multinode-deepspeed/workspaces"


def user_inputs(settings, task_vars, templar):
    """The workdir, ds_config and trackers read on the controller (plan/usercode.py), once per run: a later
    attempt's plan gets the first one's (``settings["user_inputs"]``).  A workdir's file list is kept on the
    controller for rsync's --files-from (``files_from_path``), named by the content's hash."""
    if settings.get("user_inputs") is not None:
        return settings["user_inputs"], []
    runs_dir = str(templar.template(task_vars.get("runs_dir")) or os.path.join(os.getcwd(), "runs"))
    inputs, problems = usercode.gather(settings, os.getcwd(), runs_dir)
    shipped = inputs.get("workdir")
    if shipped:
        lists = os.path.expanduser(FILE_LISTS)
        os.makedirs(lists, exist_ok=True)
        path = os.path.join(lists, shipped["hash"] + ".files")
        if not os.path.exists(path):
            with open(path + ".tmp", "w", encoding="utf-8") as handle:
                handle.write(shipped["files_from"])
            os.replace(path + ".tmp", path)
        inputs["workdir"] = dict((k, v) for k, v in shipped.items() if k not in ("files", "files_from"))
        inputs["workdir"]["files_from_path"] = path
    return inputs, problems


def coordinator_records(hostvars, coordinators):
    """The quarantine and spares records as the coordinator read them (``node_facts`` with ``records``: the files
    every controller that drives the cluster shares), or None where no coordinator read them."""
    for name in coordinators:
        found = ((hostvars.get(name) or {}).get("multinode_node") or {}).get("records")
        if isinstance(found, dict):
            return found
    return None


def quarantined(found, unquarantine, known):
    """The quarantined nodes (``{node: record}``) of the coordinator's records (``found``, coordinator_records), less
    those ``-e unquarantine=a,b`` lets out (checks.yml writes that on the coordinator, after the plan).  JobError
    when a record could not be read (named, with its fix), or when ``unquarantine`` names a node neither ``known``
    (the inventory's workers and spares) nor quarantined."""
    found = found or {}
    if found.get("problems"):
        raise JobError("; ".join(found["problems"]))
    nodes = dict(found.get("quarantine") or {})
    names = host_list(unquarantine)
    problems = unquarantine_problems(names, known, nodes)
    if problems:
        raise JobError("; ".join(problems))
    return dict((n, r) for n, r in nodes.items() if n not in names)


def record_paths(settings, task_vars, templar, found):
    """Where the records are on the coordinator: the paths it read (``found``), else ``quarantine_file`` and
    ``spares_file`` or their place in the shared directory.  JobError for a path that is not absolute."""
    given = dict((var, templar.template(task_vars.get(var)) or None) for var in ("quarantine_file", "spares_file"))
    problems = records.path_problems(**given)
    if problems:
        raise JobError("; ".join(problems))
    paths = records.record_paths(settings.get("shared_dir"), **given)
    return dict((var, (found or {}).get(var) or path) for var, path in paths.items())


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("settings", "workers", "coordinators"))

    def _user_inputs(self, settings, task_vars):
        """``user_inputs``, with a workdir or ds_config the controller cannot read as a problem."""
        try:
            return user_inputs(settings, task_vars, self._templar)
        except OSError as exc:
            return {}, ["the workdir or ds_config cannot be read on the controller: %s. Fix: check the path and its "
                        "permissions" % exc]

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        settings = {}
        for var, key in list(SETTINGS.items()) + [(n, n) for n in backends.setting_names()]:
            if var in task_vars and task_vars[var] is not None:
                settings[key] = self._templar.template(task_vars[var])
        settings["hf_token_set"] = "hf_token" in task_vars
        settings["run_nonce"] = secrets.token_hex(2)
        settings["run_token"] = secrets.token_hex(8)
        settings.update(args.get("settings") or {})
        groups = task_vars.get("groups") or {}
        workers = list(args.get("workers") or groups.get("workers") or [])
        coordinators = list(args.get("coordinators") or groups.get("coordinator") or [])
        hostvars = task_vars.get("hostvars") or {}
        # The run account's uid on the coordinator (node_facts' user), for backends that start processes by uid.
        settings.setdefault("run_uid", next(((hostvars[c].get("multinode_node") or {}).get("uid")
                                             for c in coordinators if c in hostvars), None))
        found = coordinator_records(hostvars, coordinators)
        try:
            paths = record_paths(settings, task_vars, self._templar, found)
            held = quarantined(found, settings.get("unquarantine"), workers + list(groups.get("spares") or []))
        except JobError as exc:
            result.update(failed=True, msg="The job cannot start: %s." % exc)
            return result
        lines = recovery.quarantine_lines(held, workers)
        workers = [w for w in workers if w not in held]
        facts = dict((w, worker_facts(hostvars[w])) for w in workers)
        # A worker of this play that failed or was unreachable (reading it failed) cannot take ranks.
        alive, targeted = task_vars.get("ansible_play_hosts"), task_vars.get("ansible_play_hosts_all") or []
        for w in workers:
            if alive is not None and w in targeted:
                facts[w]["answered"] = w in alive
        fresh = settings.get("user_inputs") is None
        inputs, problems = self._user_inputs(settings, task_vars)
        if problems:
            result.update(failed=True, msg="The job cannot start: %s." % "; ".join(problems))
            return result
        settings["user_inputs"] = inputs
        if inputs.get("args") is not None:
            settings["args"] = inputs["args"]
        try:
            # The plan asks the job's launch backend (from the launch stage's registry) to describe its launch.
            job = plan(settings, facts, coordinators, datetime.datetime.now(datetime.timezone.utc), backends)
        except JobError as exc:
            result.update(failed=True, msg="The job cannot start: %s." % exc)
            return result
        if job.get("grow") and job["grow"]["spares"]:
            # A spare a grow-back looks out for is free once no other run holds it in the spares record.
            job["grow"].update(spares_file=paths["spares_file"], run_id=job["run_id"])
        result.update(changed=False, job=job, user_inputs=inputs, records=paths)
        # The files the workdir's plan left out as secrets, said once per run (a later attempt's plan reads nothing).
        lines += [workdir.secrets_line(inputs.get("workdir"))] if fresh and inputs.get("workdir") else []
        lines = [line for line in lines if line]
        if lines:
            result["warnings"] = lines
        return result
