"""The controller's modules that read and write a collected run (mlflow_log, run_recovery) against links rank code
left in the run's directory: a ds_config.json link to a controller file gives MLflow none of its values, and a
report.md or summary.json link is replaced, never written through."""
import json
import os
import stat

import pytest

from ansible_collections.multinode.deepspeed.plugins.modules import mlflow_log, run_recovery

SECRET = {"aws_secret_access_key": "s3cr3t-value", "nested": {"token": "s3cr3t-token"}}


def outside_file(tmp_path):
    path = tmp_path / "home" / "credentials.json"
    path.parent.mkdir()
    path.write_text(json.dumps(SECRET))
    return path


def test_a_ds_config_link_to_a_controller_file_yields_no_params(tmp_path, run_module, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run = tmp_path / "runs" / "r1"
    (run / "metrics").mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps({"run_id": "r1", "status": "failed", "world_size": 2}))
    (run / "report.md").write_text("# Run r1\n")
    secret = outside_file(tmp_path)
    os.symlink(str(secret), str(run / "ds_config.json"))
    os.symlink(str(secret), str(run / "metrics" / "rank0.jsonl"))
    store = tmp_path / "mlruns"
    res = run_module(mlflow_log, {"run_dir": str(run), "run_id": "r1", "tracking_uri": "file://%s" % store,
                                  "env": {"MLFLOW_ALLOW_FILE_STORE": "true"}, "job": {"run_id": "r1"}})
    assert res["changed"] is True, res
    from mlflow.tracking import MlflowClient  # pylint: disable=import-outside-toplevel
    logged = MlflowClient("file://%s" % store).get_run(res["mlflow_run_id"]).data
    values = json.dumps([logged.params, logged.tags, logged.metrics])
    assert "s3cr3t" not in values and not [k for k in logged.params if k.startswith("ds_config.")]
    assert logged.params["world_size"] == "2"
    assert res["refused"] == ["ds_config.json", "metrics/rank0.jsonl"]


def test_the_run_over_its_attempts_replaces_links_in_place_of_its_files(tmp_path, run_module):
    pytest.importorskip("matplotlib")
    run = tmp_path / "runs" / "r1"
    (run / "attempts" / "1").mkdir(parents=True)
    (run / "attempts" / "1" / "summary.json").write_text(json.dumps(
        {"status": "success", "started": 1000.0, "hosts": {"worker1": [0]}, "problems": []}))
    secret = outside_file(tmp_path)
    before = secret.read_text()
    for name in ("summary.json", "report.md"):
        os.symlink(str(secret), str(run / name))
    os.symlink(str(secret), str(run / "attempts" / "1" / "recovery.json"))
    res = run_module(run_recovery, {"run_dir": str(run), "run_id": "r1", "attempt": 1, "step": "finish",
                                    "started": 1000.0, "spares_file": str(tmp_path / "spares.json")})
    assert res["summary"]["status"] == "success", res
    assert secret.read_text() == before
    for name in ("summary.json", "report.md", "plots/timeline.png"):
        assert stat.S_ISREG(os.lstat(str(run / name)).st_mode), name
    assert "s3cr3t" not in (run / "summary.json").read_text()
