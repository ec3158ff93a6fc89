"""The benchmark driver (multinode_ds.bench): settings, prompts, commands, a real run, history, comparison."""
import fcntl
import json
import re
import shlex
import sys

import pytest

from multinode_ds import bench

RATES = ("samples_per_s", "tokens_per_s", "prompt_tokens_per_s", "generation_tokens_per_s")


def config(tmp_path, **kw):
    cfg = {"bench_dir": str(tmp_path / "bench"), "hosts": [["w1", 1], ["w2", 1]], "python": sys.executable,
           "launcher": "local", "samples": 4, "max_new_tokens": 2, "prompt_chars": 24, "loadgen": "auto",
           "timeout_s": 300, "start_timeout_s": 120}
    cfg.update(kw)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def test_bad_settings_are_named(tmp_path):
    with pytest.raises(bench.BadSettings) as exc:
        bench.load_config(config(tmp_path, engine="tensorrt", samples=0, threshold_pct=-1))
    msg = str(exc.value)
    assert "engine='tensorrt' (one of auto, hf, vllm)" in msg and "samples=0 (a whole number >= 1)" in msg
    assert "threshold_pct=-1 (a percentage >= 0)" in msg
    assert bench.main(["run", "--config", config(tmp_path, engine="tensorrt")]) == 2
    assert not (tmp_path / "bench").exists()


def test_a_run_that_cannot_start_is_recorded_as_failed(tmp_path):
    assert bench.main(["run", "--config", config(tmp_path, prompts_file=str(tmp_path / "missing.txt")),
                       "--run-id", "r"]) == 1
    s = json.loads((tmp_path / "bench" / "r" / "summary.json").read_text())
    assert s["status"] == "failed" and "FileNotFoundError" in s["error"] and "missing.txt" in s["error"]
    assert json.loads((tmp_path / "bench" / "history.jsonl").read_text())["status"] == "failed"


def test_prompts_from_the_corpus_and_from_a_file(tmp_path):
    cfg = bench.load_config(config(tmp_path, samples=5, prompt_chars=40))
    prompts = bench.make_prompts(cfg)
    assert len(prompts) == 5 and all(len(p) == 40 for p in prompts) and len(set(prompts)) == 5
    assert bench.make_prompts(cfg) == prompts
    f = tmp_path / "p.jsonl"
    f.write_text('{"prompt": "one"}\n\n{"text": "two"}\n')
    cfg = bench.load_config(config(tmp_path, samples=5, prompts_file=str(f)))
    assert bench.make_prompts(cfg) == ["one", "two", "one", "two", "one"]
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(bench.Failed, match="has no prompt"):
        bench.make_prompts(bench.load_config(config(tmp_path, prompts_file=str(empty))))


def test_the_ssh_command_quotes_the_remote_side(tmp_path):
    cfg = bench.load_config(config(tmp_path, launcher="ssh", env={"HF_HOME": "/data/hf cache"},
                                   python="/opt/venv/bin/python"))
    cmd = bench.node_command(cfg, "/shared/bench/r 1/work.json", "worker2", "parallel")
    assert cmd[:3] == ["ssh", "-o", "BatchMode=yes"] and "ServerAliveInterval=15" in cmd
    assert cmd[-3:-1] == ["-T", "worker2"]
    expected = ["env", "HF_HOME=/data/hf cache", "/opt/venv/bin/python", "-m", "multinode_ds.bench_worker",
                "--work", "/shared/bench/r 1/work.json", "--host", "worker2", "--phase", "parallel", "--watch-stdin"]
    assert shlex.split(cmd[-1]) == expected


def summary(run_id, sps, status="success"):
    metrics = {"samples_per_s": sps, "tokens_per_s": sps * 10, "prompt_tokens_per_s": 50.0,
               "generation_tokens_per_s": 5.0, "latency_p50_s": 0.1, "latency_p90_s": 0.2, "latency_p99_s": 0.3,
               "scaling_efficiency": 0.9}
    return {"run_id": run_id, "status": status, "metrics": metrics if status == "success" else {}}


def test_compare_two_runs_and_a_run_against_the_history(tmp_path):
    d = tmp_path / "bench"
    for run_id, sps in (("a", 10.0), ("b", 12.0), ("c", 5.0)):
        (d / run_id).mkdir(parents=True)
        (d / run_id / "summary.json").write_text(json.dumps(summary(run_id, sps)))
    (d / "history.jsonl").write_text("".join(json.dumps(summary(r, s)) + "\n" for r, s in
                                             (("a", 10.0), ("b", 12.0), ("c", 5.0))))
    text = bench.compare(str(d), "a", "b", 10)
    assert "samples_per_s" in text and "+20.0% better" in text
    text = bench.compare(str(d), "c", "history", 10)
    assert "median of 2" in text and "REGRESSION (> 10% worse than the median): samples_per_s, tokens_per_s" in text
    assert "no drop" in bench.compare(str(d), "b", None, 10)
    with pytest.raises(SystemExit, match="no benchmark run 'zz'"):
        bench.compare(str(d), "zz", "a", 10)


