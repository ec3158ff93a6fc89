"""The parts of a benchmark run (multinode_ds.bench.run): its summary, its directory and work file, the phases'
outcome, the history it is judged against, and its last lines."""
import json
import sys
import time

import pytest

from multinode_ds import bench

BC = bench.core()


def cfg(tmp_path, **kw):
    out = dict(bench.DEFAULTS, bench_dir=str(tmp_path), hosts=[["w1", 2], ["w2", 1]], python=sys.executable,
               launcher="local", samples=6, prompt_chars=16)
    out.update(kw)
    return out


def slot_result(host, index, wall=2.0, reason="vllm is not installed"):
    return {"host": host, "slot": index, "local_slot": 0, "engine": "hf", "device": "cpu", "samples": 2,
            "prompt_tokens": 40, "generated_tokens": 16, "wall_s": wall, "prefill_s": 0.5, "decode_s": 1.5,
            "latencies_s": [wall / 2] * 2, "engine_reason": reason, "loadgen": {"used": False, "reason": "loadgen=off"}}


def test_a_new_summary_is_running_with_the_comparable_settings(tmp_path):
    before = time.time()
    s = bench.new_summary(cfg(tmp_path, model_path=""), "r1", "schedule", tmp_path / "r1")
    assert (s["run_id"], s["kind"], s["trigger"], s["status"], s["error"], s["finished"]) == (
        "r1", "benchmark", "schedule", "running", None, None)
    assert before <= s["started"] <= time.time() and s["model_path"] is None and s["run_dir"] == str(tmp_path / "r1")
    assert s["settings"] == {"samples": 6, "max_new_tokens": 16, "prompt_chars": 16, "prompts_file": "", "engine": "auto",
                             "device": "auto", "loadgen": "auto", "loadgen_min_duration_ms": 0, "threshold_pct": 10.0,
                             "single_baseline": True}
    assert bench.new_summary(cfg(tmp_path, model_path="/m"), "r1", "t", tmp_path)["model_path"] == "/m"


def test_the_run_directory_and_its_work_file(tmp_path):
    run_dir = tmp_path / "r1"
    (run_dir / "ready").mkdir(parents=True)
    (run_dir / "ready" / "parallel-slot0").write_text("")
    work, plan = bench.prepare_run(BC, cfg(tmp_path), run_dir, "r1")
    assert sorted(p.name for p in run_dir.iterdir()) == ["loadgen", "logs", "progress", "ready", "slots", "work.json"]
    assert not list((run_dir / "ready").iterdir())
    doc = json.loads(work.read_text())
    assert doc["run_id"] == "r1" and doc["out_dir"] == str(run_dir) and len(doc["prompts"]) == 6
    assert doc["phases"] == {"single": plan["single"], "parallel": plan["parallel"]}
    assert [s["samples"] for s in plan["parallel"]["w1"]] == [[0, 3], [1, 4]] and plan["slots"] == 3
    with pytest.raises(bench.Failed, match="no worker has a slot"):
        bench.prepare_run(BC, cfg(tmp_path, hosts=[]), run_dir, "r1")


def test_the_phases_aggregated_into_the_summary(tmp_path, monkeypatch):
    ran = []

    def phase(config, run_dir, work, name, layout, deadline):
        ran.append((name, sorted(layout), deadline))
        if name == "single":
            return {0: slot_result("w1", 0, wall=4.0)}
        return {0: slot_result("w1", 0), 1: slot_result("w1", 1), 2: slot_result("w2", 2, reason="asked for hf")}
    monkeypatch.setattr(bench, "run_phase", phase)
    summary = {"run_id": "r1", "started": 1000.0}
    assert bench.run_phases(BC, cfg(tmp_path, timeout_s=60), tmp_path / "r1", summary) == 0
    assert ran == [("single", ["w1"], 1060.0), ("parallel", ["w1", "w2"], 1060.0)]
    assert summary["status"] == "success" and summary["aggregate"]["total"]["slots"] == 3
    assert summary["engine_reason"] == "asked for hf; vllm is not installed"
    assert summary["metrics"]["samples_per_s"] == pytest.approx(3.0)
    assert summary["metrics"]["scaling_efficiency"] == pytest.approx(3.0 / (3 * 0.5))
    assert summary["loadgen"]["used"] is False and summary["loadgen"]["reason"] == "loadgen=off"
    ran.clear()
    assert bench.run_phases(BC, cfg(tmp_path, single_baseline=False), tmp_path / "r2", {"run_id": "r2", "started": 0}) == 0
    assert [r[0] for r in ran] == ["parallel"]


@pytest.mark.parametrize("raised,error", [
    (bench.Failed("phase parallel on w2: exit 1"), "phase parallel on w2: exit 1"),
    (KeyError("samples"), "KeyError: 'samples'"),
    (KeyboardInterrupt(), "interrupted (Ctrl-C)"),
])
def test_a_failed_phase_is_recorded_with_its_reason(tmp_path, monkeypatch, raised, error):
    def phase(*a):
        raise raised
    monkeypatch.setattr(bench, "run_phase", phase)
    summary = {"run_id": "r1", "started": 0.0}
    assert bench.run_phases(BC, cfg(tmp_path), tmp_path / "r1", summary) == 1
    assert summary["status"] == "failed" and summary["error"] == error


