"""Launch, watch and collect (issue 4): both backends, a user's own script, a killed rank, resume."""
import json
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
from e2e_nodes import load_summary, node_name, podman, run_processes, wait_for_files

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
NODES = ("coord", "worker1", "worker2")


@pytest.mark.parametrize("backend", ["pdsh", "ssh-free"])
def test_tiny_llama_on_each_backend(provisioned, run_playbook, backend):
    run_id = f"e2e-{backend}-{int(time.time())}"
    res = run_playbook("train.yml", "-e", f"backend={backend}", "-e", "steps=20", "-e", f"run_id={run_id}",
                       name=f"train-{backend}")
    assert res.rc == 0, res.tail()
    # Progress lines while it runs: step/total, loss, throughput, and every node's heartbeat.
    assert re.search(r"\[coord\] step \d+/20 \| loss \d+\.\d+ \| \d+ tok/s \| [\d.]+ samples/s \| eta \d+s \| "
                     r"nodes: .*worker1 (running|finished) \d+s, worker2 (running|finished)", res.out), res.tail()
    summary = load_summary(run_id)
    assert summary["status"] == "success", summary["problems"]
    assert summary["backend"] == backend
    assert summary["hosts"] == {"worker1": [0], "worker2": [1]}
    assert summary["last_loss"] < summary["first_loss"]
    run = ROOT / "runs" / run_id
    # The plots are drawn after the play's last task, in the background: they come within seconds.
    assert not wait_for_files([run / n for n in ("report.md", "plots/loss.png", "plots/throughput.png",
                                                 "plots/step_time.png")])
    assert "![loss](plots/loss.png)" in (run / "report.md").read_text()
    assert set(summary["versions"]) >= {"worker1", "worker2"}
    assert summary["rank_logs"]["1"]["host"] == "worker2"
    for node in NODES:
        assert run_processes(node, run_id) == [], node
    # A run that ended well came back with the watch's last status call: the play's rsync did not run, and the
    # same files arrived as rsync would have copied (every one but the checkpoints, contents and modes).
    assert re.search(r"TASK \[Collect logs, metrics[^\n]*unless the watch brought them[^\n]*\n(skipping: \[coord\]\n)",
                     res.out), res.tail()
    made_here = ("summary.json", "report.md", "plots/", "preflight.json", "preflight.txt")
    local = dict((k, v) for k, v in files_of(run).items() if not k.startswith(made_here))
    assert local == cluster_files(run_id) and "nodes/worker2.json" in local and "hostfile" in local


def files_of(root):
    """Every file under ``root``: relative path -> (mode, sha256)."""
    import hashlib
    return dict((str(p.relative_to(root)), (oct(p.stat().st_mode & 0o777),
                                            hashlib.sha256(p.read_bytes()).hexdigest()))
                for p in root.rglob("*") if p.is_file())


def cluster_files(run_id):
    """The run directory's files on the coordinator but its checkpoints: relative path -> (mode, sha256)."""
    res = podman("exec", node_name("coord"), "sh", "-c", f"cd /shared/runs/{run_id} && find . -name checkpoints -prune "
                 "-o -name attempts -prune -o -type f -printf '%m %p\\n' | while read -r m p; do "
                 "printf '%s %s %s\\n' \"$m\" \"$(sha256sum \"$p\" | cut -d' ' -f1)\" \"${p#./}\"; done")
    assert res.returncode == 0, res.stderr
    out = {}
    for line in res.stdout.splitlines():
        mode, digest, path = line.split(" ", 2)
        out[path] = (oct(int(mode, 8)), digest)
    return out


@pytest.mark.parametrize("backend", ["pdsh", "ssh-free"])
def test_users_own_deepspeed_script_runs_unmodified(provisioned, run_playbook, backend):
    script = (Path(__file__).parent / "files" / "user_ds_script.py").read_bytes()
    res = podman("exec", "-i", node_name("coord"), "sh", "-c", "mkdir -p /shared/user && chown deepspeed /shared/user && cat > /shared/user/train_mlp.py",
                 input=script.decode())
    assert res.returncode == 0, res.stderr
    run_id = f"e2e-user-{backend}-{int(time.time())}"
    out = f"/shared/user/out-{run_id}"
    # preflight=false: the launch without preflight (the tests of the bundled trainer run it).
    res = run_playbook("train.yml", "-e", f"backend={backend}", "-e", "entrypoint=/shared/user/train_mlp.py",
                       "-e", f"args='--steps 6 --out {out}'", "-e", f"run_id={run_id}", "-e", "preflight=false",
                       name=f"user-{backend}")
    assert res.rc == 0, res.tail()
    assert not (ROOT / "runs" / run_id / "preflight.json").exists()
    assert not (ROOT / "runs" / run_id / "preflight").exists()
    summary = load_summary(run_id)
    assert summary["status"] == "success", summary["problems"]
    assert summary["entrypoint"] == "/shared/user/train_mlp.py" and summary["exit_status"] == 0
    done = podman("exec", node_name("coord"), "sh", "-c", f"cat {out}/rank*.done").stdout.split("\n")
    assert sorted(filter(None, done)) == ["worker1 2", "worker2 2"]
    logs = "".join(p.read_text() for p in (ROOT / "runs" / run_id / "logs").glob("*_rank*.log"))
    assert "user-script rank 0/2 on worker1 step 6" in logs and "user-script rank 1/2 on worker2 step 6" in logs


