"""The first training after site.yml starts as fast as the second: no op is JIT-compiled (issue 3)."""
import json
import subprocess
import time
from pathlib import Path

import pytest
from e2e_nodes import node_name

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def podman_exec(node, *cmd):
    env = {"CONTAINERS_CONF": str(ROOT / ".cache" / "podman" / "containers.conf"), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["podman", "exec", node_name(node), *cmd], env=env, capture_output=True, text=True, check=False)


def startup_seconds(run):
    """Seconds from the rank processes' start to their first finished step (the slowest rank)."""
    worst = 0.0
    for path in (run / "metrics").glob("rank*.jsonl"):
        recs = [json.loads(x) for x in path.read_text().splitlines()]
        start = next(r for r in recs if r["event"] == "start")
        first = next(r for r in recs if r["event"] == "step")
        worst = max(worst, first["time"] - start["process_start"])
    return worst


def test_first_run_after_provisioning_is_as_fast_as_the_second(provisioned, run_playbook):
    """Provisioning builds DeepSpeed's ops, so the first run does not JIT-compile them (issue 3, item 3).

    This module's name sorts before test_launch.py, so on a new cluster these are the first two
    trainings after site.yml (test_bad_inputs.py starts none).
    """
    # site.yml left the op built on every worker.
    for node in ("worker1", "worker2"):
        built = podman_exec(node, "sh", "-c", "ls /opt/multinode-deepspeed/torch_extensions/*/*.so")
        assert built.returncode == 0 and "deepspeed_shm_comm" in built.stdout, (node, built.stdout, built.stderr)
    times = []
    for i in (1, 2):
        run_id = f"e2e-startup{i}-{int(time.time())}"
        # Without preflight: its all-reduce test would load torch first and warm the page cache.
        res = run_playbook("train.yml", "-e", "steps=5", "-e", f"run_id={run_id}", "-e", "preflight=false",
                           name=f"train-startup{i}")
        assert res.rc == 0, res.tail()
        times.append(startup_seconds(ROOT / "runs" / run_id))
        launcher = (ROOT / "runs" / run_id / "nodes" / "coord.launcher.log").read_text()
        assert "Building extension module" not in launcher, "run %d compiled an op" % i
    first, second = times
    report = {"first_run_startup_s": round(first, 2), "second_run_startup_s": round(second, 2),
              "ratio": round(first / second, 3)}
    (ROOT / "tests" / "output").mkdir(parents=True, exist_ok=True)
    (ROOT / "tests" / "output" / "first-vs-second-run.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"first run after site.yml: {first:.1f}s to the first step; second run: {second:.1f}s")
    # The cost being guarded against is a JIT build: 140 s for the shm op on this machine. The first
    # run also reads torch/DeepSpeed from a cold page cache (1-2 s here, 10.4 s vs 8.3 s in one CI
    # run), so the bound allows that much noise while any compile still fails it by far.
    assert first - second <= max(0.5 * second, 5.0), report
