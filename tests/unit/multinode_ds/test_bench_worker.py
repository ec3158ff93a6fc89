"""The benchmark's worker side: accounting, LoadGen, engine choice, and node runs with real child processes."""
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from multinode_ds import bench_worker as bw
from multinode_ds.agent import MARKER, run_pids

ROOT = Path(__file__).resolve().parents[3]


class FakeEngine(bw.Engine):
    """Sleeps for its stated service time; a prompt has one token per character."""

    name = "fake"

    def __init__(self, prefill_s=0.002, decode_s=0.003, new_tokens=4):
        self.prefill_s, self.decode_s, self.new_tokens = prefill_s, decode_s, new_tokens
        self.calls = []

    def infer(self, prompt):
        self.calls.append(prompt)
        time.sleep(self.prefill_s + self.decode_s)
        return bw.Sample(len(prompt), self.new_tokens, self.prefill_s, self.decode_s, self.new_tokens - 1)


def runner_for(tmp_path, engine, prompts, total, every=0.0):
    progress = bw.Progress(tmp_path / "progress" / "p.json", "h1", 0, total, every=every)
    return bw.Runner(engine, prompts, progress)


def read(path):
    return json.loads(Path(path).read_text())


# -- accounting ----------------------------------------------------------------------------------

def test_plain_loop_sums_times_tokens_and_latencies(tmp_path):
    prompts = ["a", "bb", "ccc", "dddd"]
    engine = FakeEngine()
    runner = runner_for(tmp_path, engine, prompts, total=3)
    before = time.time()
    started, wall, details = bw.measure(runner, [3, 1, 2], None)
    t = runner.tally
    assert details is None and engine.calls == ["dddd", "bb", "ccc"]
    assert (t.samples, t.prompt_tokens, t.generated_tokens) == (3, 9, 12)
    assert t.prefill_s == pytest.approx(0.006) and t.decode_s == pytest.approx(0.009)
    assert t.latencies_s == pytest.approx([0.005] * 3)
    assert 0.015 <= wall < 1.0 and before <= started <= time.time()
    assert read(tmp_path / "progress" / "p.json") == {"host": "h1", "slot": 0, "done": 3, "total": 3}
    doc = bw.slot_result({"host": "h1", "slot": 0}, t, started, wall, {"used": False})
    assert doc["finished"] == pytest.approx(started + wall) and doc["latencies_s"] == t.latencies_s
    assert {"samples", "prompt_tokens", "generated_tokens", "wall_s", "prefill_s", "decode_s", "latencies_s",
            "started", "finished", "loadgen"} <= set(doc)


def test_progress_is_throttled_but_forced_at_the_end(tmp_path):
    path = tmp_path / "p.json"
    progress = bw.Progress(path, "h1", 2, 5, every=60)
    progress.update(done=1)
    progress.update(done=2)
    assert read(path)["done"] == 1
    progress.update(force=True)
    assert read(path) == {"host": "h1", "slot": 2, "done": 2, "total": 5}


def test_no_go_file_fails_naming_the_other_slots(tmp_path):
    with pytest.raises(bw.BenchError, match="the other slots did not get ready"):
        bw.wait_for_go(tmp_path / "go-parallel", timeout_s=0.2, poll_s=0.05)


# -- LoadGen -------------------------------------------------------------------------------------

def test_loadgen_issues_every_sample_once_and_is_valid(tmp_path):
    pytest.importorskip("mlperf_loadgen")
    prompts = ["p0", "p1", "p2", "p3", "p4", "p5", "p6"]
    engine = FakeEngine(0.001, 0.001)
    samples = [6, 0, 2, 4, 5]
    runner = runner_for(tmp_path, engine, prompts, total=len(samples))
    plan = bw.LoadGenPlan(tmp_path / "lg", expected_qps=bw.expected_qps(0.002), min_duration_ms=0)
    started, wall, details = bw.measure(runner, samples, plan)
    assert details["issued"] == 5 == runner.tally.samples == len(runner.tally.latencies_s)
    assert sorted(engine.calls) == sorted(prompts[i] for i in samples)
    assert details["result"] == "VALID"
    assert "Result is : VALID" in Path(details["summary_file"]).read_text()
    assert wall >= 5 * 0.002


def test_loadgen_samples_beyond_n_are_counted(tmp_path):
    # With a minimum duration LoadGen issues max(n, qps * duration * 1.1) samples, repeating indexes.
    pytest.importorskip("mlperf_loadgen")
    engine = FakeEngine(0.004, 0.006, new_tokens=2)
    runner = runner_for(tmp_path, engine, ["x", "yy", "zzz"], total=3)
    plan = bw.LoadGenPlan(tmp_path / "lg", expected_qps=100.0, min_duration_ms=200)
    started, wall, details = bw.measure(runner, [0, 1, 2], plan)
    issued = details["issued"]
    assert issued == 22 and runner.tally.samples == issued and runner.tally.generated_tokens == 2 * issued
    assert runner.tally.decode_s == pytest.approx(0.006 * issued)
    assert read(tmp_path / "progress" / "p.json") == {"host": "h1", "slot": 0, "done": issued, "total": issued}
    assert details["result"] == "VALID" and wall >= 0.2


