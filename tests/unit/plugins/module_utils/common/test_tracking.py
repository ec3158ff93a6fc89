"""Experiment tracking: DeepSpeed's monitor sections filled in without overwriting the user's, the ranks' offline
environment, the MLflow store's URI and what the controller logs there."""
import json
import os

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.common.tracking import (
    controller_env, flatten, mlflow_payload, monitor_section, parse, validate_mlflow_uri)

RUN_DIR = "/srv/multinode-deepspeed/runs/20261123-170005-000-llama-tiny"
JOB_NAME = "20261123-170005-000-llama-tiny"


@pytest.mark.parametrize("tracking, names", [
    (None, []),
    ("", []),
    ([], []),
    ("tensorboard", ["tensorboard"]),
    ("tensorboard, CSV,tensorboard", ["tensorboard", "csv"]),
    (["wandb", "mlflow,comet"], ["wandb", "mlflow", "comet"]),
    ("csv,,", ["csv"]),
])
def test_parse(tracking, names):
    assert parse(tracking) == names


@pytest.mark.parametrize("tracking", ["foo", "tensorboard,foo", ["csv", "foo"]])
def test_parse_refuses_an_unknown_tracker_naming_the_choices(tracking):
    with pytest.raises(ValueError) as err:
        parse(tracking)
    assert str(err.value) == "tracking=foo is not one of tensorboard, wandb, comet, csv, mlflow (comma-separated for " \
                             "several)"


def test_tensorboard_and_csv_write_under_the_run_directory():
    user = {"train_batch_size": 8}
    out = monitor_section(["tensorboard", "csv"], RUN_DIR, JOB_NAME, user)
    assert out["config"] == {
        "train_batch_size": 8,
        "tensorboard": {"enabled": True, "output_path": RUN_DIR + "/tensorboard/", "job_name": JOB_NAME},
        "csv_monitor": {"enabled": True, "output_path": RUN_DIR + "/csv/", "job_name": JOB_NAME},
    }
    assert out["kept"] == [] and out["env"] == {} and out["mlflow"] is False
    assert user == {"train_batch_size": 8}, "the user's config is not changed"


def test_the_users_monitor_keys_win_and_are_reported():
    user = {"tensorboard": {"output_path": "/data/tb", "job_name": JOB_NAME},
            "csv_monitor": {"enabled": False}, "wandb": {"project": "mine", "team": "lab"}}
    out = monitor_section(["tensorboard", "csv", "wandb"], RUN_DIR + "/", JOB_NAME, user)
    config = out["config"]
    assert config["tensorboard"] == {"enabled": True, "output_path": "/data/tb", "job_name": JOB_NAME}
    assert config["csv_monitor"]["enabled"] is False
    assert config["wandb"] == {"enabled": True, "group": JOB_NAME, "project": "mine", "team": "lab"}
    # The job name the user gave is ours too: nothing was kept over it.
    assert out["kept"] == ["tensorboard.output_path", "csv_monitor.enabled"]


def test_a_section_the_tracking_does_not_name_is_left_alone():
    user = {"comet": {"enabled": True, "project": "p"}}
    out = monitor_section(["csv"], RUN_DIR, JOB_NAME, user)
    assert out["config"]["comet"] == {"enabled": True, "project": "p"} and "tensorboard" not in out["config"]
    assert monitor_section([], RUN_DIR, JOB_NAME, None)["config"] == {}


def test_a_monitor_section_that_is_not_an_object_is_refused():
    with pytest.raises(ValueError, match="ds_config's tensorboard is True, not an object"):
        monitor_section(["tensorboard"], RUN_DIR, JOB_NAME, {"tensorboard": True})


