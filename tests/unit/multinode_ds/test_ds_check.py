"""ds_check against the installed DeepSpeed, on CPU: in this process (main, its JSON on stdout), and once as the
nodes run it (python -m, exit codes)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

from multinode_ds import ds_check  # noqa: E402  # pylint: disable=wrong-import-position

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures" / "ds_config"


@pytest.fixture(autouse=True)
def cpu(monkeypatch):
    # main() sets DS_ACCELERATOR from --accelerator: put it back after each test.
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")


def run(capsys, config, world=2):
    rc = ds_check.main(["--config", str(config), "--world-size", str(world), "--accelerator", "cpu", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == (0 if report["ok"] else 1)
    return report


def write(tmp_path, config):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config) if isinstance(config, dict) else config)
    return path


def by_key(report):
    return dict((p["key"], p) for p in report["problems"])


def test_seed_config_at_world_two_names_the_batch_and_fp16(capsys, monkeypatch):
    from deepspeed.accelerator import get_accelerator  # pylint: disable=import-outside-toplevel
    # A worker CPU without fp16 kernels (DeepSpeed asks oneDNN; this machine's CPU may have them).
    monkeypatch.setattr(get_accelerator(), "is_fp16_supported", lambda: False)
    report = run(capsys, FIXTURES / "seed.json")
    problems = by_key(report)
    assert not report["ok"] and set(problems) == {"train_batch_size", "fp16.enabled"}
    assert problems["train_batch_size"]["message"] == (
        "ds_config: train_batch_size 32 \u2260 micro batch 4 \u00d7 accumulation 2 \u00d7 world 2")
    assert "set train_batch_size to 16" in problems["train_batch_size"]["fix"]
    assert problems["fp16.enabled"]["message"] == "ds_config: fp16.enabled on CPU workers (no fp16 kernels)"
    assert report == json.loads((FIXTURES / "ds_check_seed_world2_cpu.json").read_text())


def test_fp16_follows_what_deepspeeds_accelerator_says(capsys):
    from deepspeed.accelerator import get_accelerator  # pylint: disable=import-outside-toplevel
    problems = by_key(run(capsys, FIXTURES / "seed.json"))
    assert ("fp16.enabled" in problems) == (not get_accelerator().is_fp16_supported())


def test_fixed_config_is_ok_with_deepspeeds_derived_sizes(capsys):
    report = run(capsys, FIXTURES / "fixed.json")
    assert report["ok"] and report["problems"] == []
    assert report["derived"] == {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4,
                                 "gradient_accumulation_steps": 2}


def test_deepspeed_derives_the_total_at_the_world_size_given(capsys, tmp_path):
    report = run(capsys, write(tmp_path, {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3}), 4)
    assert report["ok"] and report["derived"]["train_batch_size"] == 24


def test_not_json_says_where(capsys, tmp_path):
    path = write(tmp_path, '{"train_batch_size": 16,\n  "fp16": {"enabled": true,}\n}\n')
    report = run(capsys, path)
    assert not report["ok"] and len(report["problems"]) == 1
    assert report["problems"][0]["message"] == (
        "ds_config: %s is not JSON (line 2, column 28: Expecting property name enclosed in double quotes)" % path)


def test_not_an_object_and_duplicate_keys(capsys, tmp_path):
    assert "must hold a JSON object, not list" in run(capsys, write(tmp_path, "[1]"))["problems"][0]["message"]
    problem = run(capsys, write(tmp_path, '{"train_batch_size": 2, "train_batch_size": 4}'))["problems"][0]
    assert problem["key"] == "train_batch_size" and "given twice" in problem["message"]


def test_unknown_optimizer_and_scheduler(capsys, tmp_path):
    config = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "Adamm"}, "scheduler": {"type": "WarmupLRR"}}
    problems = by_key(run(capsys, write(tmp_path, config)))
    assert set(problems) == {"optimizer.type", "scheduler.type"}
    assert "adamw" in problems["optimizer.type"]["fix"] and "WarmupLR" in problems["scheduler.type"]["fix"]
    # torch's own classes are what the engine falls back on: not problems.
    config.update(optimizer={"type": "SGD", "params": {"lr": 0.1}}, scheduler={"type": "StepLR"})
    assert run(capsys, write(tmp_path, config))["ok"]


def test_unknown_top_level_key_with_a_suggestion(capsys, tmp_path):
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_acumulation_steps": 2, "my_own_setting": 1,
              "bfloat16": {"enabled": False}, "autotuning": {"enabled": False}, "tensorboard": {"enabled": False}}
    problems = by_key(run(capsys, write(tmp_path, config)))
    assert set(problems) == {"gradient_acumulation_steps", "my_own_setting"}
    assert "did you mean gradient_accumulation_steps?" in problems["gradient_acumulation_steps"]["fix"]


def test_offload_devices(capsys, tmp_path):
    zero = {"stage": 2, "offload_optimizer": {"device": "nvme"}, "offload_param": {"device": "cpu"}}
    problems = by_key(run(capsys, write(tmp_path, {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero})))
    optimizer, param = "zero_optimization.offload_optimizer", "zero_optimization.offload_param"
    assert set(problems) == {optimizer + ".nvme_path", optimizer + ".device", param + ".device"}
    assert "CPU memory instead" in problems[optimizer + ".device"]["message"]
    assert "ignores it" in problems[param + ".device"]["message"]
    zero = {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/nvme"},
            "offload_param": {"device": "cpu"}}
    assert run(capsys, write(tmp_path, {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}))["ok"]


def test_deepspeeds_own_refusals(capsys, tmp_path):
    config = {"train_batch_size": 2, "fp16": {"enabled": True}, "bf16": {"enabled": True}}
    assert "fp16.enabled" in by_key(run(capsys, write(tmp_path, config)))
    problem = run(capsys, write(tmp_path, {"train_batch_size": 2, "zero_optimization": {"stagee": 1}}))["problems"][0]
    assert problem["key"] == "zero_optimization.stagee" and "Extra inputs are not permitted" in problem["text"]
    problem = run(capsys, write(tmp_path, {"train_batch_size": 2, "nebula": {}}))["problems"][0]
    assert "Nebula checkpointing has been removed" in problem["message"]


def test_the_command_as_the_nodes_run_it(tmp_path):
    argv = [sys.executable, "-m", "multinode_ds.ds_check", "--world-size", "2", "--accelerator", "cpu"]
    done = subprocess.run(argv + ["--config", str(FIXTURES / "seed.json"), "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 1, done.stderr
    assert "train_batch_size" in by_key(json.loads(done.stdout))
    done = subprocess.run(argv + ["--config", str(FIXTURES / "fixed.json")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0 and done.stdout.startswith("ds_config: ok at world size 2"), done.stderr
    done = subprocess.run(argv + ["--config", str(tmp_path / "absent.json")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 2 and "no such file" in done.stderr


# -- issue 44: what DeepSpeed rejects at engine start, or computes with unchecked ---------------------------------

def test_a_batch_size_given_as_text_is_named_with_its_value_and_fix(capsys, tmp_path):
    report = run(capsys, write(tmp_path, {"train_batch_size": "sixteen"}))
    assert [(p["key"], p["message"]) for p in report["problems"]] == [
        ("train_batch_size",
         'ds_config: train_batch_size is "sixteen"; DeepSpeed reads it as a whole number of at least 1')]
    assert report["problems"][0]["fix"].startswith("set train_batch_size to a whole number of at least 1, such as 16")
    problems = by_key(run(capsys, write(tmp_path, {"train_micro_batch_size_per_gpu": 4,
                                                   "gradient_accumulation_steps": "2", "steps_per_print": 0,
                                                   "prescale_gradients": "false", "gradient_clipping": "1.0"})))
    assert set(problems) == {"gradient_accumulation_steps", "steps_per_print", "prescale_gradients",
                             "gradient_clipping"}
    assert problems["prescale_gradients"]["message"].endswith("DeepSpeed reads it as true or false")
    assert problems["gradient_clipping"]["message"].endswith("DeepSpeed reads it as a number")
    assert run(capsys, write(tmp_path, {"train_batch_size": 16, "gradient_clipping": 1, "prescale_gradients": False,
                                        "steps_per_print": 5}))["ok"]


def test_zero_stage_seven_names_the_key_and_the_stages(capsys, tmp_path):
    problem = run(capsys, write(tmp_path, {"train_batch_size": 16, "zero_optimization": {"stage": 7}}))["problems"]
    assert [(p["key"], p["fix"]) for p in problem] == [("zero_optimization.stage",
                                                        "set zero_optimization.stage to one of 0, 1, 2, 3")]
    assert problem[0]["message"].startswith("ds_config: zero_optimization.stage 7: Input should be 0, 1, 2, 3")


def test_a_section_that_is_not_an_object(capsys, tmp_path):
    for key in ("zero_optimization", "activation_checkpointing"):
        problems = run(capsys, write(tmp_path, {"train_batch_size": 16, key: 2}))["problems"]
        assert [(p["key"], p["message"]) for p in problems] == [
            (key, "ds_config: %s is 2, not a section; DeepSpeed reads it as a JSON object" % key)]


def test_the_ops_the_config_needs_are_looked_for_on_this_accelerator(capsys, tmp_path):
    config = write(tmp_path, {"train_batch_size": 16, "optimizer": {"type": "Lamb", "params": {"lr": 0.1}}})
    rc = ds_check.main(["--config", str(config), "--world-size", "2", "--accelerator", "cpu", "--json",
                        "--op", "FusedLambBuilder", "--op", "CPUAdamBuilder"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 1 and report["ops"] == ["cpu_adam"]
    assert [(p["key"], p["message"]) for p in report["problems"]] == [(
        "optimizer.type", "ds_config: needs DeepSpeed's fused_lamb op (FusedLambBuilder), which the cpu accelerator "
        "does not have (the engine would fail at its start)")]


def test_the_bundled_trainers_config_is_checked_as_it_merges_it(capsys, tmp_path):
    config = write(tmp_path, {"train_batch_size": 32})
    base = ["--config", str(config), "--world-size", "2", "--accelerator", "cpu", "--json", "--bundled"]
    assert ds_check.main(base) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["problems"][0]["message"] == (
        "ds_config: train_batch_size 32 \u2260 micro batch 4 \u00d7 accumulation 1 \u00d7 world 2")
    assert ds_check.main(base + ["--", "--micro-batch", "16", "--lr", "1e-3"]) == 0
    assert json.loads(capsys.readouterr().out)["derived"]["train_micro_batch_size_per_gpu"] == 16


def test_a_deeply_nested_file_is_refused_with_a_sentence(capsys, tmp_path):
    for depth in (10000, 100):
        report = run(capsys, write(tmp_path, '{"a": ' + "[" * depth + "]" * depth + "}"))
        assert len(report["problems"]) == 1
        assert report["problems"][0]["message"].startswith(
            "ds_config: %s nests deeper than 32 levels" % (tmp_path / "ds.json"))
