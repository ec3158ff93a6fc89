"""The plan carries the ops the user's DeepSpeed config needs (built on the rank nodes before the agents start) and
DeepSpeed's own check of that config also for the bundled trainer (issue 44); a config nested past any DeepSpeed
config is refused on the controller with a sentence, not a RecursionError."""
import datetime
import json

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan import usercode
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import plan

NOW = datetime.datetime(2026, 11, 26, 6, 0, 0)
WORKERS = {"worker1": {"slots": 1, "gpus": 0, "address": "10.89.0.11", "memtotal_mb": 4096, "interface": "eth0"},
           "worker2": {"slots": 1, "gpus": 0, "address": "10.89.0.12", "memtotal_mb": 4096, "interface": "eth0"}}
CORRECTED = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
             "optimizer": {"type": "Adam", "params": {"lr": 3e-4}}, "fp16": {"enabled": False},
             "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}


def planned(tmp_path, config, **settings):
    (tmp_path / "ds.json").write_text(config if isinstance(config, str) else json.dumps(config))
    settings = dict(settings, ds_config="ds.json")
    inputs, problems = usercode.gather(settings, str(tmp_path), str(tmp_path / "runs"))
    if problems:
        return problems
    return plan(dict(settings, user_inputs=inputs, args=inputs["args"]), dict(WORKERS), ["coord"], NOW, backends)


def test_a_script_with_the_field_notes_corrected_config_has_cpu_adam_built_first(tmp_path):
    job = planned(tmp_path, CORRECTED, entrypoint="/shared/proj/train.py")
    assert [op["builder"] for op in job["ds_ops"]] == ["CPUAdamBuilder"]
    assert job["ds_check"][-9:] == ["--config", "-", "--world-size", "2", "--accelerator", "cpu", "--json",
                                    "--op", "CPUAdamBuilder"]
    # Where the play builds them: the rank nodes it reaches over SSH before the start.
    assert job["launch"]["secret_hosts"] == ["worker1", "worker2"]


def test_the_bundled_trainer_with_a_config_gets_deepspeeds_check_as_it_merges_it(tmp_path):
    job = planned(tmp_path, {"train_batch_size": "sixteen"}, args="--micro-batch 2")
    assert job["ds_check"][job["ds_check"].index("--json") + 1:] == ["--bundled", "--", "--micro-batch", "2"]
    assert job["ds_ops"] == []
    job = planned(tmp_path, {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}})
    assert [op["op"] for op in job["ds_ops"]] == ["cpu_adam"]


def test_no_config_no_ops_and_no_check(tmp_path):
    inputs, _problems = usercode.gather({}, str(tmp_path), str(tmp_path / "runs"))
    job = plan({"user_inputs": inputs}, dict(WORKERS), ["coord"], NOW, backends)
    assert job["ds_ops"] == [] and job["ds_check"] is None


@pytest.mark.parametrize("depth", [10000, 100])
def test_a_deeply_nested_config_is_refused_with_its_fix(tmp_path, depth):
    problems = planned(tmp_path, '{"a": ' + "[" * depth + "]" * depth + "}", entrypoint="/shared/t.py")
    assert len(problems) == 1 and problems[0].startswith("ds_config=ds.json nests deeper than 32 levels")
    assert "Fix: give your DeepSpeed JSON config" in problems[0]