def test_wandb_and_comet_run_offline_into_the_run_directory_without_a_key():
    out = monitor_section(["wandb", "comet", "mlflow"], RUN_DIR, JOB_NAME, {})
    assert out["env"] == {"WANDB_MODE": "offline", "WANDB_DIR": RUN_DIR, "COMET_OFFLINE_DIRECTORY": RUN_DIR + "/comet"}
    assert out["config"]["comet"] == {"enabled": True, "experiment_name": JOB_NAME, "online": False}
    assert out["mlflow"] is True and "mlflow" not in out["config"]
    keyed = monitor_section(["wandb", "comet"], RUN_DIR, JOB_NAME, {}, has_wandb_key=True, has_comet_key=True)
    assert keyed["env"] == {"WANDB_DIR": RUN_DIR}
    assert keyed["config"]["comet"]["online"] is True
    assert not any("KEY" in k for k in keyed["env"])


def test_deepspeed_reads_the_sections():
    config = pytest.importorskip("deepspeed.monitor.config")
    out = monitor_section(["tensorboard", "csv", "wandb", "comet"], RUN_DIR, JOB_NAME, {"wandb": {"team": "lab"}})
    monitor = config.get_monitor_config(out["config"])
    assert monitor.enabled and monitor.tensorboard.output_path == RUN_DIR + "/tensorboard/"
    assert monitor.csv_monitor.job_name == JOB_NAME and monitor.wandb.group == JOB_NAME and monitor.wandb.team == "lab"
    assert monitor.comet.online is False


@pytest.mark.parametrize("uri, out", [
    ("/data/mlruns", "file:///data/mlruns"),
    ("mlruns", "file:///home/u/mlruns"),
    ("~/mlruns", "file://%s/mlruns" % os.path.expanduser("~")),
    ("file:///data/mlruns", "file:///data/mlruns"),
    ("file:/data/mlruns", "file:/data/mlruns"),
    ("http://mlflow:5000", "http://mlflow:5000"),
    ("https://mlflow.example.com/tracking/", "https://mlflow.example.com/tracking/"),
    ("http://10.0.0.5:8080", "http://10.0.0.5:8080"),
    ("http://[::1]:5000", "http://[::1]:5000"),
    ("sqlite:///mlflow.db", "sqlite:///mlflow.db"),
    ("sqlite:////data/mlflow.db", "sqlite:////data/mlflow.db"),
    ("databricks", "databricks"),
    ("databricks://my-profile", "databricks://my-profile"),
])
def test_mlflow_uri_forms(uri, out):
    assert validate_mlflow_uri(uri, "/home/u/runs", cwd="/home/u") == out


def test_mlflow_default_is_the_runs_directory_as_an_absolute_file_uri():
    assert validate_mlflow_uri(None, "/home/u/runs") == "file:///home/u/runs/mlruns"
    assert validate_mlflow_uri("", "runs", cwd="/home/u") == "file:///home/u/runs/mlruns"


@pytest.mark.parametrize("uri, why", [
    ("http//x", "looks like a URL without its ':'"),
    ("ftp://host/x", "has the scheme ftp:"),
    ("http://", r"is not http\(s\)://host"),
    ("http://:5000", r"is not http\(s\)://host"),
    ("http://host:99999", "has port 99999"),
    ("http://my host:5000", "has a space"),
    ("/data/ml runs", "has a space"),
    ("file://host/data", "is not a file: URI of an absolute path"),
    ("file:mlruns", "is not a file: URI of an absolute path"),
    ("sqlite://mlflow.db", "is not sqlite:///"),
    ("databricks:x", "has the scheme databricks:"),
])
def test_malformed_mlflow_uris_are_refused_naming_the_variable_and_the_fix(uri, why):
    with pytest.raises(ValueError, match=why) as err:
        validate_mlflow_uri(uri, "/runs")
    assert "mlflow_tracking_uri=" in str(err.value) and "Fix: give a local path, file:///" in str(err.value)


def test_a_file_store_is_allowed_for_mlflow_3_13_and_later():
    assert controller_env(validate_mlflow_uri(None, "/runs")) == {"MLFLOW_ALLOW_FILE_STORE": "true"}
    assert controller_env("http://mlflow:5000") == {} and controller_env("sqlite:///m.db") == {}


def test_credentials_in_the_mlflow_uri_are_refused_and_not_repeated():
    with pytest.raises(ValueError, match="holds credentials.*MLFLOW_TRACKING_USERNAME") as err:
        validate_mlflow_uri("https://me:hunter2@mlflow.example.com", "/runs")
    assert "hunter2" not in str(err.value)


