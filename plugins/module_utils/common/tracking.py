# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Experiment tracking (issue 23): through DeepSpeed's own monitor on the ranks, and MLflow from the controller.

``parse`` reads ``tracking`` (``tensorboard,csv``); ``monitor_section`` fills DeepSpeed's monitor keys of the
ds_config (``tensorboard``, ``csv_monitor``, ``wandb``, ``comet``: written by global rank 0 under the run directory)
without overwriting what the user set, and gives the ranks' environment (wandb and comet offline unless a key is
given).  MLflow is no DeepSpeed monitor: the controller logs the collected run afterwards, from ``mlflow_payload``,
to the store ``validate_mlflow_uri`` checks (by default ``<runs_dir>/mlruns``).

Pure Python, no Ansible import: unit-tested on the controller.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import json
import math
import os
import re

TRACKERS = ("tensorboard", "wandb", "comet", "csv", "mlflow")
# The ds_config key of each tracker DeepSpeed's monitor runs (deepspeed/monitor/config.py); mlflow is none.
SECTIONS = {"tensorboard": "tensorboard", "csv": "csv_monitor", "wandb": "wandb", "comet": "comet"}
# The package DeepSpeed's monitor imports for each tracker, on global rank 0 (provision/node.tracker_packages reads
# whether a node's venv has it; the plan refuses a tracker the master lacks).
MONITOR_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "comet": "comet_ml"}
# The per-step fields of the ranks' step records (multinode_ds/train.py) logged as MLflow metrics.
STEP_METRICS = ("loss", "lr", "step_time", "samples_per_sec", "tokens_per_sec")
# The run-wide numbers of summary.json logged once, as ``run.<name>``.
RUN_METRICS = ("steps", "first_loss", "last_loss", "mean_tokens_per_sec", "wall_time", "goodput")
PARAM_VALUE_MAX = 500
PARAM_KEY_MAX = 250
TAG_VALUE_MAX = 5000
URI_FORMS = "a local path, file:///absolute/path, http(s)://host[:port][/path], sqlite:///path or databricks"


def parse(tracking):
    """The trackers ``tracking`` names (a comma-separated string or a list), in order, each once; [] for none."""
    if not tracking:
        return []
    items = tracking if isinstance(tracking, (list, tuple)) else [tracking]
    names = []
    for item in items:
        for name in str(item).split(","):
            name = name.strip().lower()
            if not name or name in names:
                continue
            if name not in TRACKERS:
                raise ValueError("tracking=%s is not one of %s (comma-separated for several)" % (
                    name, ", ".join(TRACKERS)))
            names.append(name)
    return names


def defaults(run_dir, job_name, has_comet_key=False):
    """What each DeepSpeed monitor section gets unless the user set it: logs under the run directory, named after
    the job (DeepSpeed writes to ``<output_path>/<job_name>/``)."""
    run_dir = run_dir.rstrip("/")
    return {
        "tensorboard": {"enabled": True, "output_path": run_dir + "/tensorboard/", "job_name": job_name},
        "csv_monitor": {"enabled": True, "output_path": run_dir + "/csv/", "job_name": job_name},
        "wandb": {"enabled": True, "group": job_name},
        "comet": {"enabled": True, "experiment_name": job_name, "online": bool(has_comet_key)},
    }


def ranks_env(names, run_dir, has_wandb_key=False, has_comet_key=False):
    """The environment the ranks need for these trackers: wandb and comet write offline files into the run
    directory unless their key is given (never the key itself: it travels as a secret, apart)."""
    run_dir = run_dir.rstrip("/")
    env = {}
    if "wandb" in names:
        # wandb writes into <WANDB_DIR>/wandb/, and wants WANDB_DIR to exist: the run directory does.
        env["WANDB_DIR"] = run_dir
        if not has_wandb_key:
            env["WANDB_MODE"] = "offline"
    if "comet" in names and not has_comet_key:
        env["COMET_OFFLINE_DIRECTORY"] = run_dir + "/comet"
    return env


