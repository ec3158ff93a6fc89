"""Modules ds_ops and ds_config_check: the node step run with its time bounded, its answer worded (issue 44)."""
import importlib.util
import os
import sys
import time
from pathlib import Path

import pytest

from ansible_collections.multinode.deepspeed.plugins.modules import ds_config_check, ds_ops

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(name="venv")
def venv_fixture(monkeypatch):
    """This venv, with the node package importable (as the stack role installs it in the nodes' venv)."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return Path(sys.prefix)


def test_ds_ops_removes_a_stale_lock_and_reports_an_op_built_already(run_module, venv, tmp_path, monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    ext = tmp_path / "ext"
    (ext / "cpu_adam").mkdir(parents=True)
    (ext / "cpu_adam" / "cpu_adam.so").write_text("")
    sys.path.insert(0, str(ROOT))
    from multinode_ds import ops_ready  # pylint: disable=import-outside-toplevel
    ops_ready.write_stamp(str(ext), "cpu_adam", ops_ready.stamp_id())
    lock = ext / "cpu_adam" / "lock"
    lock.write_text("")
    old = time.time() - 900
    for path in [lock.parent] + list(lock.parent.iterdir()):
        os.utime(path, (old, old))
    result = run_module(ds_ops, {"ops": [{"builder": "CPUAdamBuilder", "op": "cpu_adam", "why": "x"}],
                                 "venv": str(venv), "extensions_dir": str(ext), "host": "worker1"})
    assert not result.get("failed"), result
    assert result["changed"] is True and not lock.exists()
    assert result["lines"][0].startswith("worker1: removed the stale build lock %s (left by a build that did not "
                                         "end" % lock)
    assert result["lines"][1:] == ["worker1: cpu_adam was built already"]


def test_ds_ops_names_the_node_the_op_and_the_fix(run_module, venv, tmp_path, monkeypatch):
    if importlib.util.find_spec("deepspeed") is None:  # importing it here would print to this test's stdout
        pytest.skip("DeepSpeed is not installed here")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    result = run_module(ds_ops, {"ops": [{"builder": "FusedLambBuilder", "op": "fused_lamb", "why": "x"}],
                                 "venv": str(venv), "extensions_dir": str(tmp_path / "ext"), "host": "worker2",
                                 "accelerator": "cpu"})
    assert result["failed"] is True
    assert result["msg"] == (
        "worker2: DeepSpeed's fused_lamb (FusedLambBuilder) does not exist for the cpu accelerator \u2014 change the "
        "config so that it does not need fused_lamb (for an optimizer: \"torch_adam\": true in the optimizer's "
        "params, or a torch.optim class name), or provision it: add FusedLambBuilder to stack_ops.cpu in your "
        "inventory and run site.yml")


def test_ds_ops_past_its_time_is_stopped_and_says_so(run_module, tmp_path):
    venv = tmp_path / "slow"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\nsleep 60\n")
    (venv / "bin" / "python").chmod(0o755)
    start = time.time()
    result = run_module(ds_ops, {"ops": [{"builder": "CPUAdamBuilder", "op": "cpu_adam", "why": "x"}],
                                 "venv": str(venv), "extensions_dir": str(tmp_path / "ext"), "host": "worker1",
                                 "timeout": 1})
    assert result["failed"] is True and time.time() - start < 20
    assert result["msg"].startswith("worker1: the DeepSpeed ops step (cpu_adam) did not end: it ran past 1 s and was "
                                    "stopped")
    assert "Fix: build them while provisioning (stack_ops in your inventory, then site.yml)" in result["msg"]


def test_ds_config_check_has_a_timeout(run_module):
    start = time.time()
    result = run_module(ds_config_check, {"argv": [sys.executable, "-c", "import time; time.sleep(60)"],
                                          "config": "{}", "host": "worker1", "timeout": 1})
    assert result["failed"] is True and time.time() - start < 20
    assert "the check ran past 1 s and was stopped" in result["msg"] and " on worker1 " in result["msg"]


def test_ds_config_check_words_deepspeeds_refusal(run_module, monkeypatch):
    if importlib.util.find_spec("deepspeed") is None:  # importing it here would print to this test's stdout
        pytest.skip("DeepSpeed is not installed here")
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    argv = [sys.executable, "-m", "multinode_ds.ds_check", "--config", "-", "--world-size", "2", "--accelerator",
            "cpu", "--json"]
    result = run_module(ds_config_check, {"argv": argv, "config": '{"train_batch_size": "sixteen"}',
                                          "source": "/home/me/ds.json", "host": "worker1"})
    assert result["failed"] is True
    assert result["problems"] == [
        'ds_config: train_batch_size is "sixteen"; DeepSpeed reads it as a whole number of at least 1 \u2014 set '
        'train_batch_size to a whole number of at least 1, such as 16 (JSON, without quotes), or remove it and '
        'DeepSpeed derives it from the other batch sizes']
    assert result["msg"].startswith("ds_config=/home/me/ds.json, checked by DeepSpeed's DeepSpeedConfig on worker1")