def test_the_summary_is_finished_and_written_first(tmp_path):
    run_dir = tmp_path / "r1"
    (run_dir / "logs").mkdir(parents=True)
    for name in ("single-w1.log", "parallel-w2.log", "parallel-w1.log"):
        (run_dir / "logs" / name).write_text("")
    summary = {"run_id": "r1", "started": time.time() - 2.0}
    bench.finish_summary(run_dir, summary)
    assert summary["finished"] >= summary["started"] + 2.0 and 2.0 <= summary["wall_s"] < 60
    assert summary["node_logs"] == ["logs/parallel-w1.log", "logs/parallel-w2.log", "logs/single-w1.log"]
    assert json.loads((run_dir / "summary.json").read_text()) == summary


def succeeded(run_id, sps, key):
    metrics = {"samples_per_s": sps, "tokens_per_s": sps * 10, "prompt_tokens_per_s": 50.0,
               "generation_tokens_per_s": 5.0, "latency_p50_s": 0.1, "latency_p90_s": 0.2, "latency_p99_s": 0.3,
               "scaling_efficiency": 0.9}
    return {"run_id": run_id, "status": "success", "key": key, "metrics": metrics}


def test_a_successful_run_is_judged_against_the_comparable_runs_before_it(tmp_path):
    config = cfg(tmp_path, threshold_pct=10.0)
    (tmp_path / "r3").mkdir()
    summary = bench.new_summary(config, "r3", "manual", tmp_path / "r3")
    key = BC.settings_key(summary)
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(e) + "\n" for e in (
        succeeded("r1", 30.0, key), succeeded("r2", 30.0, key), succeeded("other", 1.0, "model=x"))))
    agg = BC.aggregate([slot_result("w1", 0), slot_result("w1", 1), slot_result("w2", 2)])
    summary.update(status="success", aggregate=agg, metrics=BC.headline(agg))
    recorded, text, runs = bench.record_history(BC, config, tmp_path, tmp_path / "r3", summary)
    assert recorded and runs == 4 and "REGRESSION samples_per_s: 3 vs median 30 of 2 previous run(s)" in text
    assert summary["history_runs"] == 2 and bench.flagged_metrics(summary) == [
        "samples_per_s", "tokens_per_s", "latency_p50_s", "latency_p90_s", "latency_p99_s"]
    assert json.loads((tmp_path / "r3" / "summary.json").read_text())["history_runs"] == 2
    assert [e["run_id"] for e in bench.read_history(tmp_path / "history.jsonl")] == ["r1", "r2", "other", "r3"]
    assert (tmp_path / "history.md").exists() and (tmp_path / "history.json").exists()


def test_a_failed_run_is_appended_unjudged_and_an_unusable_history_is_reported(tmp_path, capsys):
    failed = {"run_id": "r1", "status": "failed", "error": "x"}
    recorded, text, runs = bench.record_history(BC, cfg(tmp_path), tmp_path, tmp_path / "r1", failed)
    assert recorded and runs == 1 and "regressions" not in failed and "r1" in text
    assert not (tmp_path / "r1" / "summary.json").exists()
    (tmp_path / "history.lock").unlink()
    (tmp_path / "history.lock").mkdir()
    assert bench.record_history(BC, cfg(tmp_path), tmp_path, tmp_path / "r2", failed) == (False, "", 1)
    assert "the history %s was not updated: cannot open" % (tmp_path / "history.jsonl") in capsys.readouterr().out


def test_the_last_lines_of_a_run(tmp_path, capsys):
    agg = BC.aggregate([slot_result("w1", 0), slot_result("w2", 1)], slot_result("w1", 0, wall=4.0))
    summary = {"run_id": "r1", "status": "success", "aggregate": agg, "loadgen": {"used": False},
               "regressions": [{"metric": "samples_per_s", "flagged": True}, {"metric": "tokens_per_s", "flagged": False}]}
    bench.log_outcome(summary, tmp_path, tmp_path / "r1", "the history", 3)
    lines = [line.split("] ", 1)[1] for line in capsys.readouterr().out.splitlines() if line.startswith("[bench ")]
    assert lines[0].startswith("run r1: 2 samples/s, ") and "scaling efficiency 2.000" in lines[0]
    assert lines[1:] == ["REGRESSION against the median of the previous runs: samples_per_s (history: %s)"
                         % (tmp_path / "history.md"), "summary: %s" % (tmp_path / "r1" / "summary.json"),
                         "history (3 run(s)):"]
    bench.log_outcome({"status": "failed"}, tmp_path, tmp_path / "r1", "", 1)
    assert capsys.readouterr().out.count("\n") == 1