def monitor_section(names, run_dir, job_name, user_config, has_wandb_key=False, has_comet_key=False):
    """``{"config", "kept", "env", "mlflow"}``: a new ds_config (``user_config`` is not changed) with the monitor
    section of each tracker in ``names`` filled in, the user's values winning; ``kept``: the ``section.key`` the
    user set to other values than these; ``env``: ranks_env's; ``mlflow``: whether the controller logs to MLflow
    after the run."""
    config = copy.deepcopy(user_config) if user_config else {}
    ours = defaults(run_dir, job_name, has_comet_key)
    kept = []
    for name in names:
        section = SECTIONS.get(name)
        if section is None:
            continue
        user = config.get(section)
        if user is None:
            user = {}
        if not isinstance(user, dict):
            raise ValueError("ds_config's %s is %r, not an object: DeepSpeed's monitor reads its keys. Fix: give it "
                             "as {\"enabled\": true, ...}, or leave it out for tracking=%s to fill in" % (
                                 section, user, name))
        merged = dict(ours[section])
        merged.update(user)
        kept += ["%s.%s" % (section, k) for k in sorted(ours[section]) if k in user and user[k] != ours[section][k]]
        config[section] = merged
    return {"config": config, "kept": kept, "env": ranks_env(names, run_dir, has_wandb_key, has_comet_key),
            "mlflow": "mlflow" in names}


def _uri_error(uri, why):
    return ValueError("mlflow_tracking_uri=%s %s. Fix: give %s" % (uri, why, URI_FORMS))


HTTP = re.compile(r"^https?://(?P<host>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])"
                  r"(?::(?P<port>[0-9]{1,5}))?(?P<path>/[^?#]*)?$")


def _check_http(uri):
    authority = uri.split("://", 1)[1].split("/", 1)[0]
    if "@" in authority:
        raise ValueError("mlflow_tracking_uri=%s holds credentials, which would be logged with it. Fix: give the "
                         "URI without them and set MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and "
                         "MLFLOW_TRACKING_PASSWORD, in the controller's environment" % re.sub(
                             r"//[^/]*@", "//***@", uri))
    found = HTTP.match(uri)
    if not found:
        raise _uri_error(uri, "is not http(s)://host[:port][/path]")
    if found.group("port") and not 0 < int(found.group("port")) < 65536:
        raise _uri_error(uri, "has port %s, not one of 1-65535" % found.group("port"))
    return uri


# The controller's environment variables MLflow's client sends to a tracking server as credentials
# (mlflow/environment_variables.py): over plain http they would cross the network in clear.
CREDENTIAL_ENV = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
# The controller's opt-in to send them over plain http to a host that is not this machine (a network you trust).
ALLOW_HTTP_ENV = "MULTINODE_DS_MLFLOW_ALLOW_HTTP"
# Hosts that are this machine: the credentials never leave it.
LOOPBACK = re.compile(r"^(localhost|[a-z0-9.-]+\.localhost|127(\.[0-9]{1,3}){3}|\[0*:(0*:){0,6}0*1\])$")


def _http_host(uri):
    """The host of an ``http(s)://host[:port][/path]`` URI, lower case (an IPv6 address in its brackets); None for
    another form."""
    found = HTTP.match(re.sub(r"^[A-Za-z]+", lambda m: m.group(0).lower(), uri))
    return found.group("host").lower() if found else None


def credentials_in_clear(uri, environ=None):
    """Why logging to ``uri`` would send the controller's MLflow credentials in clear, with the fix; None when it
    would not (https, a host that is this machine, no credentials in ``environ``, or the opt-in set)."""
    environ = os.environ if environ is None else environ
    if not re.match(r"^http://", str(uri), re.I) or LOOPBACK.match(_http_host(str(uri)) or ""):
        return None
    given = [name for name in CREDENTIAL_ENV if environ.get(name)]
    if not given or str(environ.get(ALLOW_HTTP_ENV, "")).strip().lower() in ("1", "true", "yes", "on"):
        return None
    return ("mlflow_tracking_uri=%s is plain http to another host, and %s %s in the controller's environment: "
            "MLflow's client would send %s in clear over the network. Fix: give the server's https:// URI, or unset "
            "%s; on a network you trust, set %s=true in the controller's environment to send them anyway" % (
                uri, " and ".join(given), "is" if len(given) == 1 else "are",
                "it" if len(given) == 1 else "them", " and ".join(given), ALLOW_HTTP_ENV))


