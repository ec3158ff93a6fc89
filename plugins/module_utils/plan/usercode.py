# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What the user brings from the controller: the workdir, the DeepSpeed config, the trackers (issue 23).

``gather(settings, cwd, runs_dir)`` reads them where ``ansible-playbook`` runs, before anything on the nodes
changes: the workdir (``workdir``, ``workdir_exclude``, ``workdir_max_mb``, ``workdir_include_secrets``,
``workdir_allow_private``: plan/workdir.py), the config
(``ds_config``, or ``--deepspeed_config`` in ``args``: plan/dsconfig.py; a JSON object, each key once), the trackers
(``tracking``) and the MLflow store (``mlflow_tracking_uri``: common/tracking.py).  It returns ``(inputs, problems)``;
``plan/job.plan`` turns ``inputs`` into the job (where the workdir goes on the cluster, the config file the ranks
read, the monitor sections, the environment).

Stdlib only, no Ansible import: unit-tested on the controller.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

from ansible_collections.multinode.deepspeed.plugins.module_utils.common import tracking
from ansible_collections.multinode.deepspeed.plugins.module_utils.common.secret_names import secret_name
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan import dsconfig, workdir
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import FALSE_WORDS, TRUE_WORDS

MAX_MB = 512
# A user's DeepSpeed config is a small JSON file: a bigger one is surely another file.
CONFIG_MAX_BYTES = 1024 * 1024


def _no_duplicates(pairs):
    keys = [k for k, _v in pairs]
    twice = sorted(set(k for k in keys if keys.count(k) > 1))
    if twice:
        raise ValueError("the key %s is given twice (JSON keeps only the last one)" % ", ".join(twice))
    return dict(pairs)


def read_config(path, given):
    """The JSON object in the controller's file ``path`` (``given``: how the user named it, for the message)."""
    if not os.path.isfile(path):
        raise ValueError("ds_config=%s is not a file on the controller (looked for %s). Fix: give the path of your "
                         "DeepSpeed JSON config on the machine that runs ansible-playbook" % (given, path))
    if os.path.getsize(path) > CONFIG_MAX_BYTES:
        raise ValueError("ds_config=%s is %d bytes, not a DeepSpeed config. Fix: give your DeepSpeed JSON config"
                         % (given, os.path.getsize(path)))
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle, object_pairs_hook=_no_duplicates)
    except UnicodeDecodeError:
        raise ValueError("ds_config=%s is not text. Fix: give your DeepSpeed JSON config" % given)
    except ValueError as exc:
        raise ValueError("ds_config=%s is not JSON: %s. Fix: correct the file (python3 -m json.tool %s shows where)"
                         % (given, exc, given))
    except RecursionError:
        raise ValueError(dsconfig.depth_problem(given, None))
    if dsconfig.too_deep(config):
        raise ValueError(dsconfig.depth_problem(given, dsconfig.too_deep(config)))
    if not isinstance(config, dict):
        raise ValueError("ds_config=%s holds a JSON %s, not an object. Fix: a DeepSpeed config is one JSON object "
                         "({\"train_micro_batch_size_per_gpu\": 4, ...})" % (given, type(config).__name__))
    return config


def secret_keys(config, prefix=""):
    """The dotted keys of ``config`` whose name says they hold a secret (``comet.api_key``) and that hold a value."""
    out = []
    for key, value in sorted((config or {}).items()):
        dotted = prefix + str(key)
        if isinstance(value, dict):
            out += secret_keys(value, dotted + ".")
        elif value not in (None, "") and secret_name(key):
            out.append(dotted)
    return out


def _max_mb(settings, problems):
    value = settings.get("workdir_max_mb")
    if value in (None, ""):
        return MAX_MB
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1
    if isinstance(value, bool) or not number > 0:
        problems.append("workdir_max_mb=%s is not a size in MiB above 0. Fix: -e workdir_max_mb=<MiB, default %d>"
                        % (value, MAX_MB))
        return None
    return number


def _patterns(settings, key, problems, example="*.pt or data/raw/"):
    """``workdir_exclude`` or ``workdir_include_secrets``: patterns, comma-separated or a list."""
    value = settings.get(key)
    if value in (None, ""):
        return []
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    out = [str(x).strip() for x in items if str(x).strip()]
    for pattern in out:
        if "\n" in pattern or "\0" in pattern:
            problems.append("%s: %r is not a pattern. Fix: give patterns such as %s" % (key, pattern, example))
    return out