def test_a_torn_history_line_is_skipped_and_a_bad_prompts_line_fails_the_run(tmp_path, capsys):
    d = tmp_path / "bench"
    d.mkdir()
    (d / "history.jsonl").write_text(json.dumps(summary("a", 10.0)) + "\n" + '{"run_id": "b", "metr' + "\n")
    assert [e["run_id"] for e in bench.read_history(d / "history.jsonl")] == ["a"]
    assert "line 2 is not a history entry; skipped" in capsys.readouterr().out
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('"just a string"\n')
    assert bench.main(["run", "--config", config(tmp_path, prompts_file=str(prompts)), "--run-id", "r"]) == 1
    s = json.loads((d / "r" / "summary.json").read_text())
    assert s["status"] == "failed" and "each line must be a JSON object" in s["error"]
    assert [e["run_id"] for e in bench.read_history(d / "history.jsonl")] == ["a", "r"]


def test_a_stale_run_directory_is_cleared_and_an_unwritable_lock_is_named(tmp_path, monkeypatch):
    d = tmp_path / "bench"
    for name in ("ready/parallel-slot0", "go-parallel", "slots/parallel-slot0.json", "config.json"):
        (d / "r" / name).parent.mkdir(parents=True, exist_ok=True)
        (d / "r" / name).write_text("{}")
    bench.clear_stale(d / "r")
    assert sorted(p.name for p in (d / "r").rglob("*") if p.is_file()) == ["config.json"]

    def refuse(path, mode="r"):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr("builtins.open", refuse)
    with pytest.raises(bench.BadSettings, match="cannot open .*lock.*Permission denied.*chown -R"):
        bench.open_lock(d / ".lock")


def test_history_command_flags_a_doctored_history(tmp_path, capsys):
    d = tmp_path / "bench"
    d.mkdir()
    doctored = tmp_path / "doctored.jsonl"
    doctored.write_text("".join(json.dumps(summary(r, s)) + "\n" for r, s in (("a", 30.0), ("b", 30.0), ("c", 10.0))))
    assert bench.main(["history", "--bench-dir", str(d), "--history", str(doctored)]) == 0
    out = capsys.readouterr().out
    assert "REGRESSION samples_per_s: 10 vs median 30 of 2 previous run(s)" in out
    assert not (d / "history.md").exists()


def test_a_real_run_on_two_local_hosts_then_a_failed_one(tmp_path):
    cfg_path = config(tmp_path)
    assert bench.main(["run", "--config", cfg_path, "--run-id", "one", "--trigger", "test"]) == 0
    d = tmp_path / "bench"
    s = json.loads((d / "one" / "summary.json").read_text())
    assert s["status"] == "success", s["error"]
    agg = s["aggregate"]
    assert agg["total"]["slots"] == 2 and agg["total"]["samples"] == 4 and sorted(agg["nodes"]) == ["w1", "w2"]
    for key in RATES:
        assert agg["total"][key] == pytest.approx(sum(n[key] for n in agg["nodes"].values()))
    assert agg["single"]["samples"] == 4
    assert agg["scaling_efficiency"] == pytest.approx(agg["total"]["samples_per_s"] /
                                                      (2 * agg["single"]["samples_per_s"]))
    assert (d / "one" / "report.md").exists() and (d / "one" / "logs" / "parallel-w2.log").exists()
    progress = json.loads((d / "one" / "progress.json").read_text())
    assert progress["phase"] == "parallel" and progress["done"] == progress["total"] == 4
    # A second run that fails (an unknown model): recorded as failed, the history keeps both.
    bad = config(tmp_path, model="no-such-model", single_baseline=False)
    assert bench.main(["run", "--config", bad, "--run-id", "two"]) == 1
    s = json.loads((d / "two" / "summary.json").read_text())
    assert s["status"] == "failed" and re.search("phase parallel on w[12]: exit 1", s["error"])
    assert "no-such-model" in s["error"]
    entries = [json.loads(x) for x in (d / "history.jsonl").read_text().splitlines()]
    assert [(e["run_id"], e["status"]) for e in entries] == [("one", "success"), ("two", "failed")]
    assert "two" in (d / "history.md").read_text()
    # The run id is not reused, and a second driver waits its turn.
    assert bench.main(["run", "--config", cfg_path, "--run-id", "one"]) == 2
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert bench.main(["run", "--config", cfg_path, "--run-id", "three"]) == 3