def _kill_rank_when_running(run_id, host, min_step, deadline):
    """SIGKILL the rank process on ``host`` once rank metrics show ``min_step``."""
    while time.time() < deadline:
        res = podman("exec", node_name("coord"), "sh", "-c",
                     f"tail -n1 /shared/runs/{run_id}/metrics/rank1.jsonl 2>/dev/null")
        try:
            if json.loads(res.stdout).get("step", 0) >= min_step:
                podman("exec", node_name(host), "pkill", "-9", "-f", "--", "-u -m multinode_ds.train")
                return time.time()
        except ValueError:
            pass
        time.sleep(0.5)
    return None


def test_killed_rank_fails_fast_cleans_up_and_resume_continues(provisioned, run_playbook):
    run_id = f"e2e-kill-{int(time.time())}"
    killed = {}
    killer = threading.Thread(target=lambda: killed.setdefault(
        "at", _kill_rank_when_running(run_id, "worker2", 12, time.time() + 600)))
    killer.start()
    res = run_playbook("train.yml", "-e", "steps=400", "-e", "save_interval=5", "-e", f"run_id={run_id}",
                       "-e", "preflight=false", name="killed-rank")
    ended = time.time()
    killer.join()
    assert killed.get("at"), "the rank never reached the step to kill it"
    assert res.rc != 0
    assert ended - killed["at"] < 60, f"the playbook ended {ended - killed['at']:.0f}s after the kill"
    assert "Failed first: rank 1 on worker2, exit code -9" in res.out, res.tail()
    summary = load_summary(run_id)
    assert summary["status"] == "failed"
    assert summary["failure"]["host"] == "worker2" and summary["failure"]["rank"] == 1
    assert "killed" in [d["id"] for d in summary["diagnosis"]]
    assert [d for d in summary["diagnosis"] if d["id"] == "killed"][0]["signal"] == "SIGKILL"
    run = ROOT / "runs" / run_id
    assert {p.name.split("_")[-1] for p in (run / "logs").glob("*_rank*.log")} == {"rank0.log", "rank1.log"}
    for node in NODES:
        assert run_processes(node, run_id) == [], f"{node} still runs processes of {run_id}"
    last = max(r["step"] for r in map(json.loads, (run / "metrics" / "rank0.jsonl").read_text().splitlines())
               if r.get("event") == "step")
    saved = (last // 5) * 5

    resumed_id = f"{run_id}-resumed"
    res = run_playbook("train.yml", "-e", f"steps={saved + 5}", "-e", "resume=true", "-e", f"run_id={resumed_id}",
                       "-e", "preflight=false", name="resumed")
    assert res.rc == 0, res.tail()
    recs = [json.loads(x) for x in (ROOT / "runs" / resumed_id / "metrics" / "rank0.jsonl").read_text().splitlines()]
    start = [r for r in recs if r["event"] == "start"][0]
    steps = [r["step"] for r in recs if r["event"] == "step"]
    assert start["start_step"] >= 5 and start["start_step"] % 5 == 0, start
    assert steps[0] == start["start_step"] + 1 and steps[-1] == saved + 5


def test_ctrl_c_on_the_controller_stops_the_run_on_every_node(provisioned):
    import os
    import signal
    import sys

    run_id = f"e2e-ctrlc-{int(time.time())}"
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), PWD=str(ROOT),
               PATH=f"{bin_dir}:{os.environ.get('PATH', '')}")
    log = ROOT / "tests" / "output" / f"ctrl-c-{int(time.time())}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([str(bin_dir / "ansible-playbook"), "train.yml", "-e", "steps=100000",
                                 "-e", f"run_id={run_id}", "-e", "preflight=false"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.time() + 300
        while time.time() < deadline:
            res = podman("exec", node_name("coord"), "sh", "-c",
                         f"tail -n1 /shared/runs/{run_id}/metrics/rank0.jsonl 2>/dev/null")
            try:
                if json.loads(res.stdout).get("step", 0) >= 3:
                    break
            except ValueError:
                pass
            time.sleep(0.5)
        else:
            proc.kill()
            pytest.fail("the run never started")
        assert all(run_processes(n, run_id) for n in ("worker1", "worker2"))
        interrupted = time.time()
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        proc.wait(timeout=120)
    left = {}
    while time.time() - interrupted < 60:
        left = {n: run_processes(n, run_id) for n in NODES}
        if not any(left.values()):
            break
        time.sleep(0.5)
    took = time.time() - interrupted
    assert not any(left.values()), f"still running after Ctrl-C: {left}"
    print(f"every node stopped {took:.1f}s after Ctrl-C")
    abort = json.loads(podman("exec", node_name("coord"), "cat", f"/shared/runs/{run_id}/control/ABORT").stdout)
    # The watch's own record, or its dead man's switch's (the SSH session that ends with the watch's process),
    # never the lease (45 s later).
    assert abort["reason"] in ("interrupted on the controller", "the controller went away (interrupted or killed)")
    assert took <= 10
