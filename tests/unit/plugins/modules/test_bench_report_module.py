"""bench_report: report.md with plots and the history report from a collected benchmark run (issue 6)."""
import json

from ansible_collections.multinode.deepspeed.plugins.module_utils.bench import core as bench
from ansible_collections.multinode.deepspeed.plugins.modules import bench_report


def slot(host, index, samples=4, wall=2.0):
    return {"host": host, "slot": index, "local_slot": 0, "engine": "hf", "device": "cpu", "samples": samples,
            "prompt_tokens": 40 * samples, "generated_tokens": 8 * samples, "wall_s": wall, "prefill_s": wall / 4,
            "decode_s": wall * 3 / 4, "latencies_s": [wall / samples] * samples}


def summary(run_id="r2", status="success"):
    agg = bench.aggregate([slot("worker1", 0), slot("worker2", 1, wall=2.5)], slot("worker1", 0, samples=8, wall=3.0))
    out = {"run_id": run_id, "status": status, "error": None, "trigger": "playbook", "model": "llama-tiny",
           "settings": {"samples": 8, "max_new_tokens": 8}, "aggregate": agg, "metrics": bench.headline(agg),
           "engine_reason": "vllm is not installed: Hugging Face transformers",
           "loadgen": {"used": True, "result": "VALID", "samples_per_s": 3.5, "invalid_reasons": []}}
    if status != "success":
        out.update(aggregate={}, metrics={}, error="phase parallel on worker2: exit 1")
    return out


def write_run(tmp_path, s, history=()):
    run = tmp_path / s["run_id"]
    run.mkdir()
    (run / "summary.json").write_text(json.dumps(s))
    hist = run / "history.jsonl"
    hist.write_text("".join(json.dumps(e) + "\n" for e in history))
    return run, hist


def test_report_and_history_with_plots(tmp_path, run_module):
    old = bench.history_entry(summary("r1"))
    old["metrics"] = dict((k, v * 2 if k == "samples_per_s" else v) for k, v in old["metrics"].items())
    s = summary()
    run, hist = write_run(tmp_path, s, [old, bench.history_entry(s)])
    res = run_module(bench_report, {"run_dir": str(run), "history": str(hist), "threshold": 10})
    assert res["changed"] and res["summary"]["run_id"] == "r2"
    names = sorted(p.rsplit("/", 1)[-1] for p in res["plots"])
    assert names == ["history.png", "latency.png", "throughput.png"]
    for p in res["plots"]:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    report = (run / "report.md").read_text()
    assert "![throughput.png](plots/throughput.png)" in report and "| **total** | 2 |" in report
    history = (run / "history.md").read_text()
    assert "REGRESSION samples_per_s" in history and "![history.png](plots/history.png)" in history
    text = "\n".join(res["text"])
    assert "worker1" in text and "worker2" in text and "scaling efficiency" in text
    assert "MLPerf LoadGen Offline: VALID" in text and "History (2 successful run(s) of 2): REGRESSION samples_per_s" in text


def test_failed_run_gets_a_report_without_figures(tmp_path, run_module):
    run = write_run(tmp_path, summary(status="failed"))[0]
    res = run_module(bench_report, {"run_dir": str(run)})
    assert res["summary"]["status"] == "failed" and res["plots"] == [] and res["history_report"] is None
    assert "status: **failed** - phase parallel on worker2: exit 1" in (run / "report.md").read_text()


def test_check_mode_writes_nothing(tmp_path, run_module):
    run, hist = write_run(tmp_path, summary(), [bench.history_entry(summary())])
    res = run_module(bench_report, {"run_dir": str(run), "history": str(hist), "_ansible_check_mode": True})
    assert not res["changed"] and not (run / "report.md").exists() and res["plots"] == []


def test_missing_summary_fails_clearly(tmp_path, run_module):
    res = run_module(bench_report, {"run_dir": str(tmp_path)})
    assert res["failed"] and "no readable benchmark summary" in res["msg"] and "logs/" in res["msg"]
