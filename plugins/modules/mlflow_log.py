#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: mlflow_log
short_description: Log a collected run to MLflow - its parameters, its per-step metrics, its summary
version_added: "0.4.0"
description:
  - Runs on the controller after collection (C(train.yml) with C(-e tracking=mlflow)), with the controller's
    C(mlflow) client (C(mlflow-skinny), installed by C(scripts/setup)).
  - Reads the collected run - C(summary.json) and the ranks' step records (C(metrics/rank*.jsonl), every attempt's)
    - and logs one MLflow run into O(experiment) at O(tracking_uri) - the model, world size, backend, entrypoint,
    steps, the nodes' versions, the DeepSpeed config flattened (C(ds_config.<key>)) and the workdir's content id as
    parameters; the loss, learning rate, step time and throughput per step, and the run's totals (C(run.<name>)) as
    metrics; the run id, the status, the git commit and the problems as tags; C(summary.json) and C(report.md) as
    artifacts. The logic is C(plugins/module_utils/common/tracking.py).
  - Idempotent - a run already logged (an MLflow run tagged C(multinode_ds.run_id) with this run's id) is not logged
    again.
  - Reads only regular files of the run's directory, without following a link - a C(ds_config.json),
    C(summary.json) or metrics file that is a symbolic link, a FIFO or a device is not read (a warning names it), so
    nothing outside the run reaches MLflow.
  - No secret is logged - credentials for an MLflow server come from the controller's environment
    (C(MLFLOW_TRACKING_TOKEN), or C(MLFLOW_TRACKING_USERNAME) and C(MLFLOW_TRACKING_PASSWORD)), never from a URI.
    With any of them set, a plain C(http://) O(tracking_uri) to a host other than this machine (C(localhost),
    C(127.0.0.1), C([::1])) is refused before MLflow is called - they would cross the network in clear - unless
    C(MULTINODE_DS_MLFLOW_ALLOW_HTTP=true) is in the controller's environment.
  - Nothing waits without bound - every request to a tracking server waits at most C(MLFLOW_HTTP_REQUEST_TIMEOUT)
    (30 s) with C(MLFLOW_HTTP_REQUEST_MAX_RETRIES) (2) retries and C(MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR) (1), unless
    the controller's environment sets them, and the whole logging stops after O(timeout) seconds, failing with the
    server and the fix.
options:
  run_dir:
    description: The collected run's directory on the controller (C(runs/<run_id>)).
    type: path
    required: true
  run_id:
    description: The run's id.
    type: str
    required: true
  tracking_uri:
    description: The MLflow store (C(job.mlflow.uri) of M(multinode.deepspeed.job_plan); by default the local file
      store C(runs/mlruns)).
    type: str
    required: true
  env:
    description: Environment the client needs (C(job.mlflow.env); C(MLFLOW_ALLOW_FILE_STORE) for a C(file:) store).
    type: dict
    default: {}
  experiment:
    description: The MLflow experiment, created when it does not exist.
    type: str
    default: multinode-deepspeed
  job:
    description: The job (M(multinode.deepspeed.job_plan)'s C(job)) - its model, backend, workdir and DeepSpeed config.
    type: dict
    default: {}
  timeout:
    description: The most seconds the module spends on MLflow, all its calls together (C(-e mlflow_timeout) in
      C(train.yml)).
    type: int
    default: 300
extends_documentation_fragment:
  - multinode.deepspeed.attributes
attributes:
  check_mode:
    support: full
    description: Reads the run and reports what it would log; logs nothing.
  diff_mode:
    description: No diff.
seealso:
  - module: multinode.deepspeed.run_summary
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Log the run to MLflow
  multinode.deepspeed.mlflow_log:
    run_dir: "{{ runs_dir }}/{{ train_job.run_id }}"
    run_id: "{{ train_job.run_id }}"
    tracking_uri: "{{ train_job.mlflow.uri }}"
    env: "{{ train_job.mlflow.env }}"
    job: "{{ train_job }}"
  delegate_to: localhost
"""

RETURN = r"""
mlflow_run_id:
  description: The MLflow run's id (none in check mode when the run is not logged yet).
  returned: always
  type: str
experiment_id:
  description: The experiment's id (none in check mode when it does not exist).
  returned: always
  type: str
metrics:
  description: How many metric values were logged (or would be).
  returned: always
  type: int
message:
  description: Where the run is, and how to look at it (C(mlflow ui --backend-store-uri ...)).
  returned: always
  type: str
refused:
  description: Files of the run's directory it did not read because they are not regular files (a link, a FIFO, a
    device), relative to O(run_dir); a warning names each.
  returned: always
  type: list
  elements: str
"""

import glob
import json
import os
import signal

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.multinode.deepspeed.plugins.module_utils.common import files, tracking

BATCH_METRICS = 1000
BATCH_PARAMS = 100


def read_rows(run_dir, refused=None):
    """The ranks' records of every attempt (``metrics/rank*.jsonl``); a line that is not JSON is skipped, a file
    that is not a regular file is not read (common/files.py; named in ``refused``)."""
    rows = []
    for path in sorted(glob.glob(os.path.join(run_dir, "metrics", "rank*.jsonl")) +
                       glob.glob(os.path.join(run_dir, "attempts", "*", "metrics", "rank*.jsonl"))):
        for line in (files.read_text(path, run_dir, refused=refused) or "").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def job_config(job, run_dir, refused=None):
    """The DeepSpeed config the ranks ran with: the run's collected ds_config.json (the bundled trainer writes the
    whole config it generated there) when it is a regular file, else the one the plan wrote for them."""
    try:
        found = files.read_json(os.path.join(run_dir, "ds_config.json"), run_dir, refused=refused)
    except ValueError:
        found = None
    if isinstance(found, dict):
        return found
    text = (job.get("ds_config") or {}).get("text")
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def log(module, payload, status, artifacts):
    """Log ``payload`` as a new run, or find the run logged already: (run id, experiment id, changed)."""
    from mlflow.entities import Metric, Param, RunTag  # pylint: disable=import-outside-toplevel
    from mlflow.tracking import MlflowClient  # pylint: disable=import-outside-toplevel
    params = module.params
    client = MlflowClient(tracking_uri=params["tracking_uri"])
    experiment = client.get_experiment_by_name(params["experiment"])
    if experiment is not None:
        found = client.search_runs([experiment.experiment_id], max_results=1, filter_string=(
            "tags.`multinode_ds.run_id` = '%s'" % params["run_id"]))
        if found:
            return found[0].info.run_id, experiment.experiment_id, False
    if module.check_mode:
        return None, experiment.experiment_id if experiment else None, True
    experiment_id = experiment.experiment_id if experiment else client.create_experiment(params["experiment"])
    run = client.create_run(experiment_id, tags=payload["tags"], run_name=params["run_id"])
    run_id = run.info.run_id
    items = sorted(payload["params"].items())
    for i in range(0, len(items), BATCH_PARAMS):
        client.log_batch(run_id, params=[Param(k, v) for k, v in items[i:i + BATCH_PARAMS]])
    metrics = payload["metrics"]
    for i in range(0, len(metrics), BATCH_METRICS):
        client.log_batch(run_id, metrics=[Metric(k, v, stamp, step) for k, v, step, stamp in
                                          metrics[i:i + BATCH_METRICS]])
    client.log_batch(run_id, tags=[RunTag("multinode_ds.logged_by", "multinode.deepspeed.mlflow_log")])
    for path in artifacts:
        client.log_artifact(run_id, path)
    client.set_terminated(run_id, status="FINISHED" if status == "success" else "FAILED")
    return run_id, experiment_id, True


class Deadline(BaseException):
    """The module's O(timeout) passed while MLflow's client was still at work (a BaseException: MLflow's client
    wraps every Exception of a request into its own, and must not take this one for a failed request)."""


EXPIRED = []


def _on_alarm(signum, frame):  # pylint: disable=unused-argument
    EXPIRED.append(True)
    raise Deadline()


def log_within(module, payload, status, artifacts):
    """``log``, stopped after the module's ``timeout`` seconds (SIGALRM: a request blocked on the network is
    interrupted too); fails the module, naming the server and the fix, when it does not finish in time."""
    params = module.params
    seconds = max(1, int(params["timeout"]))
    del EXPIRED[:]
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.alarm(seconds)
    try:
        return log(module, payload, status, artifacts)
    except Deadline:
        module.fail_json(msg=tracking.deadline_message(params["tracking_uri"], seconds))
    except Exception as exc:  # pylint: disable=broad-except  # MLflow's errors are many; each is the store's answer
        if EXPIRED:
            module.fail_json(msg=tracking.deadline_message(params["tracking_uri"], seconds))
        module.fail_json(msg="MLflow at %s refused the run: %s. Fix: check mlflow_tracking_uri and that the store is "
                             "reachable from the controller" % (params["tracking_uri"], exc))
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return None


def client_environment(module):
    """The MLflow client's environment: the job's (O(env)), each request bounded (tracking.request_limits), and a
    refusal of credentials sent in clear (tracking.credentials_in_clear) before anything is called."""
    params = module.params
    os.environ.update(dict((str(k), str(v)) for k, v in params["env"].items()))
    os.environ.update(tracking.request_limits(os.environ))
    clear = tracking.credentials_in_clear(params["tracking_uri"], os.environ)
    if clear:
        module.fail_json(msg=clear)


def main():
    module = AnsibleModule(argument_spec=dict(run_dir=dict(type="path", required=True),
                                              run_id=dict(type="str", required=True),
                                              tracking_uri=dict(type="str", required=True),
                                              env=dict(type="dict", default={}),
                                              experiment=dict(type="str", default="multinode-deepspeed"),
                                              job=dict(type="dict", default={}),
                                              timeout=dict(type="int", default=tracking.LOG_TIMEOUT)),
                           supports_check_mode=True)
    params = module.params
    client_environment(module)
    try:
        import mlflow  # noqa: F401  # pylint: disable=import-outside-toplevel,unused-import
    except ImportError as exc:
        module.fail_json(msg=missing_required_lib("mlflow-skinny", reason="for tracking=mlflow") +
                         " Fix: run scripts/setup (it installs the controller's pinned mlflow-skinny)",
                         exception=str(exc))
    run_dir, refused = params["run_dir"], []
    try:
        summary = files.read_json(os.path.join(run_dir, "summary.json"), run_dir, refused=refused)
        if not isinstance(summary, dict):
            raise ValueError("missing, or not a regular file holding a JSON object")
    except (OSError, ValueError) as exc:
        module.fail_json(msg="the run's summary.json cannot be read (%s), so the run is not logged to MLflow" % exc)
    payload = tracking.mlflow_payload(summary, read_rows(run_dir, refused), params["job"],
                                      job_config(params["job"], run_dir, refused))
    artifacts = [os.path.join(run_dir, n) for n in ("summary.json", "report.md")
                 if files.is_regular(os.path.join(run_dir, n), run_dir)]
    for name in sorted(set(refused)):
        module.warn("mlflow_log: %s in the run's directory is not a regular file (a link, a FIFO, ...): not read"
                    % name)
    run_id, experiment_id, changed = log_within(module, payload, summary.get("status"), artifacts)
    message = "MLflow: run %s in experiment %s at %s%s; see it with: mlflow ui --backend-store-uri %s" % (
        run_id or "(not logged yet)", params["experiment"], params["tracking_uri"],
        "" if changed else " (logged before)", params["tracking_uri"])
    module.exit_json(changed=changed, mlflow_run_id=run_id, experiment_id=experiment_id,
                     metrics=len(payload["metrics"]), message=message, refused=sorted(set(refused)))


if __name__ == "__main__":
    main()