def _allow_private(settings, problems):
    """``workdir_allow_private``: a yes/no value, as Ansible reads booleans (default no)."""
    value = settings.get("workdir_allow_private")
    if value is None or isinstance(value, bool):
        return bool(value)
    word = str(value).strip().lower()
    if word not in TRUE_WORDS + FALSE_WORDS:
        problems.append("workdir_allow_private=%s is not a yes/no value. Fix: -e workdir_allow_private=true or "
                        "-e workdir_allow_private=false" % value)
    return word in TRUE_WORDS


def _workdir(settings, cwd, problems):
    if settings.get("workdir") in (None, ""):
        return None
    max_mb, excludes = _max_mb(settings, problems), _patterns(settings, "workdir_exclude", problems)
    include = _patterns(settings, "workdir_include_secrets", problems, ".env.ci or certs/ca.pem")
    allow = _allow_private(settings, problems)
    if max_mb is None or problems:
        return None
    if not settings.get("entrypoint"):
        problems.append("workdir=%s is given without entrypoint: the bundled trainer needs no workdir. Fix: "
                        "-e entrypoint=<your script, relative to the workdir>, or leave workdir out"
                        % settings["workdir"])
        return None
    try:
        return workdir.plan(str(settings["workdir"]), str(settings["entrypoint"]), excludes, max_mb, cwd,
                            include_secrets=include, allow_private=allow)
    except workdir.WorkdirError as exc:
        problems.append(str(exc))
        return None


def _config(settings, cwd, shipped, problems):
    """``(config dict or None, its path on the controller, args without --deepspeed_config)``."""
    try:
        given, rest = dsconfig.choose(settings.get("ds_config") or None, str(settings.get("args") or ""))
    except ValueError as exc:
        text = str(exc)
        problems.append("%s. Fix: %s" % tuple(text.split(" \u2014 ", 1)) if " \u2014 " in text else text)
        return None, None, settings.get("args")
    if not given:
        return None, None, rest
    in_args = not settings.get("ds_config")
    # In args the path is the script's: relative to the workdir (the ranks' working directory) when there is one.
    base = shipped["root"] if in_args and shipped else cwd
    path = os.path.normpath(os.path.join(base, os.path.expanduser(str(given))))
    try:
        config = read_config(path, given)
    except ValueError as exc:
        problems.append(str(exc))
        return None, path, rest
    for key in secret_keys(config):
        problems.append("ds_config=%s: %s holds a secret, and the config is written to the run directory (collected, "
                        "logged to MLflow). Fix: leave it out and give it to the ranks in secret_env (e.g. "
                        "COMET_API_KEY, WANDB_API_KEY; vault it with ansible-vault)" % (given, key))
    return config, path, rest


def gather(settings, cwd, runs_dir):
    """``(inputs, problems)``: ``inputs`` is ``{"workdir": workdir.plan's answer or None, "ds_config": the user's
    config or None, "ds_config_source": its path on the controller, "args": args without --deepspeed_config,
    "tracking": [names], "mlflow_uri": the store or None}``."""
    problems = []
    shipped = _workdir(settings, cwd, problems)
    config, source, rest = _config(settings, cwd, shipped, problems)
    try:
        names = tracking.parse(settings.get("tracking"))
    except ValueError as exc:
        problems.append("%s. Fix: -e tracking=tensorboard (or wandb, comet, csv, mlflow; several comma-separated)"
                        % exc)
        names = []
    uri = None
    if "mlflow" in names or settings.get("mlflow_tracking_uri"):
        try:
            uri = tracking.validate_mlflow_uri(settings.get("mlflow_tracking_uri"), runs_dir, cwd)
        except ValueError as exc:
            problems.append(str(exc))
        if settings.get("mlflow_tracking_uri") and "mlflow" not in names:
            problems.append("mlflow_tracking_uri is given, but tracking does not name mlflow. Fix: -e tracking=mlflow"
                            " (with your other trackers, comma-separated)")
    return {"workdir": shipped, "ds_config": config, "ds_config_source": source, "args": rest,
            "tracking": names, "mlflow_uri": uri}, problems