def _file_uri(path, cwd=None):
    return "file://" + os.path.abspath(os.path.join(cwd or os.getcwd(), os.path.expanduser(path)))


def validate_mlflow_uri(uri, runs_dir, cwd=None, environ=None):
    """The tracking URI the controller logs to: ``uri`` checked (a local path becomes an absolute ``file:`` URI,
    relative to ``cwd``); unset, ``<runs_dir>/mlruns``.  A plain ``http://`` URI to another host is refused while
    the controller's environment (``environ``, by default this process's) holds MLflow credentials
    (``credentials_in_clear``)."""
    if uri is None or not str(uri).strip():
        return _file_uri(os.path.join(runs_dir, "mlruns"), cwd)
    uri = str(uri)
    if re.search(r"\s", uri):
        raise _uri_error(repr(uri), "has a space or a line break")
    if re.match(r"^databricks(-uc)?(://[A-Za-z0-9_.-]+)?$", uri):
        return uri
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*):", uri)
    if not scheme:
        if re.match(r"^(https?|file|sqlite)//", uri, re.I):
            raise _uri_error(uri, "looks like a URL without its ':' after the scheme")
        return _file_uri(uri, cwd)
    name = scheme.group(1).lower()
    if name in ("http", "https"):
        _check_http(uri)
        clear = credentials_in_clear(uri, environ)
        if clear:
            raise ValueError(clear)
        return uri
    if name == "file":
        if not re.match(r"^file:(//)?/[^/]", uri):
            raise _uri_error(uri, "is not a file: URI of an absolute path on the controller (file:///path)")
        return uri
    if name == "sqlite":
        if not re.match(r"^sqlite:///[^/]|^sqlite:////[^/]", uri):
            raise _uri_error(uri, "is not sqlite:///relative.db or sqlite:////absolute.db")
        return uri
    raise _uri_error(uri, "has the scheme %s:, which is none mlflow_tracking_uri takes here" % name)


def controller_env(uri):
    """The environment the controller's MLflow client needs for ``uri``: mlflow 3.13 and later refuse a ``file:``
    store (the default ``<runs_dir>/mlruns``) unless MLFLOW_ALLOW_FILE_STORE is true."""
    return {"MLFLOW_ALLOW_FILE_STORE": "true"} if str(uri).startswith("file:") else {}


# Every request MLflow's client makes to a tracking server is bounded (mlflow/environment_variables.py; its own
# defaults are 120 s a request and 7 retries with backoff, about 4 minutes a call): the controller's environment
# wins where it sets one of these.
HTTP_LIMITS = (("MLFLOW_HTTP_REQUEST_TIMEOUT", "30"), ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2"),
               ("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1"))
# The most seconds mlflow_log spends logging one run, all its calls together, unless its timeout says otherwise.
LOG_TIMEOUT = 300


def request_limits(environ=None):
    """The MLflow client's request limits to set: each of ``HTTP_LIMITS`` that ``environ`` (by default this
    process's environment) does not set already."""
    environ = os.environ if environ is None else environ
    return dict((name, value) for name, value in HTTP_LIMITS if not str(environ.get(name) or "").strip())