def test_loadgen_choice(monkeypatch):
    assert bw.choose_loadgen("off") == (False, "loadgen=off")
    monkeypatch.setitem(sys.modules, "mlperf_loadgen", None)  # import mlperf_loadgen now fails
    assert bw.choose_loadgen("auto") == (False, "not installed")
    with pytest.raises(bw.BenchError, match="loadgen=on but mlperf_loadgen is not installed.*mlcommons-loadgen"):
        bw.choose_loadgen("on")


def test_loadgen_reason_names_its_version():
    pytest.importorskip("mlperf_loadgen")
    used, reason = bw.choose_loadgen("on")
    assert used and reason.startswith("mlperf_loadgen ")


# -- choices and the work file -------------------------------------------------------------------

@pytest.mark.parametrize("asked, device, path, have, engine, reason", [
    ("hf", "cuda", "/m", True, "hf", "engine=hf asked for"),
    ("vllm", "cuda", "/m", True, "vllm", "engine=vllm asked for"),
    ("auto", "cuda", "/m", True, "vllm", "vllm is installed and the device is cuda"),
    ("auto", "cuda", "/m", False, "hf", "vllm is not installed: Hugging Face transformers"),
    ("auto", "cpu", "/m", True, "hf", "vllm is installed but the device is cpu: Hugging Face transformers"),
    ("auto", "cuda", "", True, "hf", "vllm is installed but the model has random weights"),
])
def test_engine_choice_and_reason(asked, device, path, have, engine, reason):
    got, why = bw.choose_engine(asked, device, path, have)
    assert got == engine and why.startswith(reason)


def test_vllm_asked_for_but_unusable():
    with pytest.raises(bw.BenchError, match="engine=vllm but vllm is not installed"):
        bw.choose_engine("vllm", "cuda", "/m", False)
    with pytest.raises(bw.BenchError, match="engine=vllm needs model_path"):
        bw.choose_engine("vllm", "cuda", "", True)


def test_work_file_errors_name_host_phase_and_fix(tmp_path):
    work = {"run_id": "r", "out_dir": str(tmp_path), "model": "llama-tiny", "prompts": ["a", "b"],
            "phases": {"parallel": {"w1": [{"slot": 0, "local_slot": 0, "samples": [0, 5]}]}}}
    path = tmp_path / "work.json"
    path.write_text(json.dumps(work))
    got = bw.read_work(str(path))
    assert got["engine"] == "auto" and got["max_new_tokens"] == 16 and got["start_timeout_s"] == 600
    with pytest.raises(bw.BenchError, match="no slots for host 'w2' in phase 'parallel' .*hosts in that phase: w1"):
        bw.host_slots(got, "w2", "parallel")
    with pytest.raises(bw.BenchError, match="sample index 5 out of range: the work file has 2 prompts"):
        bw.find_slot(got, "w1", "parallel", 0)
    with pytest.raises(bw.BenchError, match="unknown model 'gpt5'; known models: .*model_path"):
        bw.registry_spec("gpt5")
    path.write_text(json.dumps({**work, "loadgen": "maybe"}))
    with pytest.raises(bw.BenchError, match="loadgen='maybe'; expected one of auto, on, off"):
        bw.read_work(str(path))


def test_hf_engine_prefill_then_decode():
    pytest.importorskip("transformers")
    engine = bw.load_hf("llama-tiny", "", "cpu", max_new_tokens=5)
    s = engine.infer("hello")
    assert s.prompt_tokens == len("hello") + 2 and s.generated_tokens == 5  # bos + bytes + eos
    assert s.prefill_s > 0 and s.decode_s > 0
    assert engine.infer("hi").prompt_tokens == 4
    with pytest.raises(bw.BenchError, match="exceeds the model's context of 512"):
        engine.validate(["x" * 600])


def test_exit_descriptions_and_help(capsys):
    assert bw.describe_exit(-15) == "killed by SIGTERM" and bw.describe_exit(1) == "exit 1"
    with pytest.raises(SystemExit) as exc:
        bw.main(["--help"])
    assert exc.value.code == 0 and "--watch-stdin" in capsys.readouterr().out


