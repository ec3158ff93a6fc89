# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The job plan: everything a run is, computed once from the inventory, the facts and the -e values.

``plan(settings, workers, coordinators, now)`` checks every value and returns the whole job:
ranks per host and the hostfile, world size, master address and port, accelerator, the ranks'
environment (run settings + the NCCL profile's and the stack's variables + the user's, validated),
the program and its argv, the run id and its directories, and what the launch backend does with it
(``backends``: launchers, agents, argv per launcher, SSH pairs).  Preflight, launch, watch and
collect read this one result.

Pure Python, no Ansible import: unit-tested on the controller.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import ipaddress
import json
import re
import shlex

from ansible_collections.multinode.deepspeed.plugins.module_utils.common import tracking
from ansible_collections.multinode.deepspeed.plugins.module_utils.common.hostfile import HostfileError, build, with_slots
from ansible_collections.multinode.deepspeed.plugins.module_utils.common.secret_names import secret_name
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan import dsops, workdir
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.node import MASTER_PORT

# The one place for the collection's default paths and settings (what the roles install).
DEFAULTS = {
    "model": "llama-tiny",
    "steps": 30,
    "master_port": MASTER_PORT,
    "timeout": 3600,
    "startup_timeout": 300,
    # The bounds of the hang limit the watch learns (ten times the step time): module_utils/run/pace.py.
    "stall_floor": 10,
    "stall_ceiling": 1800,
    # A straggler: a node whose ranks compute below this share of the fastest rank's pace for this many steps.
    "straggler_threshold": 0.7,
    "straggler_steps": 10,
    "on_straggler": "warn",
    "save_interval": 0,
    "restarts": 0,
    "recover_wait": 120,
    "attempt": 1,
    "shared_dir": "/srv/multinode-deepspeed",
    "home": "/opt/multinode-deepspeed",
    "venv": "/opt/multinode-deepspeed/venv",
    "torch_extensions_dir": "/opt/multinode-deepspeed/torch_extensions",
    "etc_dir": "/etc/multinode-deepspeed",
}
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A directory of the cluster (from the inventory): it goes into the run directory's path, argv and DeepSpeed's
# remote command line, so only characters no shell treats specially, and no '..'.
PATH_RE = re.compile(r"/[A-Za-z0-9._+/-]*")
# A host name (RFC 1123 labels): a node's address reaches DeepSpeed's --master_addr and the launcher's argv.
HOSTNAME_RE = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                         r"[A-Za-z0-9])?)*\.?")
# Variables the run sets itself, and the ones DeepSpeed's launcher gives each rank: the user's must not replace them.
RESERVED_ENV = re.compile(r"MULTINODE_DS_.*|RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_SIZE|CROSS_RANK|CROSS_SIZE|"
                          r"MASTER_ADDR|MASTER_PORT")

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class JobError(ValueError):
    """The job cannot be planned; the message has one sentence per problem, each with its fix."""


def _whole(settings, key, low, high, unit, problems, limit=None):
    """A whole number in ``low``-``high`` (shown as a range), or ``>= low`` up to a sanity ``limit``."""
    value = settings.get(key, DEFAULTS.get(key))
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit() or not low <= int(text) <= (high or int(text)):
        problems.append("%s=%s must be a whole number %s. Fix: -e %s=<%s>" % (
            key, value, ">= %d" % low if not high else "in %d-%d" % (low, high), key, unit))
        return None
    if limit and int(text) > limit:
        problems.append("%s=%s is more than %d, surely a typo. Fix: -e %s=<%s, at most %d>" % (
            key, text, limit, key, unit, limit))
        return None
    return int(text)


TRUE_WORDS = ("y", "yes", "on", "1", "true", "t")
FALSE_WORDS = ("n", "no", "off", "0", "false", "f", "")
# Trainer options the plan sets from its own variables: in ``args`` they would contradict the plan (the watch
# counts -e steps, the checkpoint lock is the plan's directory...).
PLANNED_OPTIONS = {"--model": "model", "--run-dir": "run_id", "--steps": "steps", "--checkpoint-dir": "model",
                   "--save-interval": "save_interval", "--resume": "resume", "--resume-if-any": None, "--ds-config": "ds_config",
                   "--model-path": "model_path", "--dataset": "dataset", "--dry-run": None, "--world-size": None,
                   "--memory-gib": None, "--local_rank": None}
# The bundled trainer's other options (args may set them): an option that is one of them is no abbreviation of a
# planned one ("--data" is not "--dataset"). tests/unit/multinode_ds/test_train_plan.py keeps both lists whole.
TRAINER_OPTIONS = ("--micro-batch", "--grad-accum", "--seq-len", "--lr", "--warmup", "--seed", "--data",
                   "--device-memory-gib", "--bf16", "--print-every", "--help", "-h")
LIMITS = {"steps": 10 ** 9, "timeout": 30 * 86400, "save_interval": 10 ** 9}


def _switch(settings, key, problems, also=()):
    """A yes/no -e value as Ansible reads booleans (or one of ``also``): True, False, the word, or None (bad)."""
    value = settings.get(key)
    if value is None or isinstance(value, bool):
        return bool(value)
    word = str(value).strip().lower()
    if word in also:
        return word
    if word in TRUE_WORDS or word in FALSE_WORDS:
        return word in TRUE_WORDS
    problems.append("%s=%s is not a yes/no value. Fix: -e %s=true or -e %s=false%s" % (
        key, value, key, key, "".join(" or -e %s=%s" % (key, w) for w in also)))
    return None


