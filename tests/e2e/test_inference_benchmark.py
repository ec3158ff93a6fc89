"""benchmark.yml on the local cluster, its daily schedule, the history and the comparison (issue 6)."""
import json
import re
import subprocess
import time
from pathlib import Path

import pytest
from e2e_nodes import node_name

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
BENCH_DIR = "/shared/bench"
PY = "/opt/multinode-deepspeed/venv/bin/python"
RATES = ("samples_per_s", "tokens_per_s", "prompt_tokens_per_s", "generation_tokens_per_s")


def podman(*args, **kw):
    env = {"CONTAINERS_CONF": str(ROOT / ".cache" / "podman" / "containers.conf"), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, check=False, **kw)


def coord(script, check=True):
    res = podman("exec", node_name("coord"), "sh", "-c", script)
    if check:
        assert res.returncode == 0, (script, res.stdout, res.stderr)
    return res


def history():
    return [json.loads(line) for line in coord(f"cat {BENCH_DIR}/history.jsonl").stdout.splitlines() if line.strip()]


def test_benchmark_schedule_history_and_comparison(provisioned, run_playbook):
    # Empty it, but keep the directory site.yml gave the run's account (role shared_dir).
    coord(f"rm -rf {BENCH_DIR}/* {BENCH_DIR}/.[!.]*")
    run_id = f"e2e-bench-{int(time.time())}"
    t0 = time.time()
    res = run_playbook("benchmark.yml", "-e", f"run_id={run_id}", "-e", "samples=8", "-e", "max_new_tokens=8",
                       name="benchmark")
    took = time.time() - t0
    assert res.rc == 0, res.tail()
    # Progress while it runs, then the per-node and total figures.
    assert re.search(r"\[coord\] phase parallel \((loading the model|running)\): \d+/8 samples, worker1 \d+/4, "
                     r"worker2 \d+/4", res.out), res.tail()
    assert re.search(r"worker1\s+1 slot\(s\):.*samples/s", res.out) and "scaling efficiency" in res.out, res.tail()

    run = ROOT / "runs" / run_id
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "success", summary.get("error")
    agg = summary["aggregate"]
    assert sorted(agg["nodes"]) == ["worker1", "worker2"]
    assert agg["total"]["slots"] == 2 and agg["total"]["nodes"] == 2 and agg["total"]["samples"] == 8
    assert [(s["host"], s["samples"]) for s in agg["slots"]] == [("worker1", 4), ("worker2", 4)]
    # The totals are the sum of the per-node figures, and each node's the sum of its slots'.
    for key in RATES + ("samples", "prompt_tokens", "generated_tokens"):
        assert agg["total"][key] == pytest.approx(sum(n[key] for n in agg["nodes"].values())), key
        assert agg["total"][key] == pytest.approx(sum(s[key] for s in agg["slots"])), key
    assert agg["total"]["generated_tokens"] == 8 * 8
    # Scaling efficiency against the single-slot run of the same 8 samples.
    assert agg["single"]["samples"] == 8 and agg["single"]["host"] == "worker1"
    assert agg["scaling_efficiency"] == pytest.approx(agg["total"]["samples_per_s"]
                                                      / (2 * agg["single"]["samples_per_s"]))
    # Both workers share this machine's cores with the rest of the suite, and the single slot's phase may have had
    # more of them or fewer: 0.16-0.79 measured, and 2.69 once when the single slot ran under a heavier load than the
    # parallel phase. The formula above is what is checked; this only bounds it.
    assert 0 < agg["scaling_efficiency"] < 8
    lat = agg["latency"]
    assert lat["samples"] == 8 and 0 < lat["latency_p50_s"] <= lat["latency_p90_s"] <= lat["latency_p99_s"]
    # Engine and LoadGen (installed by the stack role): the choice and LoadGen's verdict are kept.
    assert agg["engines"] == ["hf"] and "transformers" in summary["engine_reason"]
    assert summary["loadgen"]["used"] and summary["loadgen"]["result"] == "VALID", summary["loadgen"]
    for name in ("report.md", "plots/throughput.png", "plots/latency.png", "plots/history.png",
                 "logs/parallel-worker1.log", "logs/parallel-worker2.log", "logs/single-worker1.log",
                 "loadgen/parallel-slot1/mlperf_log_summary.txt", "history/history.jsonl", "history.md"):
        assert (run / name).stat().st_size > 0, name
    report = (run / "report.md").read_text()
    assert "| **total** | 2 | 8 |" in report and "![throughput.png](plots/throughput.png)" in report
    assert "Result: **VALID**" in report
    assert len(history()) == 1
    print(f"benchmark.yml: {took:.0f} s; {agg['total']['samples_per_s']:.3g} samples/s, "
          f"efficiency {agg['scaling_efficiency']:.3f}")

    # The daily schedule: no systemd in the containers, so a crontab entry at 19:00.
    # The same settings as the run above, so that the history compares the two.
    res = run_playbook("benchmark_schedule.yml", "-e", "samples=8", "-e", "max_new_tokens=8", name="bench-schedule")
    assert res.rc == 0, res.tail()
    assert "Every day at 19:00 (cron on coord, as deepspeed)" in res.out, res.tail()
    crontab = coord("crontab -l -u deepspeed").stdout
    m = re.search(r"^0 19 \* \* \* (/opt/multinode-deepspeed/bin/multinode-benchmark >> /shared/bench/schedule.log"
                  r" 2>&1)$", crontab, re.M)
    assert m, crontab
    assert coord("pgrep -x cron", check=False).returncode == 0, "cron is not running on coord"
    again = run_playbook("benchmark_schedule.yml", "-e", "samples=8", "-e", "max_new_tokens=8", name="bench-sched-2")
    assert again.rc == 0 and again.recap()["coord"]["changed"] == 0, again.tail()

    # Its command, run by hand, adds a second entry to the history.
    coord("su -s /bin/sh deepspeed -c '%s'" % m.group(1))  # as cron would: as the benchmark's account
    entries = history()
    assert [e["status"] for e in entries] == ["success", "success"], coord(f"tail -30 {BENCH_DIR}/schedule.log").stdout
    assert entries[0]["run_id"] == run_id and entries[1]["trigger"] == "schedule"
    second = entries[1]["run_id"]
    text = coord(f"cat {BENCH_DIR}/history.md").stdout
    assert run_id in text and second in text and "Trend per metric" in text

    assert entries[0]["key"] == entries[1]["key"]
    # The second run was judged against the first (same settings): "ok" or "DROP: ...", not "first run".
    line = next(x for x in text.splitlines() if x.startswith(second))
    assert "first run" not in line and re.search(r"  (ok|DROP: .+)$", line), text

    # A doctored history whose earlier runs were three times faster than the last: the last run is flagged.
    last = entries[-1]
    fast = dict(entries[0], metrics=dict((k, v * 3 if k in RATES else v) for k, v in last["metrics"].items()))
    podman("exec", "-i", node_name("coord"), "sh", "-c", "cat > /tmp/doctored.jsonl",
           input="".join(json.dumps(e) + "\n" for e in (fast, last)))
    flagged = coord(f"{PY} -m multinode_ds.bench history --bench-dir {BENCH_DIR} --history /tmp/doctored.jsonl"
                    " --threshold 10").stdout
    for metric in RATES:
        assert f"REGRESSION {metric}: " in flagged and "(-66.7%, threshold 10%)" in flagged, flagged
    assert "REGRESSION latency" not in flagged and "REGRESSION scaling" not in flagged, flagged
    # The same history with the earlier run equal to the last: nothing is flagged.
    same = dict(entries[0], metrics=dict(last["metrics"]))
    podman("exec", "-i", node_name("coord"), "sh", "-c", "cat > /tmp/same.jsonl",
           input="".join(json.dumps(e) + "\n" for e in (same, last)))
    calm = coord(f"{PY} -m multinode_ds.bench history --bench-dir {BENCH_DIR} --history /tmp/same.jsonl").stdout
    assert "REGRESSION" not in calm and "no drop of more than 10%" in calm, calm

    # Two runs side by side, and a run against the history.
    res = run_playbook("benchmark_compare.yml", "-e", f"a={run_id}", "-e", f"b={second}", name="bench-compare")
    assert res.rc == 0, res.tail()
    assert re.search(r"samples_per_s\s+[\d.e+-]+\s+[\d.e+-]+\s+[+-][\d.]+%", res.out), res.tail()
    res = run_playbook("benchmark_compare.yml", "-e", f"a={second}", name="bench-compare-history")
    assert res.rc == 0 and "median of 1" in res.out, res.tail()

    # Removing the schedule removes the crontab entry.
    res = run_playbook("benchmark_schedule.yml", "-e", "benchmark_schedule_state=absent", name="bench-unschedule")
    assert res.rc == 0, res.tail()
    assert "multinode-benchmark" not in coord("crontab -l -u deepspeed", check=False).stdout


@pytest.mark.parametrize("extra, message", [
    (["-e", "model=no-such-model"], "unknown model 'no-such-model'"),
    (["-e", "samples=1"], "samples=1 is fewer than the 2 slots of worker1, worker2"),
])
def test_bad_benchmark_input_fails_before_anything_changes(provisioned, run_playbook, extra, message):
    coord(f"mkdir -p {BENCH_DIR} && ls {BENCH_DIR} > /tmp/bench-before")
    res = run_playbook("benchmark.yml", "-e", "run_id=e2e-bad-input", *extra, name="bench-bad-input")
    assert res.rc != 0 and message in res.out, res.tail()
    assert "Fix: -e samples=2 or more" in res.out or "Set model to one of them" in res.out, res.tail()
    assert coord(f"ls {BENCH_DIR} | diff - /tmp/bench-before", check=False).returncode == 0
    assert not (ROOT / "runs" / "e2e-bad-input").exists()
