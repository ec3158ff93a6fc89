"""scripts/cost/recovery.py (make bench-recovery): the medians of each kind of run, each fault's per-round ratios to
the clean run and the seconds it lost, and the hang's detection time."""
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("cost_recovery", ROOT / "scripts" / "cost" / "recovery.py")
recovery = importlib.util.module_from_spec(spec)
spec.loader.exec_module(recovery)


def run(wall, goodput, **extra):
    return dict({"wall_s": wall, "goodput": goodput, "attempts": 2 if extra else 1}, **extra)


def test_the_report_has_each_kinds_medians_ratios_and_seconds_lost(capsys):
    results = {
        "clean": [run(100.0, 0.9), run(110.0, 0.9), run(90.0, 0.8)],
        "fault": [run(150.0, 0.6, fault_to_first_step_s=20.0, recomputed_steps=10),
                  run(160.0, 0.6, fault_to_first_step_s=22.0, recomputed_steps=12),
                  run(120.0, 0.4, fault_to_first_step_s=30.0, recomputed_steps=8)],
        "spare": [run(130.0, 0.7, fault_to_first_step_s=25.0, recomputed_steps=5)] * 3,
        "kill": [run(110.0, 0.8, fault_to_first_step_s=9.0, recomputed_steps=5),
                 run(111.0, 0.8, fault_to_first_step_s=8.0, recomputed_steps=5),
                 run(112.0, 0.8, fault_to_first_step_s=10.0, recomputed_steps=5)],
        "hang": [run(130.0, 0.7, fault_to_first_step_s=15.0, recomputed_steps=5, detection_s=11.0),
                 run(125.0, 0.7, fault_to_first_step_s=14.0, recomputed_steps=6, detection_s=None),
                 run(120.0, 0.6, fault_to_first_step_s=16.0, recomputed_steps=4, detection_s=12.0)],
        "grow": [run(140.0, 0.6, fault_to_first_step_s=30.0, recomputed_steps=5, grow_detection_s=7.0,
                     back_to_first_step_s=24.0, grow_recomputed_steps=3),
                 run(150.0, 0.6, fault_to_first_step_s=31.0, recomputed_steps=5, grow_detection_s=9.0,
                     back_to_first_step_s=26.0, grow_recomputed_steps=4),
                 run(100.0, 0.6, fault_to_first_step_s=29.0, recomputed_steps=5, grow_detection_s=8.0,
                     back_to_first_step_s=25.0, grow_recomputed_steps=5)],
    }
    out = recovery.report(results, SimpleNamespace(rounds=3, model="llama-tiny", steps=300, micro_batch=16))
    assert out["medians"]["clean"]["wall_s"] == 100.0
    assert out["medians"]["fault"]["fault_to_first_step_s"] == 22.0
    assert out["medians"]["hang"]["detection_s"] == 11.5  # the round without a record is left out
    assert out["seconds_lost"] == {"fault": 50.0, "spare": 30.0, "kill": 10.0, "hang": 30.0, "grow": 40.0}
    assert abs(out["ratios"]["fault"]["wall"] - 160.0 / 110.0) < 1e-9  # the median of 1.5, 1.45 and 1.33
    assert abs(out["ratios"]["hang"]["goodput"] - 0.7 / 0.9) < 1e-9
    text = capsys.readouterr().out
    assert "hang: SIGSTOP -> the watch's abort 11.5 s (median)" in text
    assert "spare: median of the per-round ratios (spare / clean): wall time 1.30" in text
    assert "grow: worker2 started -> the watch's stop of attempt 2 8.0 s, -> attempt 3's first step 25.0 s" in text
    assert "fault: median of the per-round ratios (fault / clean): wall time 1.45, goodput 0.67; seconds lost 50.0" \
        in text


def test_a_run_that_did_not_grow_back_is_an_error_not_a_figure():
    summary = {"attempts": [{"kind": "lost"}, {"kind": "success"}]}
    with pytest.raises(SystemExit, match=r"r1 did not grow back: attempts \['lost', 'success'\]"):
        recovery.grow_figures(summary, "r1", {"back_at": 1.0})


def test_the_projection_at_llama_3s_interruption_rate(capsys):
    rows = recovery.projection(60.0)
    # 419 interruptions in 54 days on 2,048 nodes: about 1.94 a day on 512 nodes.
    assert [r["nodes"] for r in rows] == [8, 64, 512]
    assert abs(rows[2]["interruptions"] - 419 / 54 / 4) < 1e-9
    assert abs(rows[2]["goodput"] - (1 - rows[2]["interruptions"] * 60 / 86400)) < 1e-12
    assert abs(rows[2]["by_hand"] - (1 - rows[2]["interruptions"] * 3660 / 86400)) < 1e-12
    assert rows[0]["goodput"] > rows[1]["goodput"] > rows[2]["goodput"] > rows[2]["by_hand"]
    # Never below nothing.
    assert recovery.projection(10 ** 6, nodes=(512,))[0]["goodput"] == 0.0
    recovery.print_projection(rows, 60.0)
    assert "| 512 | 1.94 | 0.9987 | 0.9178 |" in capsys.readouterr().out
