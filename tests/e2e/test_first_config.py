"""The first run of a user's own config (issue 44, point 8): the field notes' own script with their ds_config
corrected (ZeRO-2, the optimizer offloaded to CPU, Adam: DeepSpeed's CPU Adam, which CPU workers do not prebuild)
trains on workers that never built that op, the first time, and on a worker where a compile of it was killed; the
next run builds nothing and the ranks find the op current.

Cost on the local cluster: a killed compile (a few seconds: killed once its compiler runs), CPU Adam built on both workers at once before the agents
start (two to three minutes of this machine's two cores, one compiler per worker), and two short trainings.
"""
import json
import shutil
import time
from pathlib import Path

import pytest
from e2e_nodes import node_name

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "ds_config"
WORKDIR = Path(__file__).resolve().parent / "files" / "workdir"
EXT = "/opt/multinode-deepspeed/torch_extensions"
VENV = "/opt/multinode-deepspeed/venv"
WORKERS = ("worker1", "worker2")


def as_run_user(podman, node, script):
    """A shell script on ``node`` as the account the ranks run as (it owns the ops' directory)."""
    return podman("exec", "--user", "deepspeed", node_name(node), "sh", "-c", script)


def kill_a_compile(podman, node):
    """Start DeepSpeed's CPU Adam build as a rank would (its load), and kill it with its compilers half-way: torch's
    build lock stays behind, with no library."""
    script = f"""
# A real compile to kill (the local cluster's compiler cache would answer a compile it has seen at once).
export DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR={EXT} PATH={VENV}/bin:$PATH MAX_JOBS=1 CCACHE_DISABLE=1
cd /tmp
setsid {VENV}/bin/python -c 'from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()' \
    > /tmp/killed-compile.log 2>&1 &
pid=$!
for i in $(seq 120); do [ -e {EXT}/cpu_adam/lock ] && break; sleep 0.5; done
# Half-way: once a compiler of the build runs (ninja starts one per source file), not after a fixed time.
for i in $(seq 240); do pgrep -s $pid -f cc1plus >/dev/null && break; sleep 0.25; done
sleep 1
kill -9 -$pid
sleep 1
ls {EXT}/cpu_adam/
"""
    res = as_run_user(podman, node, script)
    assert res.returncode == 0, res.stderr
    return res.stdout.split()


def so_mtime(podman, node):
    res = as_run_user(podman, node, f"stat -c %Y {EXT}/cpu_adam/cpu_adam.so")
    assert res.returncode == 0, (node, res.stderr)
    return int(res.stdout)


def project(tmp_path):
    """The field notes' script (tests/e2e/files/workdir) with their config corrected for two CPU ranks."""
    root = tmp_path / "proj"
    shutil.copytree(WORKDIR, root)
    (root / "data" / "nonce.txt").write_text("%s\n" % time.time_ns())
    shutil.copyfile(FIXTURES / "field_notes_corrected.json", root / "ds_config.json")
    return root


def flat(out):
    """The play's output on one line, as the debug task's YAML has it unquoted (``DeepSpeed''s``)."""
    return " ".join(out.replace("''", "'").split())


def train(run_playbook, proj, run_id, steps):
    return run_playbook("train.yml", "-e", f"workdir={proj}", "-e", "entrypoint=train.py",
                        "-e", f"args='--steps {steps} --deepspeed_config ds_config.json'", "-e", f"run_id={run_id}",
                        "-e", "preflight=false", name=run_id.rsplit("-", 1)[0])


def test_the_corrected_field_notes_config_trains_the_first_time_and_after_a_killed_compile(
        provisioned, run_playbook, podman, tmp_path):
    # Workers that never built CPU Adam (site.yml builds only the shm comm op on CPU workers).
    for node in WORKERS:
        assert as_run_user(podman, node, f"rm -rf {EXT}/cpu_adam").returncode == 0
    left = kill_a_compile(podman, "worker1")
    assert "lock" in left and "cpu_adam.so" not in left, left
    proj = project(tmp_path)

    run_id = f"e2e-first-config-{int(time.time())}"
    res = train(run_playbook, proj, run_id, steps=3)
    assert res.rc == 0, res.tail()
    out = flat(res.out)
    assert f"worker1: removed the stale build lock {EXT}/cpu_adam/lock (left by a build that did not end" in out
    for node in WORKERS:
        assert f"{node}: built DeepSpeed's cpu_adam in" in out, res.tail()
    summary = json.loads((ROOT / "runs" / run_id / "summary.json").read_text())
    assert summary["status"] == "success", summary
    logs = "".join(p.read_text() for p in (ROOT / "runs" / run_id / "logs").glob("*.log"))
    for rank in (0, 1):
        assert f"workdir-script rank {rank}/2 on worker{rank + 1}" in logs and "step 3" in logs, logs[-3000:]
    built = dict((node, so_mtime(podman, node)) for node in WORKERS)

    # The next run builds nothing, and its ranks find the op current (its library is not written again).
    run_id = f"e2e-first-config-again-{int(time.time())}"
    res = train(run_playbook, proj, run_id, steps=1)
    assert res.rc == 0, res.tail()
    out = flat(res.out)
    for node in WORKERS:
        assert f"{node}: cpu_adam was built already" in out, res.tail()
        assert so_mtime(podman, node) == built[node], node
    assert "built DeepSpeed's cpu_adam" not in out