def host_list(value):
    """``-e hosts=w1,w2`` (or a YAML list) -> ``['w1', 'w2']``."""
    if value in (None, ""):
        return []
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return [str(x).strip() for x in items if str(x).strip()]


def _check_env(name, env, problems):
    """Keys must be variable names and values single lines of text."""
    for key, value in sorted(env.items(), key=lambda kv: str(kv[0])):
        if not isinstance(key, str) or not ENV_KEY_RE.fullmatch(key):
            problems.append("%s: %r is not a variable name. Fix: letters, digits and '_', not starting with a "
                            "digit" % (name, key))
        elif value is None or isinstance(value, (dict, list)) or "\n" in str(value) or "\r" in str(value) \
                or "\0" in str(value):
            problems.append("%s: %s must be one line of text. Fix: give %s a single-line value" % (name, key, key))


def user_env(settings, problems):
    """The user's ``deepspeed_rank_env``, checked: keys must be variable names and values single lines
    (``rank.env`` holds one ``KEY=VALUE`` per line); the variables the run sets itself cannot be replaced, and a
    secret's name is refused (this environment is written to the run directory and DeepSpeed's launcher log:
    ``secret_env`` is the way)."""
    user = settings.get("deepspeed_rank_env") or {}
    if not isinstance(user, dict):
        problems.append("deepspeed_rank_env must be a mapping of variable names to values. Fix: -e "
                        "'{\"deepspeed_rank_env\": {\"KEY\": \"value\"}}'")
        return {}
    _check_env("deepspeed_rank_env", user, problems)
    for key in sorted(k for k in user if isinstance(k, str)):
        if RESERVED_ENV.fullmatch(key):
            problems.append("deepspeed_rank_env: %s is set by the run itself. Fix: leave %s out (the plan sets it "
                            "for every rank)" % (key, key))
        elif secret_name(key):
            problems.append("deepspeed_rank_env: %s looks like a secret, and this environment is written to the run "
                            "directory and DeepSpeed's launcher log. Fix: pass it in secret_env (node-local, mode "
                            "0600, never logged; vault it with ansible-vault)" % key)
    return dict((k, str(v)) for k, v in user.items())


def rank_env(job, settings, node_env, user):
    """The environment every rank gets, in the order of precedence (later wins): the run's own
    settings, the job's NCCL profile and stack variables (``node_env``), the user's (``user_env``)."""
    env = {"DS_ACCELERATOR": job["accelerator"], "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
           "MULTINODE_DS_RUN_ID": job["run_id"], "MULTINODE_DS_RUN_DIR": job["run_dir"],
           "MULTINODE_DS_ATTEMPT": str(job.get("attempt") or 1),
           # Where the run's checkpoints go: the bundled trainer's by model, a script's by run (every attempt's).
           "MULTINODE_DS_CHECKPOINT_DIR": job["checkpoint_dir"] if not job.get("entrypoint") else "%s/runs/%s/%s" % (
               job["shared_dir"], job["run_id"], "checkpoints"),
           "TORCH_EXTENSIONS_DIR": job["torch_extensions_dir"], "PATH": job["venv"] + "/bin:" + SYSTEM_PATH,
           # DeepSpeed's launcher reads this run's file, never a .deepspeed_env in the user's home.
           "DS_ENV_FILE": job["run_dir"] + "/.deepspeed_env"}
    if job.get("warm"):
        # multinode_ds.rank starts the rank from the node's warm process when there is one (multinode_ds.warm).
        env["MULTINODE_DS_WARM"] = "1"
    if job.get("interface"):
        env["GLOO_SOCKET_IFNAME"] = job["interface"]
    env.update(node_env or {})
    if settings.get("hf_token_set"):
        env["HF_TOKEN_PATH"] = job["home"] + "/secrets/hf_token"
    if job.get("secret_file"):
        env["MULTINODE_DS_SECRET_ENV"] = job["secret_file"]
    if job.get("workdir"):
        # multinode_ds.rank starts the user's script there: its files and imports as on the controller.
        env["MULTINODE_DS_WORKDIR"] = job["workdir"]["dest"]
        # The workspace holds the content its hash names, nothing more: no __pycache__ written into it.
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(job.get("tracking_env") or {})
    env.update(user)
    return dict((k, str(v)) for k, v in env.items())


def secret_settings(job, settings, run_id, problems):
    """``secret_env`` (a mapping, e.g. from a vaulted vars file): checked here, written node-local by the play
    (``job["secret_file"]``, mode 0600) and read by every rank (multinode_ds.rank).  The plan keeps the names,
    never the values."""
    job["secret_file"], job["secret_keys"] = None, []
    secrets = settings.get("secret_env")
    if secrets in (None, "", {}):
        return
    if not isinstance(secrets, dict):
        problems.append("secret_env must be a mapping of variable names to values. Fix: put secret_env: {KEY: value} "
                        "in a vars file (ansible-vault encrypt it) and pass -e @that-file")
        return
    _check_env("secret_env", secrets, problems)
    for key in sorted(k for k in secrets if isinstance(k, str) and RESERVED_ENV.fullmatch(k)):
        problems.append("secret_env: %s is set by the run itself. Fix: leave it out" % key)
    job["secret_keys"] = sorted(str(k) for k in secrets)
    job["secret_file"] = "%s/secrets/runs/%s.json" % (job["home"], run_id)