def test_the_package_runs_with_python_m():
    # As the driver starts it: the package's __main__, without runpy's warning about a module imported twice.
    cmd = [sys.executable, "-W", "error::RuntimeWarning", "-m", "multinode_ds.bench_worker", "--help"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m multinode_ds.bench_worker") and "--watch-stdin" in done.stdout
    assert "the worker side of ``multinode_ds.bench``" in done.stdout and not done.stderr


def test_a_slot_imports_the_package_from_where_its_node_found_it(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    env = bw.child_env("run-1", "cuda", 3, 2)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(ROOT), "/elsewhere"]
    assert (env[MARKER], env["CUDA_VISIBLE_DEVICES"], env["OMP_NUM_THREADS"]) == ("run-1", "3", "2")
    assert "CUDA_VISIBLE_DEVICES" not in bw.child_env("run-1", "cpu", 3, 2)


# -- node runs (real child processes) ------------------------------------------------------------

PROMPTS = ["The cat", "sat on the mat", "and looked", "at the dog", "which barked", "twice."]


def write_work(tmp_path, slots, **over):
    run_id = f"test-bench-{uuid.uuid4().hex[:8]}"
    work = {"run_id": run_id, "out_dir": str(tmp_path / "out"), "model": "llama-tiny", "model_path": "",
            "engine": "auto", "device": "cpu", "max_new_tokens": 4, "loadgen": "auto",
            "loadgen_min_duration_ms": 0, "start_timeout_s": 60, "prompts": PROMPTS,
            "phases": {"parallel": {"node1": slots}}, **over}
    path = tmp_path / "work.json"
    path.write_text(json.dumps(work))
    return path, work


def start_node(work_path, *extra, stdin=subprocess.DEVNULL):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "multinode_ds.bench_worker", "--work", str(work_path), "--host", "node1",
           "--phase", "parallel", *extra]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def wait_ready(proc, out_dir, slots, timeout=60):
    """Act as the driver: wait for every slot's ready file."""
    ready = [Path(out_dir) / "ready" / f"parallel-slot{s}" for s in slots]
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in ready):
        if proc.poll() is not None:
            pytest.fail(f"node process exited {proc.returncode} before the slots were ready:\n"
                        f"{proc.stdout.read()}")
        assert time.monotonic() < deadline, "slots not ready in time"
        time.sleep(0.1)
    return [read(p)["pid"] for p in ready]


def two_slots():
    return [{"slot": 0, "local_slot": 0, "samples": [0, 2, 4]}, {"slot": 1, "local_slot": 1, "samples": [1, 3, 5]}]


def test_node_runs_two_slots_end_to_end(tmp_path):
    work_path, work = write_work(tmp_path, two_slots(), device="auto")
    out = Path(work["out_dir"])
    proc = start_node(work_path)
    try:
        wait_ready(proc, out, [0, 1])
        (out / "go-parallel").write_text("go\n")
        output = proc.communicate(timeout=60)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0, output
    assert "started slot 0" in output and "slot 1 finished: exit 0" in output
    results = [read(out / "slots" / f"parallel-slot{s}.json") for s in (0, 1)]
    assert sum(r["samples"] for r in results) == 6
    for slot, r in enumerate(results):
        assert (r["host"], r["slot"], r["local_slot"], r["phase"]) == ("node1", slot, slot, "parallel")
        assert r["engine"] == "hf" and r["device"] == "cpu" and r["model"] == "llama-tiny"
        assert r["generated_tokens"] == 3 * 4 and len(r["latencies_s"]) == 3
        assert r["wall_s"] >= sum(r["latencies_s"]) * 0.99 and r["finished"] > r["started"]
        assert r["torch_threads"] == max(1, os.cpu_count() // 2)
        progress = read(out / "progress" / f"parallel-slot{slot}.json")
        assert progress["done"] == progress["total"] == 3
        lg = r["loadgen"]
        if lg["used"]:
            assert lg["issued"] == 3 and "Result is : VALID" in Path(lg["summary_file"]).read_text()
        assert (out / "logs" / f"parallel-slot{slot}.log").read_text().strip()
    assert run_pids(work["run_id"]) == []


@pytest.mark.parametrize("case", ["bad model", "bad sample index"])
def test_a_failing_slot_fails_the_node(tmp_path, case):
    if case == "bad model":
        work_path, work = write_work(tmp_path, two_slots()[:1], model="no-such-model")
        expect = "unknown model 'no-such-model'"
    else:
        slots = two_slots()
        slots[1]["samples"] = [1, 99]
        work_path, work = write_work(tmp_path, slots)
        expect = "sample index 99 out of range"
    proc = start_node(work_path)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 1, output
    assert expect in output and "failed; last lines of" in output
    if case == "bad sample index":
        assert "slot 0 stopped (killed by SIGTERM)" in output
    assert run_pids(work["run_id"]) == []


def test_closed_stdin_stops_the_node_and_its_slots(tmp_path):
    work_path, work = write_work(tmp_path, two_slots())
    proc = start_node(work_path, "--watch-stdin", stdin=subprocess.PIPE)
    try:
        pids = wait_ready(proc, work["out_dir"], [0, 1])
        proc.stdin.close()
        proc.wait(timeout=30)
        output = proc.stdout.read()
    finally:
        proc.kill()
    assert proc.returncode == 143, output
    assert "stdin closed" in output
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists()
    assert run_pids(work["run_id"]) == []