def deadline_message(uri, seconds, environ=None):
    """What mlflow_log says when logging to ``uri`` took more than ``seconds``, with the fix."""
    environ = os.environ if environ is None else environ
    return ("MLflow at %s did not finish logging the run within %ds (each request waits at most "
            "MLFLOW_HTTP_REQUEST_TIMEOUT=%ss, with MLFLOW_HTTP_REQUEST_MAX_RETRIES=%s retries); the run is collected "
            "(summary.json) but not logged to MLflow. Fix: check that the server answers from the controller, or "
            "give a slow one more time with -e mlflow_timeout=<seconds>" % (
                uri, seconds, environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT", "?"),
                environ.get("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "?")))


def _param_value(value):
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text[:PARAM_VALUE_MAX]


def _param_key(key):
    return re.sub(r"[^A-Za-z0-9_\-. /]", "_", str(key))[:PARAM_KEY_MAX]


def flatten(config, prefix=""):
    """``{"zero_optimization": {"stage": 2}}`` -> ``{"zero_optimization.stage": 2}``; a list stays a value."""
    out = {}
    for key, value in sorted((config or {}).items()):
        dotted = "%s%s" % (prefix, key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def _versions(summary):
    """``{"versions.torch": "2.4.0"}`` from the nodes' versions (``{host: {package: version}}``); several values
    when the nodes differ, comma-separated."""
    found = {}
    for versions in (summary.get("versions") or {}).values():
        for package, version in (versions or {}).items():
            found.setdefault(package, set()).add(str(version))
    return dict(("versions.%s" % p, ",".join(sorted(v))) for p, v in found.items())


def params(summary, job, ds_config=None):
    """MLflow params (strings, at most 500 characters): the model, world size, backend, entrypoint, steps, the
    nodes' versions, and the ds_config flattened as ``ds_config.<dotted key>``."""
    raw = {}
    for key in ("model", "world_size", "backend", "entrypoint", "steps", "attempt", "accelerator"):
        value = summary.get(key) if summary.get(key) is not None else job.get(key)
        if value is not None and value != "":
            raw[key] = value
    raw.update(_versions(summary))
    config = ds_config if ds_config is not None else job.get("ds_config")
    if isinstance(config, dict):
        raw.update(flatten(config, "ds_config."))
    elif config:
        raw["ds_config"] = config
    workdir = job.get("workdir") or {}
    if isinstance(workdir, dict) and workdir.get("id"):
        raw["workdir.id"] = workdir["id"]
    return dict((_param_key(k), _param_value(v)) for k, v in raw.items() if v is not None)


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value) \
        and not math.isinf(value)


def step_metrics(rows):
    """``[(key, value, step, timestamp_ms)]`` from the step records: a step's record from the lowest rank that wrote
    one stands for it (as summary.rank_summaries does)."""
    steps = {}
    for row in sorted((r for r in rows or () if r.get("event", "step") == "step" and r.get("step") is not None),
                      key=lambda r: (r.get("rank") or 0, r["step"])):
        steps.setdefault(row["step"], row)
    out = []
    for step in sorted(steps):
        row = steps[step]
        stamp = int(float(row.get("time") or 0) * 1000)
        out += [(key, float(row[key]), int(step), stamp) for key in STEP_METRICS if _number(row.get(key))]
    return out


def run_metrics(summary, stamp):
    """The run-wide numbers of the summary as ``run.<name>`` metrics at step 0."""
    return [("run." + key, float(summary[key]), 0, stamp) for key in RUN_METRICS if _number(summary.get(key))]


def tags(summary, job):
    """The run's MLflow tags: its id (what finds it again), name, status and, with a workdir, the commit."""
    run_id = summary.get("run_id") or job.get("run_id")
    out = {"multinode_ds.run_id": run_id, "mlflow.runName": run_id, "multinode_ds.status": summary.get("status")}
    git = (job.get("workdir") or {}).get("git") or {}
    if git.get("commit"):
        out["multinode_ds.git_commit"] = git["commit"]
        out["multinode_ds.git_dirty"] = git.get("dirty")
    problems = summary.get("problems") or []
    if problems:
        out["multinode_ds.problems"] = "; ".join(str(p) for p in problems)
    return dict((k, str(v)[:TAG_VALUE_MAX]) for k, v in out.items() if v is not None)


def mlflow_payload(summary, metrics_rows, job, ds_config=None):
    """What the controller logs to MLflow for one collected run: ``{"params": {name: str}, "metrics": [(key, value,
    step, timestamp_ms)], "tags": {name: str}}`` from its summary.json, its ranks' metrics records and its job plan
    (``ds_config``: the config the ranks ran with, when the job names only its path)."""
    steps = step_metrics(metrics_rows)
    stamp = max([m[3] for m in steps] or [0])
    return {"params": params(summary, job, ds_config), "metrics": steps + run_metrics(summary, stamp),
            "tags": tags(summary, job)}
