"""multinode_ds.ops_ready: torch's build locks judged held, young or stale (a live process holding one vs none), the
stale ones removed and named; ops ready without importing DeepSpeed; an op the accelerator lacks refused."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multinode_ds import ops_ready

ROOT = Path(__file__).resolve().parents[3]
OLD = time.time() - 3600


def lock(root, op, age=None):
    """A build lock as torch's FileBaton leaves it, ``age`` seconds old (None: just now)."""
    op_dir = root / op
    op_dir.mkdir(parents=True, exist_ok=True)
    path = op_dir / "lock"
    path.write_text("")
    if age is not None:
        for p in [op_dir] + list(op_dir.iterdir()):
            os.utime(p, (time.time() - age, time.time() - age))
    return path


@pytest.fixture
def holder():
    """A live process that holds a lock as torch's FileBaton does (O_CREAT|O_EXCL, the descriptor kept open), or
    sits in a directory as ninja does; stopped after the test."""
    procs = []

    def start(path, how="fd"):
        code = ("import os, sys, time\n"
                "fd = os.open(sys.argv[1], os.O_CREAT | os.O_RDONLY)\n" if how == "fd" else
                "import os, sys, time\nos.chdir(sys.argv[1])\n") + "print('ready', flush=True)\ntime.sleep(120)\n"
        proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_lock_nobody_holds_and_nothing_touched_is_stale_and_removed(tmp_path):
    path = lock(tmp_path, "cpu_adam", age=600)
    (tmp_path / "fused_adam").mkdir()
    removed, held = ops_ready.clear_stale(str(tmp_path))
    assert not path.exists() and held == []
    assert [(r["op"], r["state"], r["pids"]) for r in removed] == [("cpu_adam", "stale", [])]
    assert removed[0]["age"] >= 599
    assert "no process has it or %s open" % (tmp_path / "cpu_adam") in removed[0]["why"]


def test_a_lock_a_live_process_holds_open_is_kept_then_stale_once_it_died(tmp_path, holder):
    path = lock(tmp_path, "cpu_adam")
    proc = holder(path)
    for p in (path, path.parent):
        os.utime(p, (OLD, OLD))
    removed, held = ops_ready.clear_stale(str(tmp_path))
    assert path.exists() and removed == []
    assert [(h["op"], h["state"], h["pids"]) for h in held] == [("cpu_adam", "held", [proc.pid])]
    proc.kill()
    proc.wait()
    removed, held = ops_ready.clear_stale(str(tmp_path))
    assert not path.exists() and [r["op"] for r in removed] == ["cpu_adam"] and held == []


def test_a_process_building_in_the_ops_directory_holds_it(tmp_path, holder):
    """ninja and the compilers run in the op's directory; the process that took the lock is elsewhere."""
    path = lock(tmp_path, "cpu_adam", age=600)
    proc = holder(path.parent, how="cwd")
    state = ops_ready.lock_state(str(path))
    assert state["state"] == "held" and state["pids"] == [proc.pid]


def test_a_fresh_lock_or_a_build_that_just_wrote_is_young_not_stale(tmp_path):
    path = lock(tmp_path, "cpu_adam")
    assert ops_ready.lock_state(str(path))["state"] == "young"
    path = lock(tmp_path, "fused_adam", age=600)
    (path.parent / "fused_adam.so").write_text("")  # ninja's link just ended; the release follows
    assert ops_ready.lock_state(str(path))["state"] == "young"
    assert ops_ready.lock_state(str(path), grace=0)["state"] == "stale"
    assert ops_ready.lock_state(str(tmp_path / "none" / "lock")) is None