def test_flatten_uses_dotted_keys():
    assert flatten({"zero_optimization": {"stage": 2, "offload": {"device": "cpu"}}, "fp16": {}, "bs": [1, 2]}) == {
        "bs": [1, 2], "fp16": {}, "zero_optimization.offload.device": "cpu", "zero_optimization.stage": 2}


def _step(rank, step, loss, time=1790000000.0):
    return {"event": "step", "step": step, "total_steps": 2, "loss": loss, "loss_local": loss + rank, "lr": 0.001,
            "step_time": 0.5 + rank, "samples_per_sec": 4.0, "tokens_per_sec": 512.0, "rank": rank, "local_rank": 0,
            "world_size": 2, "host": "worker%d" % (rank + 1), "time": time + step}


SUMMARY = {"run_id": JOB_NAME, "status": "success", "problems": [], "world_size": 2, "model": "llama-tiny",
           "backend": "pdsh", "entrypoint": "multinode_ds.train", "steps": 2, "first_loss": 5.0, "last_loss": 4.0,
           "mean_tokens_per_sec": 512.0, "wall_time": 12.5, "goodput": None,
           "versions": {"worker1": {"torch": "2.4.0", "deepspeed": "0.16.0"},
                        "worker2": {"torch": "2.4.1", "deepspeed": "0.16.0"}}}


def test_mlflow_payload_from_the_summary_and_the_step_records():
    rows = [{"event": "start", "rank": 0}, _step(1, 1, 5.0), _step(0, 1, 5.0), _step(0, 2, 4.0), _step(1, 2, 4.0),
            {"event": "done", "rank": 0}]
    ds_config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 2}, "note": "x" * 600}
    job = {"model": "llama-tiny", "run_id": JOB_NAME, "ds_config": "/shared/ds.json",
           "workdir": {"id": "0123456789abcdef", "git": {"commit": "c0ffee", "dirty": False}}}
    payload = mlflow_payload(SUMMARY, rows, job, ds_config)
    params = payload["params"]
    assert params["model"] == "llama-tiny" and params["world_size"] == "2" and params["backend"] == "pdsh"
    assert params["versions.torch"] == "2.4.0,2.4.1" and params["versions.deepspeed"] == "0.16.0"
    assert params["ds_config.zero_optimization.stage"] == "2" and params["ds_config.note"] == "x" * 500
    assert params["workdir.id"] == "0123456789abcdef"
    assert all(isinstance(v, str) and len(v) <= 500 for v in params.values())
    metrics = payload["metrics"]
    # Rank 0's record stands for each step.
    assert ("step_time", 0.5, 1, 1790000001000) in metrics and ("step_time", 1.5, 1, 1790000001000) not in metrics
    assert [m for m in metrics if m[0] == "loss"] == [("loss", 5.0, 1, 1790000001000), ("loss", 4.0, 2, 1790000002000)]
    assert ("run.wall_time", 12.5, 0, 1790000002000) in metrics and not any(m[0] == "run.goodput" for m in metrics)
    assert payload["tags"] == {"multinode_ds.run_id": JOB_NAME, "mlflow.runName": JOB_NAME,
                               "multinode_ds.status": "success", "multinode_ds.git_commit": "c0ffee",
                               "multinode_ds.git_dirty": "False"}
    json.dumps(payload)


def test_mlflow_payload_of_a_failed_users_script_without_metrics():
    summary = {"run_id": "r1", "status": "failed", "problems": ["rank 1 on w2 exited with 1"], "world_size": None,
               "entrypoint": "train.py", "wall_time": float("nan")}
    job = {"world_size": 4, "backend": "slurm", "ds_config": {"zero_optimization": {"stage": 3}}}
    payload = mlflow_payload(summary, [], job)
    assert payload["params"] == {"world_size": "4", "backend": "slurm", "entrypoint": "train.py",
                                 "ds_config.zero_optimization.stage": "3"}
    assert payload["metrics"] == []
    assert payload["tags"]["multinode_ds.problems"] == "rank 1 on w2 exited with 1"