def accumulation(global_batch, micro_batch, world_size):
    """The gradient accumulation that keeps ``global_batch`` at ``world_size`` ranks of ``micro_batch``:
    ``(steps, exact)``; when it does not divide, the nearest count that does not exceed it (at least 1)."""
    per_step = micro_batch * world_size
    steps = max(1, global_batch // per_step)
    return steps, steps * per_step == global_batch


def batch(job):
    """How the bundled trainer keeps the run's global batch on fewer ranks than its first attempt had: ``{"grad_accum",
    "exact", "global_world"}`` (gradient accumulation over the missing ranks' micro-batches; not exact when the world
    does not divide the first one), or None when the world is the first one's."""
    first, world = job.get("global_world"), job.get("world_size")
    if not first or not world or first == world or job.get("entrypoint"):
        return None
    accum, exact = accumulation(first, 1, world)
    return {"grad_accum": accum, "exact": exact, "global_world": first}


def program(job, settings):
    """The argv after DeepSpeed's options: the bundled trainer's, or the user's script, + ``args``."""
    if job["entrypoint"]:
        argv = [job["entrypoint"]] + job["args"]
        return argv + (["--deepspeed_config", job["ds_config"]["path"]] if job.get("ds_config") else [])
    argv = ["--module", "multinode_ds.train", "--model", job["model"], "--run-dir", job["run_dir"],
            "--steps", str(job["steps"]), "--checkpoint-dir", job["checkpoint_dir"],
            "--save-interval", str(job["save_interval"])]
    if job.get("batch"):
        argv += ["--grad-accum", str(job["batch"]["grad_accum"])]
    if job.get("resume"):
        argv += ["--resume"]
    elif (job.get("attempt") or 1) > 1:
        # A later attempt of a run goes on from its newest whole checkpoint, when it wrote one.
        argv += ["--resume-if-any"]
    if job.get("ds_config"):
        argv += ["--ds-config", job["ds_config"]["path"]]
    for key, flag in (("model_path", "--model-path"), ("dataset", "--dataset")):
        if settings.get(key):
            argv += [flag, str(settings[key])]
    return argv + job["args"]


def directories(settings, problems):
    """The model and the cluster's directories (the defaults where unset), checked: they go into every rank's
    command line, and the model names the checkpoint directory."""
    job = dict((k, settings.get(k) or DEFAULTS[k]) for k in
               ("model", "shared_dir", "home", "venv", "torch_extensions_dir", "etc_dir"))
    for key, var in (("shared_dir", "shared_dir_path"), ("home", "stack_home"), ("venv", "stack_venv_dir"),
                     ("torch_extensions_dir", "stack_torch_extensions_dir"), ("etc_dir", "etc_dir")):
        value = job[key]
        if not isinstance(value, str) or not PATH_RE.fullmatch(value) or ".." in value.split("/") or len(value) > 256:
            problems.append("%s=%r must be an absolute path of letters, digits and '._+-/' (no '..', no spaces: it "
                            "goes into every rank's command line). Fix: set %s to such a path" % (var, value, var))
    if not isinstance(job["model"], str) or not RUN_ID_RE.fullmatch(job["model"]):
        problems.append("model=%r is not a model name (letters, digits, '.', '_', '-'; it names the checkpoint "
                        "directory). Fix: -e model=<one of the bundled models, e.g. llama-tiny>, or -e model_path= "
                        "for your own weights" % (job["model"],))
    return job


def run_settings(job, settings, problems):
    """How far and how long the run goes, into ``job``: steps, master port, timeout, save interval, resume, stall
    timeout; and whether ``preflight`` is a yes/no value (or force)."""
    job["steps"] = _whole(settings, "steps", 1, None, "steps", problems, LIMITS["steps"])
    job["master_port"] = _whole(settings, "master_port", 1024, 65535, "port", problems)
    job["timeout"] = _whole(settings, "timeout", 10, None, "seconds", problems, LIMITS["timeout"])
    job["save_interval"] = _whole(settings, "save_interval", 0, None, "steps", problems, LIMITS["save_interval"])
    job["resume"] = _switch(settings, "resume", problems)
    _switch(settings, "preflight", problems, also=("force",))
    job["stall_timeout"] = stall_timeout(settings, job["timeout"], problems)
    job["stall_floor"], job["stall_ceiling"] = stall_bounds(settings, problems)
    # Ranks fork from each node's warm process (multinode_ds.warm) unless -e warm_start=false.
    job["warm_start"] = True if settings.get("warm_start") in (None, "") else _switch(settings, "warm_start", problems)
    job["straggler"] = straggler_settings(settings, problems)


def straggler_settings(settings, problems):
    """When the watch names a straggler (module_utils/run/stragglers.py): a node whose score stays below
    ``straggler_threshold`` (in (0, 1): its ranks' compute pace over the fastest rank's) for ``straggler_steps``
    steps; and what the run does then, ``on_straggler``: warn (name it) or replace (move off it, with restarts)."""
    text = str(settings.get("straggler_threshold", DEFAULTS["straggler_threshold"])).strip()
    try:
        threshold = float(text)
    except ValueError:
        threshold = None
    if threshold is None or not 0 < threshold < 1:
        problems.append("straggler_threshold=%s must be a number between 0 and 1 (a node is a straggler below it: "
                        "its ranks compute at that share of the fastest rank's pace). Fix: -e straggler_threshold=0.7"
                        % text)
    steps = _whole(settings, "straggler_steps", 1, 100000, "steps", problems)
    action = str(settings.get("on_straggler") or DEFAULTS["on_straggler"]).strip().lower()
    if action not in ("warn", "replace"):
        problems.append("on_straggler=%s is not one of warn, replace. Fix: -e on_straggler=warn (name the slow node) or "
                        "-e on_straggler=replace (with -e restarts=N: move the run off it)" % (
                            settings.get("on_straggler"),))
    return {"threshold": threshold, "steps": steps, "action": action}


def stall_bounds(settings, problems):
    """The bounds of the hang limit the watch learns from the run's step time (``stall_floor``-``stall_ceiling``
    seconds; module_utils/run/pace.py): at least 1 s, the floor at most the ceiling."""
    floor = _whole(settings, "stall_floor", 1, None, "seconds", problems, LIMITS["timeout"])
    ceiling = _whole(settings, "stall_ceiling", 1, None, "seconds", problems, LIMITS["timeout"])
    if floor and ceiling and floor > ceiling:
        problems.append("stall_floor=%d is more than stall_ceiling=%d. Fix: -e stall_floor=<at most %d>, or a larger "
                        "-e stall_ceiling" % (floor, ceiling, ceiling))
    return floor, ceiling


def recovery_settings(job, settings, problems):
    """How a failed run goes on, into ``job``: ``restarts`` (attempts after the first; 0: it stops at the first
    failure), ``recover_wait`` (seconds a failed node gets to come back), ``min_nodes`` (the fewest rank nodes it
    may go on with; None: as many as it started with) and ``attempt`` (this attempt's number, from 1)."""
    job["restarts"] = _whole(settings, "restarts", 0, 100, "attempts after the first", problems)
    if (job.get("straggler") or {}).get("action") == "replace" and job["restarts"] == 0:
        problems.append("on_straggler=replace moves the run off a slow node in its next attempt, and restarts=0 allows "
                        "none. Fix: -e restarts=1 (or more), or -e on_straggler=warn")
    job["recover_wait"] = _whole(settings, "recover_wait", 0, 3600, "seconds", problems)
    job["attempt"] = _whole(settings, "attempt", 1, 101, "attempt", problems)
    job["min_nodes"] = None
    if settings.get("min_nodes") not in (None, ""):
        job["min_nodes"] = _whole(settings, "min_nodes", 1, 10000, "nodes", problems)
    # The first attempt's world size (the play's, for a later attempt): a run on fewer nodes keeps its global batch.
    job["global_world"] = int(settings["global_world"]) if str(settings.get("global_world") or "").isdigit() else None
    # The nodes that failed earlier in this run and are kept out (a scheduler's job excludes them), and the nodes
    # the user let out of quarantine (-e unquarantine=; a scheduler gives them back too).
    job["avoid"] = host_list(settings.get("avoid"))
    # The scheduler's own nodes that failed earlier in this run (Kubernetes Nodes): the pods are kept off them.
    job["avoid_scheduler_nodes"] = host_list(settings.get("avoid_scheduler_nodes"))
    job["unquarantine"] = host_list(settings.get("unquarantine"))
    if job["attempt"] and job["restarts"] is not None and job["attempt"] > job["restarts"] + 1:
        problems.append("attempt=%d is past restarts=%d. Fix: leave attempt to the play" % (
            job["attempt"], job["restarts"]))


def min_nodes_problems(job, rank_hosts):
    """``min_nodes`` above the first attempt's rank nodes: no attempt could ever have as many.  A later attempt runs
    where the recovery placed it (run_recovery holds it to min_nodes), unchecked here."""
    wanted = job.get("min_nodes")
    if not wanted or (job.get("attempt") or 1) > 1 or wanted <= len(rank_hosts):
        return []
    return ["min_nodes=%d is more than the job's %d rank node(s) (%s), so no attempt could ever have as many. Fix: "
            "-e min_nodes=<%d or fewer>, or leave it out (a later attempt then needs as many nodes as the first)"
            % (wanted, len(rank_hosts), ", ".join(rank_hosts), len(rank_hosts))]


def unquarantine_problems(names, known, held):
    """``-e unquarantine=`` names that are no node of the inventory (``known``: its workers and spares) and not
    quarantined (``held``): a typo would otherwise release nothing, silently."""
    unknown = [n for n in names if n not in known and n not in held]
    if not unknown:
        return []
    fix = ("the quarantined nodes are %s" % ", ".join(sorted(held)) if held else
           "no node is quarantined: leave unquarantine out")
    return ["unquarantine=%s names %s, which is no worker or spare of the inventory and not quarantined. Fix: name "
            "inventory nodes (%s)" % (",".join(names), ", ".join(unknown), fix)]


def start_timeouts(settings, timeout, problems):
    """``startup_timeout``: seconds the ranks get to start once they can (a Slurm job started, the pods running),
    shorter than ``timeout``; ``queue_timeout``: seconds a job may wait in the scheduler's queue (None: only
    ``timeout`` bounds it)."""
    startup = _whole(settings, "startup_timeout", 10, None, "seconds", problems, LIMITS["timeout"])
    # The default needs no room: the run's timeout bounds it anyway.
    if startup and timeout and startup >= timeout and settings.get("startup_timeout") not in (None, ""):
        problems.append("startup_timeout=%d is not shorter than timeout=%d. Fix: -e startup_timeout=<fewer seconds "
                        "than %d>, or a longer -e timeout" % (startup, timeout, timeout))
    queue = None
    if settings.get("queue_timeout") not in (None, ""):
        queue = _whole(settings, "queue_timeout", 10, None, "seconds", problems, LIMITS["timeout"])
    return startup, queue


def stall_timeout(settings, timeout, problems):
    """Seconds without a step before the watch calls the run stalled, shorter than ``timeout``; None when unset (the
    watch derives it from the step time: module_utils/run/pace.py)."""
    if settings.get("stall_timeout") in (None, ""):
        return None
    value = _whole(settings, "stall_timeout", 10, None, "seconds", problems)
    if value and timeout and value >= timeout:
        problems.append("stall_timeout=%d is not shorter than timeout=%d, so a stall would never be noticed before "
                        "the run times out. Fix: -e stall_timeout=<fewer seconds than %d>, or a longer -e timeout" % (
                            value, timeout, timeout))
    return value


def launch_backend(settings, backends, problems):
    """The launch backend the job names (or the registry's default) and its options, checked; ``(None, {})`` when it
    is not one.  ``backends``: the launch backends' registry (module_utils/launch/backends: ``get``, ``DEFAULT``,
    ``BackendError``), passed in by what composes the stages (the job_plan action): the plan stage comes before the
    launch stage and imports none of it.  The job's backend reads and checks its own options here, and describes its
    launch at the plan's end (``job["launch"]``), which preflight, the launch and the watch read from the plan."""
    try:
        backend = backends.get(settings.get("backend") or backends.DEFAULT)
    except backends.BackendError as exc:
        problems.append(str(exc))
        return None, {}
    return backend, backend.options.read(settings, problems)


def run_id_for(settings, model, now, problems):
    """``run_id``, checked, or a new one: the UTC time to the millisecond and the action's random nonce, so that two
    runs started in the same second (two terminals, a scheduler) never share a directory, then the model."""
    stamp = "%s-%03d" % (now.strftime("%Y%m%d-%H%M%S"), now.microsecond // 1000)
    named = model if RUN_ID_RE.fullmatch(str(model)) else "run"
    run_id = settings.get("run_id") or "%s%s-%s" % (stamp, settings.get("run_nonce") or "", named)
    if not RUN_ID_RE.fullmatch(str(run_id)):
        problems.append("run_id=%r: letters, digits, '.', '_' and '-' only (at most 128, no '/' and no leading "
                        "'.' or '-'). Fix: -e run_id=<such a name>, or leave it out for a new one" % (run_id,))
    return run_id


def user_program(settings, problems):
    """The user's script (``entrypoint``: an absolute path, or "" for the bundled trainer; with a workdir, the path
    in it where the nodes get it) and ``args`` split like a shell, checked."""
    entrypoint = str(settings.get("entrypoint") or "")
    shipped = (settings.get("user_inputs") or {}).get("workdir")
    if shipped:
        entrypoint = "%s/%s" % (workspace(settings.get("shared_dir") or DEFAULTS["shared_dir"], shipped["id"]),
                                shipped["entrypoint"])
    elif entrypoint and (not entrypoint.startswith("/") or "\n" in entrypoint):
        problems.append("entrypoint=%r must be an absolute path that every node can read, or a path in -e workdir. "
                        "Fix: -e workdir=<the directory on the controller that holds it> (it is copied to the "
                        "nodes), or put the script on the shared directory and pass its absolute path" % entrypoint)
    try:
        args = shlex.split(str(settings.get("args") or ""))
    except ValueError as exc:
        args = []
        problems.append("args=%r cannot be split into arguments (%s). Fix: balance the quotes" % (
            settings.get("args"), exc))
    return entrypoint, args


def workspace(shared_dir, workdir_id):
    """Where a workdir's content is on the cluster: one directory per distinct content, under the shared one."""
    return "%s/workspaces/%s" % (shared_dir, workdir_id)


def user_code(job, settings):
    """The user's workdir, DeepSpeed config and trackers (plan/usercode.gather's answer, ``settings["user_inputs"]``)
    as the job has them: ``workdir`` (where it goes, the marker written once it is there, what it is), ``ds_config``
    (the file the ranks read: the user's config with the trackers' monitor sections, written by run_prepare),
    ``ds_check`` (DeepSpeed's own check of the user's config at the job's world size, as the bundled trainer merges
    it for the trainer), ``ds_ops`` (the DeepSpeed ops that config makes the engine load: plan/dsops.py; built on the
    rank nodes before the start), ``tracking``, ``mlflow`` (the controller's store) and ``tracking_env`` (the ranks'
    environment for the trackers)."""
    inputs = settings.get("user_inputs") or {}
    out = {"workdir": None, "ds_config": None, "ds_check": None, "ds_ops": [],
           "tracking": list(inputs.get("tracking") or []), "mlflow": None, "tracking_env": {}}
    shipped = inputs.get("workdir")
    if shipped:
        dest = workspace(job["shared_dir"], shipped["id"])
        fields = ("id", "hash", "root", "count", "bytes", "git", "entrypoint", "files_from_path", "secrets_left_out",
                  "top")
        out["workdir"] = dict((k, shipped.get(k)) for k in fields)
        out["workdir"].update(dest=dest, marker=dest + ".json")
    keys = job.get("secret_keys") or []
    monitor = tracking.monitor_section(out["tracking"], job["run_dir"], job["run_id"], inputs.get("ds_config"),
                                       "WANDB_API_KEY" in keys, "COMET_API_KEY" in keys)
    out["tracking_env"] = monitor["env"]
    if inputs.get("mlflow_uri"):
        out["mlflow"] = {"uri": inputs["mlflow_uri"], "env": tracking.controller_env(inputs["mlflow_uri"])}
    if inputs.get("ds_config") is not None or monitor["config"]:
        # The bundled trainer merges it over the config it generates (--ds-config); a script gets it whole.
        name = "ds_config.json" if job["entrypoint"] else "ds_config.user.json"
        out["ds_config"] = {"source": inputs.get("ds_config_source"), "path": "%s/%s" % (job["run_dir"], name),
                            "text": json.dumps(monitor["config"], indent=2, sort_keys=True) + "\n",
                            "kept": monitor["kept"], "user": inputs.get("ds_config") is not None}
    if inputs.get("ds_config") is not None:
        out["ds_ops"] = dsops.needed(monitor["config"], bundled=not job["entrypoint"])
        out["ds_check"] = [job["venv"] + "/bin/python", "-m", "multinode_ds.ds_check", "--config", "-",
                           "--world-size", str(job["world_size"]), "--accelerator", job["accelerator"], "--json"
                           ] + dsops.check_args(out["ds_ops"], job["entrypoint"], job["args"])
    return out


def pull_options(job):
    """The pull's rsync options (playbooks/tasks/attempt.yml): not the checkpoints (they stay on the cluster) nor
    the later attempts' directories, nothing that is not a file or a directory, no set-id bit; with a workdir, not
    the links of the ranks' working directory (into the workspace, which the controller has)."""
    top = (job.get("workdir") or {}).get("top") or []
    return ["--exclude=checkpoints/", "--exclude=attempts/", "--mkpath", "--no-devices", "--no-specials",
            "--chmod=a-st"] + workdir.pull_excludes(top)


def tracker_problems(job, master):
    """A monitor tracker whose package the master's venv lacks (global rank 0, on the master, writes DeepSpeed's
    monitor: it would fail there at start); nothing when the master's packages are unknown."""
    installed = master.get("trackers")
    if not isinstance(installed, dict):
        return []
    out = []
    for name in job["tracking"]:
        package = tracking.MONITOR_PACKAGES.get(name)
        if package is None or name not in installed or installed[name]:
            continue
        fix = ("run site.yml (the stack installs it)" if name == "tensorboard" else
               "add %s==<version> to stack_extra_packages and run site.yml" % package)
        out.append("tracking=%s needs the %s package on %s (global rank 0 writes DeepSpeed's monitor there), and its "
                   "venv has none. Fix: %s" % (name, package, job["master"], fix))
    return out


def host_choice(settings, problems):
    """``(hosts, exclude)``: the hosts the user picked and left out, each named once."""
    include, exclude = host_list(settings.get("hosts")), host_list(settings.get("exclude"))
    for key, names in (("hosts", include), ("exclude", exclude)):
        for name in sorted(set(n for n in names if names.count(n) > 1)):
            problems.append("%s lists %s twice. Fix: name each host once (-e %s=%s)" % (
                key, name, key, ",".join(dict.fromkeys(names))))
    return include, exclude


def args_against_plan(resume, entrypoint, args, problems):
    """What the user's program asks that the plan decides: ``resume`` is the bundled trainer's, and its ``args``
    must not set what the plan sets (``PLANNED_OPTIONS``)."""
    if resume and entrypoint:
        problems.append("resume=true is the bundled trainer's, and entrypoint=%s is your own script. Fix: leave "
                        "resume out and pass your script's own option in args" % entrypoint)
    if entrypoint:
        return
    for arg in args:
        option = arg.split("=", 1)[0]
        # An abbreviation ("--checkpoint-d", "--step") is what argparse would have read as the planned option.
        planned = option if option in PLANNED_OPTIONS else None if option in TRAINER_OPTIONS else next(
            (o for o in sorted(PLANNED_OPTIONS) if option.startswith("--") and len(option) > 2 and o.startswith(option)),
            None)
        if planned is not None:
            var = PLANNED_OPTIONS[planned]
            problems.append("args sets %s, which the plan sets itself. Fix: %s" % (
                option if planned == option else "%s (an abbreviation of %s)" % (option, planned),
                "-e %s=<value> instead" % var if var else "leave %s out of args" % option))


def slots_within_gpus(workers, problems):
    """A CUDA host has no more ranks (``deepspeed_slots``) than GPUs: a CUDA rank needs a GPU of its own."""
    for name, w in workers.items():
        gpus, slots = int(w.get("gpus") or 0), w.get("slots")
        if gpus and w.get("accelerator") in (None, "", "cuda") and str(slots).isdigit() and int(slots) > gpus:
            problems.append("host %s: deepspeed_slots=%s, but it has %d GPU(s) (nvidia-smi) and a CUDA rank needs a "
                            "GPU of its own. Fix: deepspeed_slots <= %d for %s, or leave it unset (one rank per GPU)"
                            % (name, slots, gpus, gpus, name))


def rank_layout(workers, include, exclude, problems):
    """Which workers take ranks, with how many, in which order (``hostfile.build``), or None with the problem: only
    workers with slots (GPUs, or deepspeed_slots) can."""
    candidates = dict((name, w.get("slots")) for name, w in workers.items() if w.get("slots") is not None)
    if not candidates:
        problems.append("no worker has GPUs (nvidia-smi found none on %s) and none sets deepspeed_slots. Fix: set "
                        "deepspeed_slots (ranks per node) for CPU workers in the inventory, or check the GPU driver "
                        "on the workers (nvidia-smi)" % (", ".join(workers) or "no workers"))
        return None
    try:
        return build(with_slots(list(candidates), candidates), exclude=exclude, include=include or None)
    except HostfileError as exc:
        problems.append(str(exc))
        return None


def check_answered(workers, rank_hosts):
    """JobError when a rank host did not answer this play (unreachable, or reading it failed)."""
    silent = [h for h in rank_hosts if workers[h].get("answered") is False]
    if silent:
        raise JobError("%s did not answer (unreachable, or reading it failed: the error is above), so a job on %s "
                       "cannot start. Fix: repair %s, or leave it out with -e exclude=%s" % (
                           ", ".join(silent), ", ".join(rank_hosts), ", ".join(silent), ",".join(silent)))


def address_problems(workers, hosts):
    """A rank host's address (its ansible_host) is an IP address or a host name: it becomes DeepSpeed's
    ``--master_addr`` and goes into the launcher's argv and the hostfile."""
    problems = []
    for host in hosts:
        address = workers[host].get("address")
        if address in (None, ""):
            continue
        try:
            ipaddress.ip_address(str(address))
        except ValueError:
            if not HOSTNAME_RE.fullmatch(str(address)):
                problems.append("host %s: ansible_host=%r is neither an IP address nor a host name (it becomes "
                                "DeepSpeed's --master_addr and reaches the launcher's command line). Fix: set "
                                "ansible_host for %s to the node's address, e.g. 10.0.0.11 or gpu1.example.org"
                                % (host, address, host))
    return problems


def checkpoint_dir(job):
    """The model's checkpoint directory under the shared one: by the model's name, and with ``model_path`` by that
    path too (two runs from different weights never share one)."""
    name = job["model"]
    if job.get("model_path"):
        name += "-" + hashlib.sha256(str(job["model_path"]).encode("utf-8")).hexdigest()[:12]
    return "%s/checkpoints/%s" % (job["shared_dir"], name)


def attempt_path(job):
    """Where this attempt's files are under the run's directory: nowhere apart ("") for a run that stops at its
    first failure, else ``attempts/<n>`` (each attempt's logs, metrics and hostfile apart; the checkpoints are
    shared).  The same under ``runs/<id>`` on the cluster and on the controller."""
    return "attempts/%d" % job["attempt"] if job.get("restarts") else ""


def attempt_dir(job):
    """The run directory of this attempt on the cluster."""
    run_dir = "%s/runs/%s" % (job["shared_dir"], job["run_id"])
    return "%s/%s" % (run_dir, attempt_path(job)) if attempt_path(job) else run_dir


def placement(job, layout, workers, coordinators):
    """Where the run is: its directories, its nodes and ranks (the layout), the master and every rank host's address,
    the accelerator (the master's)."""
    rank_hosts = [h["name"] for h in layout["hosts"]]
    master = workers[layout["master"]]
    return {
        "run_dir": attempt_dir(job), "attempt_path": attempt_path(job),
        "checkpoint_dir": checkpoint_dir(job),
        "coordinators": list(coordinators), "rank_hosts": rank_hosts,
        "slots": dict((h["name"], h["slots"]) for h in layout["hosts"]),
        "first_ranks": dict((h["name"], h["first_rank"]) for h in layout["hosts"]),
        "world_size": layout["world_size"], "hostfile": layout["text"], "ranks": layout["ranks"],
        "master": layout["master"], "master_addr": master.get("address") or layout["master"],
        "addresses": dict((h, workers[h].get("address") or h) for h in rank_hosts),
        "accelerator": master.get("accelerator") or ("cuda" if int(master.get("gpus") or 0) > 0 else "cpu"),
    }


def grow_watch(value, workers, rank_hosts):
    """What a shrunken attempt's watch looks out for to grow back (run_recovery's place step gives it; the watch
    acts on it: module_utils/run/grow.py): ``{"nodes", "spares", "width", "missing", "addresses"}`` with the
    candidates that may take ranks (not quarantined, not already the attempt's) and their addresses; None for
    none."""
    if not isinstance(value, dict):
        return None
    nodes = [n for n in value.get("nodes") or [] if n in workers and n not in rank_hosts]
    spares = [n for n in value.get("spares") or [] if n in workers and n not in rank_hosts and n not in nodes]
    width = int(value.get("width") or 0)
    if not (nodes or spares) or width <= len(rank_hosts):
        return None
    return {"nodes": nodes, "spares": spares, "width": width, "missing": width - len(rank_hosts),
            "addresses": dict((n, workers[n].get("address") or n) for n in nodes + spares)}


def common_interface(workers, rank_hosts):
    """The rank hosts' network interface when they all name the same one, else None."""
    interfaces = sorted(set(workers[h].get("interface") for h in rank_hosts) - {None, ""})
    return interfaces[0] if len(interfaces) == 1 else None


def rank_memory_gib(workers, rank_hosts, slots):
    """The memory one rank may use: the smallest rank host's over the most ranks on a host; None when a host's is
    unknown."""
    memory = [workers[h].get("memtotal_mb") for h in rank_hosts]
    return (min(memory) / 1024.0 / max(slots.values())) if all(memory) else None


def plan(settings, workers, coordinators, now, backends):
    """The whole job, or JobError.

    ``settings``: the -e values and inventory settings (keys of DEFAULTS, plus ``run_id``, ``hosts``,
    ``exclude``, ``entrypoint``, ``args``, ``resume``, ``ds_config``, ``model_path``, ``dataset``,
    ``deepspeed_rank_env``, ``hf_token_set``).  ``workers``: inventory name -> ``{"slots" (or None),
    "accelerator" (deepspeed_accelerator, or None), "gpus", "address", "memtotal_mb", "interface",
    "env"}`` in inventory order.  ``coordinators``: inventory names.  ``now``: a datetime (UTC) for
    the default run id.  ``backends``: the launch backends' registry (``launch_backend``)."""
    problems = []
    job = directories(settings, problems)
    run_settings(job, settings, problems)
    recovery_settings(job, settings, problems)
    job["startup_timeout"], job["queue_timeout"] = start_timeouts(settings, job["timeout"], problems)
    backend, backend_options = launch_backend(settings, backends, problems)
    run_id = run_id_for(settings, job["model"], now, problems)
    secret_settings(job, settings, run_id, problems)
    user = user_env(settings, problems)
    entrypoint, args = user_program(settings, problems)
    include, exclude = host_choice(settings, problems)
    args_against_plan(job["resume"], entrypoint, args, problems)
    slots_within_gpus(workers, problems)
    layout = rank_layout(workers, include, exclude, problems)
    if problems:
        raise JobError("; ".join(problems))
    rank_hosts = [h["name"] for h in layout["hosts"]]
    check_answered(workers, rank_hosts)
    problems = address_problems(workers, rank_hosts) + min_nodes_problems(job, rank_hosts)
    if problems:
        raise JobError("; ".join(problems))
    job["scheduler_names"] = dict((h, workers[h].get("scheduler_name") or h) for h in rank_hosts)
    for key in ("avoid", "unquarantine"):
        job[key + "_names"] = dict((h, (workers.get(h) or {}).get("scheduler_name") or h) for h in job[key])
    if set(job["avoid"]) & set(rank_hosts):
        raise JobError("%s both takes ranks and is kept out of the run (avoid). Fix: leave avoid to the play" % (
            ", ".join(sorted(set(job["avoid"]) & set(rank_hosts)))))
    # This play's own token: the run directory is claimed with it (run_prepare), so two plays never share one.
    job["run_token"] = settings.get("run_token") or None
    job.update({"run_id": str(run_id), "backend": backend.NAME, "backend_options": backend_options,
                "entrypoint": entrypoint, "args": args, "warm": bool(job["warm_start"] and backend.start.warm)})
    job["model_path"] = settings.get("model_path") or None
    job.update(placement(job, layout, workers, coordinators), grow=grow_watch(settings.get("grow"), workers, rank_hosts))
    job["metrics"] = not entrypoint
    job.update(user_code(job, settings))
    job["pull_opts"] = pull_options(job)
    job["interface"] = common_interface(workers, rank_hosts)
    job["rank_memory_gib"] = rank_memory_gib(workers, rank_hosts, job["slots"])
    job["env"] = rank_env(job, settings, workers[job["master"]].get("env") or {}, user)
    job["batch"] = batch(job)
    job["program"] = program(job, settings)
    # One run at a time on a checkpoint directory (run_prepare takes it, the watch gives it back).
    job["checkpoint_lock"] = job["checkpoint_dir"] + ".lock" if job["metrics"] else None
    job["stack_fingerprints"] = dict((h, workers[h].get("stack_fingerprint")) for h in rank_hosts)  # node_facts
    problems = backend.options.check(job) + tracker_problems(job, workers[job["master"]])
    if problems:
        raise JobError("; ".join(problems))
    job["launch"] = backend.describe(job)
    job["allreduce"] = allreduce_argv(job)
    job["dry_run"] = dry_run_argv(job) if job["metrics"] else None
    return job


def dry_run_argv(job):
    """The bundled trainer's check of model, data, config and memory (no torch import, nothing trained)."""
    argv = [job["venv"] + "/bin/python", "-m", "multinode_ds.train", "--dry-run", "--world-size",
            str(job["world_size"])]
    if job.get("rank_memory_gib"):
        argv += ["--memory-gib", str(job["rank_memory_gib"])]
    return argv + job["program"][2:]


def allreduce_argv(job):
    """Preflight's all-reduce test with the job's layout, per rank node (``--label``, ``--out`` and
    ``--max-bytes`` are the test's own): the same master, port, ranks and accelerator as the run."""
    backend = "nccl" if job["accelerator"] == "cuda" else "gloo"
    return dict((host, [job["venv"] + "/bin/python", "-m", "multinode_ds.allreduce_perf",
                        "--master-addr", job["master_addr"], "--master-port", str(job["master_port"]),
                        "--world-size", str(job["world_size"]), "--first-rank", str(job["first_ranks"][host]),
                        "--nproc", str(job["slots"][host]), "--backend", backend, "--node", host])
                for host in job["rank_hosts"])