def test_an_op_built_and_stamped_is_ready_without_deepspeed(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # an import would fail the test
    stamp = ops_ready.stamp_id()
    (tmp_path / "cpu_adam").mkdir()
    (tmp_path / "cpu_adam" / "cpu_adam.so").write_text("")
    ops_ready.write_stamp(str(tmp_path), "cpu_adam", stamp)
    lock(tmp_path, "cpu_adam", age=600)  # left by a killed run's load: stale
    report = ops_ready.prepare(str(tmp_path), [("cpu_adam", "CPUAdamBuilder")], wait=5)
    assert report["ready"] == ["cpu_adam"] and report["built"] == [] and report["problems"] == []
    assert [r["op"] for r in report["removed"]] == ["cpu_adam"]


def test_the_stamp_follows_deepspeed_torch_and_the_build_variables(tmp_path):
    base = ops_ready.stamp_id({"DS_ACCELERATOR": "cuda", "TORCH_CUDA_ARCH_LIST": "9.0"})
    assert base == ops_ready.stamp_id({"DS_ACCELERATOR": "cuda", "TORCH_CUDA_ARCH_LIST": "9.0", "HOME": "/x"})
    assert base != ops_ready.stamp_id({"DS_ACCELERATOR": "cuda", "TORCH_CUDA_ARCH_LIST": "8.0"})
    site = tmp_path / "lib" / "python3.11" / "site-packages"
    (site / "deepspeed-0.19.8.dist-info").mkdir(parents=True)
    before = ops_ready.stamp_id({}, prefix=str(tmp_path))
    (site / "deepspeed-0.19.8.dist-info").rename(site / "deepspeed-0.20.0.dist-info")
    assert ops_ready.stamp_id({}, prefix=str(tmp_path)) != before


def test_a_build_another_process_holds_is_waited_for_then_named(tmp_path, holder):
    path = lock(tmp_path, "cpu_adam")
    proc = holder(path)
    report = ops_ready.prepare(str(tmp_path), [("cpu_adam", "CPUAdamBuilder")], wait=1)
    assert report["problems"] == [{"op": "cpu_adam", "builder": "CPUAdamBuilder", "message": (
        "the build of cpu_adam by process(es) %d did not end within 1 s (its lock %s)" % (proc.pid, path))}]


def run(tmp_path, *args):
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "multinode_ds.ops_ready", "--extensions-dir", str(tmp_path / "ext"),
                           "--json", *args], env=env, capture_output=True, text=True, check=False, timeout=300)


def test_an_op_the_accelerator_lacks_is_a_problem_with_deepspeeds_answer(tmp_path):
    pytest.importorskip("deepspeed")
    res = run(tmp_path, "--op", "fused_lamb=FusedLambBuilder")
    assert res.returncode == 1, res.stderr[-2000:]
    report = json.loads(res.stdout)
    assert report["problems"] == [{"op": "fused_lamb", "builder": "FusedLambBuilder", "message": (
        "DeepSpeed's fused_lamb (FusedLambBuilder) does not exist for the cpu accelerator")}]


def test_a_usage_error_is_refused():
    res = subprocess.run([sys.executable, "-m", "multinode_ds.ops_ready", "--op", "cpu_adam"], capture_output=True,
                         text=True, check=False, env=dict(os.environ, PYTHONPATH=str(ROOT), TORCH_EXTENSIONS_DIR="/x"))
    assert res.returncode == 2 and "is not NAME=Builder" in res.stderr


def test_a_young_lock_nobody_holds_is_waited_out_then_removed_and_named(tmp_path, monkeypatch):
    """A compile killed a moment ago: its lock is young (it could be a build about to start ninja); once nothing
    changed for the grace, it is stale, removed, and in the report."""
    monkeypatch.setitem(sys.modules, "deepspeed", None)
    stamp = ops_ready.stamp_id()
    (tmp_path / "cpu_adam").mkdir()
    (tmp_path / "cpu_adam" / "cpu_adam.so").write_text("")
    ops_ready.write_stamp(str(tmp_path), "cpu_adam", stamp)
    old = time.time() - 600
    for path in [tmp_path / "cpu_adam"] + list((tmp_path / "cpu_adam").iterdir()):
        os.utime(path, (old, old))
    path = lock(tmp_path, "cpu_adam")
    start = time.time()
    report = ops_ready.prepare(str(tmp_path), [("cpu_adam", "CPUAdamBuilder")], wait=30, grace=2)
    assert 1.5 <= time.time() - start < 15 and not path.exists()
    assert [r["op"] for r in report["removed"]] == ["cpu_adam"] and report["ready"] == ["cpu_adam"]


def test_building_lists_the_ops_a_process_builds_now(tmp_path, holder):
    path = lock(tmp_path, "cpu_adam", age=600)
    lock(tmp_path, "fused_adam", age=600)  # stale: not being built
    proc = holder(path)
    found = ops_ready.building(str(tmp_path))
    assert [(b["op"], b["pids"]) for b in found] == [("cpu_adam", [proc.pid])] and found[0]["age"] >= 599
    assert (tmp_path / "fused_adam" / "lock").exists()  # it removes nothing
