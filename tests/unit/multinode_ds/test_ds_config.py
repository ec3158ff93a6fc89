import json

import pytest

from multinode_ds import ds_config as dsc


def test_cpu_config_is_fp32_zero1_with_monitor():
    cfg = dsc.generate(1_000_000, 2, accelerator="cpu", micro_batch=4, run_dir="/shared/runs/r1")
    assert cfg["zero_optimization"]["stage"] == 1
    assert cfg["bf16"]["enabled"] is False and "fp16" not in cfg
    assert cfg["train_micro_batch_size_per_gpu"] == 4
    assert cfg["csv_monitor"] == {"enabled": True, "output_path": "/shared/runs/r1/monitor", "job_name": "train"}


def test_llama8b_on_two_a30_needs_zero3_with_offload():
    n = 8_030_261_248
    cfg = dsc.generate(n, 2, accelerator="gpu", device_memory_gib=24, bf16_capable=True)
    zero = cfg["zero_optimization"]
    assert zero["stage"] == 3
    assert zero["offload_optimizer"]["device"] == "cpu"
    assert cfg["bf16"]["enabled"] is True
    assert "activation_checkpointing" in cfg


def test_small_model_on_big_gpus_stays_at_stage1_fp16_without_bf16():
    cfg = dsc.generate(100_000_000, 8, accelerator="gpu", device_memory_gib=80, bf16_capable=False)
    assert cfg["zero_optimization"]["stage"] == 1
    assert "offload_optimizer" not in cfg["zero_optimization"]
    assert cfg["fp16"]["enabled"] is True and cfg["bf16"]["enabled"] is False


def test_estimate_partitions_by_stage():
    n, ws = 1_000_000_000, 4
    s0 = dsc.estimate_bytes_per_rank(n, ws, 0, True)
    s1 = dsc.estimate_bytes_per_rank(n, ws, 1, True)
    s3 = dsc.estimate_bytes_per_rank(n, ws, 3, True)
    assert s0 == pytest.approx(1.2 * 16 * n)
    assert s1 == pytest.approx(1.2 * (4 * n + 12 * n / ws))
    assert s3 == pytest.approx(1.2 * 16 * n / ws)


def test_user_json_wins_deeply(tmp_path):
    base = dsc.generate(1000, 2, accelerator="cpu")
    path = tmp_path / "user.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, "steps_per_print": 1}))
    merged = dsc.merge(base, dsc.load_override(str(path)))
    assert merged["zero_optimization"] == {"stage": 2}
    assert merged["steps_per_print"] == 1 and merged["gradient_clipping"] == 1.0
    assert base["zero_optimization"]["stage"] == 1


def test_invalid_user_json_is_reported(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{'stage': 3}")
    with pytest.raises(ValueError, match="is not valid JSON"):
        dsc.load_override(str(bad))
    arr = tmp_path / "arr.json"
    arr.write_text("[1]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        dsc.load_override(str(arr))
