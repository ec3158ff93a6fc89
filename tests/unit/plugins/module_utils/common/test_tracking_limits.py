"""MLflow from the controller (issue 44, points 7 and 11): every request to a tracking server is bounded, and the
controller's MLflow credentials never go to another host over plain http."""
import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.common.tracking import (
    ALLOW_HTTP_ENV, credentials_in_clear, deadline_message, request_limits, validate_mlflow_uri)


@pytest.mark.parametrize("name", ["MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"])
def test_plain_http_to_another_host_with_credentials_is_refused_naming_the_variable_and_the_fix(name):
    env = {name: "s3cret"}
    with pytest.raises(ValueError) as err:
        validate_mlflow_uri("http://mlflow.example.com:5000", "/runs", environ=env)
    msg = str(err.value)
    assert msg.startswith("mlflow_tracking_uri=http://mlflow.example.com:5000 is plain http to another host")
    assert name in msg and "in clear" in msg and "Fix: give the server's https:// URI" in msg
    assert "%s=true" % ALLOW_HTTP_ENV in msg and "s3cret" not in msg


def test_both_user_and_password_are_named():
    msg = credentials_in_clear("http://10.0.0.5:8080", {"MLFLOW_TRACKING_USERNAME": "me",
                                                        "MLFLOW_TRACKING_PASSWORD": "pw"})
    assert "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD are in the controller's environment" in msg


@pytest.mark.parametrize("uri", ["https://mlflow.example.com", "http://localhost:5000", "http://127.0.0.1:5000/x",
                                 "http://127.1.2.3", "http://[::1]:5000", "http://[0:0:0:0:0:0:0:1]:5000",
                                 "http://mlflow.localhost:5000", "file:///m", "databricks"])
def test_https_this_machine_and_other_stores_keep_their_credentials(uri):
    env = {"MLFLOW_TRACKING_TOKEN": "t"}
    assert credentials_in_clear(uri, env) is None
    assert validate_mlflow_uri(uri, "/runs", environ=env)
    assert credentials_in_clear("HTTP://LOCALHOST:5000", env) is None


@pytest.mark.parametrize("uri", ["http://localhost.example.com", "http://127.0.0.1.nip.io", "http://[::2]:5000",
                                 "http://10.0.0.1"])
def test_names_that_only_look_local_are_not_this_machine(uri):
    assert credentials_in_clear(uri, {"MLFLOW_TRACKING_TOKEN": "t"})


def test_without_credentials_or_with_the_opt_in_plain_http_is_taken():
    assert validate_mlflow_uri("http://mlflow:5000", "/runs", environ={}) == "http://mlflow:5000"
    assert validate_mlflow_uri("http://mlflow:5000", "/runs", environ={"MLFLOW_TRACKING_TOKEN": ""})
    assert validate_mlflow_uri("http://mlflow:5000", "/runs", environ={"MLFLOW_TRACKING_TOKEN": "t",
                                                                       ALLOW_HTTP_ENV: "true"})
    assert credentials_in_clear("http://mlflow:5000", {"MLFLOW_TRACKING_TOKEN": "t", ALLOW_HTTP_ENV: "no"})


def test_the_plan_reads_the_controllers_environment(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "pw")
    monkeypatch.delenv(ALLOW_HTTP_ENV, raising=False)
    with pytest.raises(ValueError, match="MLFLOW_TRACKING_PASSWORD is in the controller's environment"):
        validate_mlflow_uri("http://mlflow:5000", "/runs")


def test_every_request_is_bounded_unless_the_environment_says_otherwise():
    assert request_limits({}) == {"MLFLOW_HTTP_REQUEST_TIMEOUT": "30", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                                  "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
    assert request_limits({"MLFLOW_HTTP_REQUEST_TIMEOUT": "90", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": " "}) == {
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


def test_the_mlflow_client_reads_these_names():
    mlflow_env = pytest.importorskip("mlflow.environment_variables")
    for name in request_limits({}):
        assert getattr(mlflow_env, name).name == name


def test_the_deadline_names_the_server_the_limits_and_the_fix():
    msg = deadline_message("http://mlflow:5000", 300,
                           {"MLFLOW_HTTP_REQUEST_TIMEOUT": "30", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2"})
    assert "MLflow at http://mlflow:5000 did not finish logging the run within 300s" in msg
    assert "MLFLOW_HTTP_REQUEST_TIMEOUT=30s" in msg and "Fix:" in msg and "-e mlflow_timeout=" in msg
