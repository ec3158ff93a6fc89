"""mlflow_log against a real MLflow file store: the collected run's params, per-step loss and tags, found again by
MLflow's own client; logged once; check mode logs nothing; the ds_config the ranks ran with."""
import json

import pytest

from ansible_collections.multinode.deepspeed.plugins.modules import mlflow_log

pytest.importorskip("mlflow")


@pytest.fixture(name="run_dir")
def run_dir_fixture(tmp_path):
    run = tmp_path / "runs" / "r1"
    (run / "metrics").mkdir(parents=True)
    summary = {"run_id": "r1", "status": "success", "model": "llama-tiny", "world_size": 2, "backend": "pdsh",
               "steps": 3, "first_loss": 5.5, "last_loss": 5.1, "versions": {"worker1": {"torch": "2.13.0"}}}
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "report.md").write_text("# Run r1\n")
    rows = [{"event": "step", "rank": r, "step": s, "loss": 5.5 - 0.2 * (s - 1) + r, "lr": 1e-3, "time": 1.0e9 + s}
            for r in (0, 1) for s in (1, 2, 3)]
    (run / "metrics" / "rank0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows if x["rank"] == 0)
                                                 + "not json\n")
    (run / "metrics" / "rank1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in rows if x["rank"] == 1))
    # The whole config the bundled trainer wrote: what MLflow gets, rather than the user's part the plan had.
    (run / "ds_config.json").write_text(json.dumps({"zero_optimization": {"stage": 1},
                                                    "tensorboard": {"enabled": True}}))
    return run


def args(run_dir, store, **more):
    out = {"run_dir": str(run_dir), "run_id": "r1", "tracking_uri": "file://%s" % store,
           "env": {"MLFLOW_ALLOW_FILE_STORE": "true"},
           "job": {"run_id": "r1", "ds_config": {"text": json.dumps({"tensorboard": {"enabled": True}})}}}
    out.update(more)
    return out


def test_logs_the_run_once_and_mlflow_finds_it(run_dir, tmp_path, run_module, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    store = tmp_path / "mlruns"
    checked = run_module(mlflow_log, args(run_dir, store, _ansible_check_mode=True))
    assert checked["changed"] is True and checked["mlflow_run_id"] is None
    res = run_module(mlflow_log, args(run_dir, store))
    assert res["changed"] is True and res["metrics"] > 0, res
    assert "mlflow ui --backend-store-uri file://%s" % store in res["message"]
    from mlflow.tracking import MlflowClient  # pylint: disable=import-outside-toplevel
    client = MlflowClient("file://%s" % store)
    run = client.get_run(res["mlflow_run_id"])
    assert run.info.status == "FINISHED" and run.data.tags["multinode_ds.run_id"] == "r1"
    assert run.data.params["world_size"] == "2" and run.data.params["versions.torch"] == "2.13.0"
    assert run.data.params["ds_config.zero_optimization.stage"] == "1"
    # Rank 0's record stands for each step.
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")] == [
        (1, 5.5), (2, pytest.approx(5.3)), (3, pytest.approx(5.1))]
    assert sorted(a.path for a in client.list_artifacts(run.info.run_id)) == ["report.md", "summary.json"]
    again = run_module(mlflow_log, args(run_dir, store))
    assert again["changed"] is False and again["mlflow_run_id"] == res["mlflow_run_id"]
    assert "(logged before)" in again["message"]
    # One run in all: check mode logged none, the second call none.
    assert len(client.search_runs([run.info.experiment_id])) == 1


def test_a_run_without_its_summary_is_not_logged(tmp_path, run_module):
    res = run_module(mlflow_log, args(tmp_path / "missing", tmp_path / "mlruns"))
    assert res["failed"] is True and "summary.json cannot be read" in res["msg"]


def test_credentials_for_another_host_over_plain_http_are_refused_before_mlflow_is_called(run_dir, tmp_path, run_module,
                                                                                          monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", "s3cret")
    monkeypatch.delenv("MULTINODE_DS_MLFLOW_ALLOW_HTTP", raising=False)
    called = []
    monkeypatch.setattr(mlflow_log, "log", lambda *a: called.append(a))
    res = run_module(mlflow_log, args(run_dir, tmp_path, tracking_uri="http://mlflow.example.com:5000"))
    assert res["failed"] is True and called == []
    assert "MLFLOW_TRACKING_TOKEN is in the controller's environment" in res["msg"] and "s3cret" not in res["msg"]


def test_every_request_is_bounded_and_the_whole_logging_stops_at_its_timeout(run_dir, tmp_path, run_module,
                                                                             monkeypatch):
    import socket
    import time

    # A server that takes the connection and never answers (a hung tracking server).
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "")
    seen = {}
    real_log = mlflow_log.log

    def log(*a):
        import os
        seen.update((k, os.environ[k]) for k in ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES"))
        # One request on its own would wait 30 s (3 tries: 90 s and more): the module's timeout ends it first.
        return real_log(*a)

    monkeypatch.setattr(mlflow_log, "log", log)
    uri = "http://127.0.0.1:%d" % server.getsockname()[1]
    started = time.monotonic()
    try:
        res = run_module(mlflow_log, args(run_dir, tmp_path, tracking_uri=uri, timeout=2))
    finally:
        server.close()
    assert time.monotonic() - started < 20
    assert seen == {"MLFLOW_HTTP_REQUEST_TIMEOUT": "30", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2"}
    assert res["failed"] is True
    assert res["msg"].startswith("MLflow at %s did not finish logging the run within 2s" % uri), res["msg"]
