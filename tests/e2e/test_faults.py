"""The faults real clusters have (issue 15): a node lost mid-run, a network cut (a stall), Ctrl-C during the stall,
two runs side by side, and a resume without a checkpoint or from a torn one."""
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from e2e_nodes import (left_on, load_summary, localcluster, node_name, on_coord, podman, rank_step, run_processes,
                       start_train, when_step)

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def worker2_back(provisioned, run_playbook):
    """Whatever a test does to worker2, it comes back at its address, with its services, afterwards, and with the
    cluster's names in its /etc/hosts (podman rewrites the file when it starts a container again; the slurm tests
    provision Slurm again themselves)."""
    yield
    localcluster("connect", "worker2")
    assert localcluster("up").returncode == 0
    res = run_playbook(str(ROOT / "tests" / "e2e" / "files" / "cluster_hosts.yml"), name="cluster-hosts-after-fault")
    assert res.rc == 0, res.tail()


def fault_at_step_10(run_playbook, run_id, fault, args, name):
    """train.yml with a long run, ``fault()`` once rank 0 reached step 10; the play must fail. Returns its result
    and the seconds from the fault to the play's end."""
    at = {}
    t = threading.Thread(target=lambda: at.setdefault("fault", when_step(run_id, 10, fault)))
    t.start()
    res = run_playbook("train.yml", *args, "-e", "steps=100000", "-e", f"run_id={run_id}", "-e", "preflight=false",
                       name=name)
    ended = time.time()
    t.join()
    assert at.get("fault") and res.rc != 0
    return res, ended - at["fault"]


def test_a_node_stopped_mid_run_is_named_first(provisioned, run_playbook, worker2_back):
    run_id = f"e2e-lost-{int(time.time())}"
    res, took = fault_at_step_10(run_playbook, run_id, lambda: podman("stop", "-t", "0", node_name("worker2")), [],
                                 "lost-node")
    print(f"the play failed {took:.1f}s after worker2 stopped")
    assert took < 60
    flat = " ".join(res.out.split())
    assert "Lost first: worker2" in flat, res.tail()
    summary = load_summary(run_id)
    assert summary["lost"] == ["worker2"] and summary["problems"][0].startswith("worker2 was lost")
    assert left_on(["coord", "worker1"], run_id) == {}


def test_a_worker_pdsh_cannot_log_in_to_is_named_at_once(provisioned, run_playbook):
    """pdsh's login to worker2 fails (its sshd listens no more; Ansible's open session stays, so the play reaches
    it): worker2 never starts its agent or its launcher. The coordinator's agent reads pdsh's line for worker2 and
    ends the run within seconds, naming worker2 and ssh's own words, instead of waiting out the start allowance."""
    run_id = f"e2e-nologin-{int(time.time())}"
    reach = run_playbook(str(ROOT / "tests" / "e2e" / "files" / "reach.yml"), name="nologin-reach")
    assert reach.rc == 0, reach.tail()
    pid = podman("exec", node_name("worker2"), "cat", "/run/sshd.pid").stdout.strip()
    podman("exec", node_name("worker2"), "kill", pid)
    try:
        t0 = time.time()
        res = run_playbook("train.yml", "-e", "steps=100000", "-e", f"run_id={run_id}", "-e", "preflight=false",
                           name="nologin")
        took = time.time() - t0
    finally:
        podman("exec", node_name("worker2"), "/usr/sbin/sshd", "-E", "/var/log/sshd.log")
    print(f"the play failed after {took:.1f}s")
    assert res.rc != 0 and took < 60, res.tail()
    flat = " ".join(res.out.split())
    assert "Lost first: worker2" in flat, res.tail()
    assert "the launch on worker2 ended with 255" in flat and "Connection refused" in flat, res.tail()
    summary = load_summary(run_id)
    assert summary["lost"] == ["worker2"]
    assert not (ROOT / "runs" / run_id / "nodes" / "worker2.json").exists()
    assert left_on(["coord", "worker1"], run_id) == {}


def test_a_network_cut_stalls_the_run_and_is_named(provisioned, run_playbook, worker2_back):
    run_id = f"e2e-cut-{int(time.time())}"
    # The default limit: ten times this run's step time (20 ms), so its floor, 10 s (module_utils/run/pace.py).
    res, took = fault_at_step_10(run_playbook, run_id, lambda: localcluster("disconnect", "worker2"),
                                 ["-e", "backend=ssh-free"], "network-cut")
    print(f"the play failed {took:.1f}s after worker2's network was cut")
    assert took < 90
    flat = " ".join(res.out.split())
    assert "worker2 does not answer on the cluster network" in flat, res.tail()
    assert "Lost first: worker2" in flat
    assert left_on(["coord", "worker1"], run_id) == {}


def test_ctrl_c_during_a_stall_stops_every_reachable_node(provisioned, worker2_back):
    run_id = f"e2e-cut-ctrlc-{int(time.time())}"
    # pdsh, as in the field: its launcher on the coordinator holds SSH sessions to the cut worker.
    proc, out, log = start_train(["-e", "steps=100000", "-e", f"run_id={run_id}", "-e", "preflight=false",
                                  "-e", "stall_timeout=600"], "cut-ctrl-c")
    try:
        assert when_step(run_id, 10, lambda: localcluster("disconnect", "worker2")), "the run never started"
        time.sleep(15)  # the run hangs: nothing ends it but the user
        assert run_processes("worker1", run_id)
        interrupted = time.time()
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        out.close()
    left = left_on(["coord", "worker1"], run_id, seconds=10)
    print(f"reachable nodes clean {time.time() - interrupted:.1f}s after Ctrl-C")
    assert left == {}, f"still running 10s after Ctrl-C during a stall: {left}"


def test_two_runs_side_by_side_neither_kills_the_other(provisioned, run_playbook):
    stamp = int(time.time())
    a_id, b_id = f"e2e-side-a-{stamp}", f"e2e-side-b-{stamp}"
    # A: pdsh, llama-tiny, stopped with Ctrl-C; B: ssh-free, gpt2-tiny, another master port, runs to its end.
    proc, out, log = start_train(["-e", "steps=100000", "-e", f"run_id={a_id}", "-e", "preflight=false"], "side-a")
    try:
        assert when_step(a_id, 3, lambda: None), "run A never started"
        b = {}
        # 150 steps (a few seconds): B still trains when A is stopped.
        t = threading.Thread(target=lambda: b.setdefault("res", run_playbook(
            "train.yml", "-e", "backend=ssh-free", "-e", "model=gpt2-tiny", "-e", "steps=150", "-e", "master_port=29611",
            "-e", f"run_id={b_id}", "-e", "preflight=false", name="side-b")))
        t.start()
        assert when_step(b_id, 3, lambda: None), "run B never started"
        os.killpg(proc.pid, signal.SIGINT)  # A stops: stopping A's pdsh must not stop B's launchers
        proc.wait(timeout=60)
        t.join()
    finally:
        if proc.poll() is None:
            proc.kill()
        out.close()
    assert b["res"].rc == 0, b["res"].tail()
    assert load_summary(b_id)["status"] == "success"
    assert left_on(["coord", "worker1", "worker2"], a_id) == {}


def test_a_second_run_on_the_same_checkpoints_fails_at_once_naming_the_first(provisioned, run_playbook):
    stamp = int(time.time())
    a_id = f"e2e-lock-a-{stamp}"
    proc, out, log = start_train(["-e", "steps=100000", "-e", f"run_id={a_id}", "-e", "preflight=false"], "lock-a")
    try:
        assert when_step(a_id, 3, lambda: None), "run A never started"
        # The same model through the other backend: it fails at once, naming A, and A trains on.
        res = run_playbook("train.yml", "-e", "backend=ssh-free", "-e", "steps=10", "-e", f"run_id=e2e-lock-b-{stamp}",
                           "-e", "preflight=false", "-e", "master_port=29611", name="lock-b")
        step = rank_step(a_id)
        assert when_step(a_id, step + 2, lambda: None, seconds=60), "run A stopped when B failed"
        assert proc.poll() is None and all(run_processes(n, a_id) for n in ("worker1", "worker2"))
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        out.close()
    assert res.rc != 0
    assert f"is in use by run {a_id}" in " ".join(res.out.split()), res.tail()
    assert on_coord(f"test -e /shared/runs/e2e-lock-b-{stamp}/hostfile").returncode != 0


def test_resume_without_a_checkpoint_fails_before_launch(provisioned, run_playbook):
    on_coord("rm -rf /shared/checkpoints/gpt2-tiny")
    res = run_playbook("train.yml", "-e", "model=gpt2-tiny", "-e", "resume=true", "-e", "steps=10",
                       "-e", f"run_id=e2e-resume-none-{int(time.time())}", "-e", "preflight=false",
                       name="resume-none")
    assert res.rc != 0
    flat = " ".join(res.out.split())
    assert "resume=true but /shared/checkpoints/gpt2-tiny holds no checkpoint" in flat, res.tail()
    assert "TASK [Start the agent" not in res.out


def test_resume_from_a_torn_checkpoint_falls_back_to_the_previous_one(provisioned, run_playbook):
    on_coord("rm -rf /shared/checkpoints/gpt2-tiny")
    first = f"e2e-resume-src-{int(time.time())}"
    res = run_playbook("train.yml", "-e", "model=gpt2-tiny", "-e", "steps=10", "-e", "save_interval=5",
                       "-e", f"run_id={first}", "-e", "preflight=false", name="resume-src")
    assert res.rc == 0, res.tail()
    # Tear the newest checkpoint as a crash while saving would: its model states cut short.
    on_coord(f"f=$(ls /shared/checkpoints/gpt2-tiny/{first}-step10/mp_rank_00_model_states.pt) && "
             "head -c 100 $f > $f.part && mv $f.part $f")
    resumed = f"e2e-resume-torn-{int(time.time())}"
    res = run_playbook("train.yml", "-e", "model=gpt2-tiny", "-e", "steps=12", "-e", "resume=true",
                       "-e", f"run_id={resumed}", "-e", "preflight=false", name="resume-torn")
    assert res.rc == 0, res.tail()
    summary = load_summary(resumed)
    # The tags are the run's own (<run_id>-step<N>): the resumed run saves its own, never over the first run's.
    assert summary["resume"]["from_tag"] == f"{first}-step5" and summary["resume"]["start_step"] == 5
    skipped = summary["resume"]["skipped"][0]
    assert skipped["tag"] == f"{first}-step10" and "torn" in skipped["why"]
    assert on_coord(f"test -d /shared/checkpoints/gpt2-tiny/{first}-step5 && "
                    f"test -d /shared/checkpoints/gpt2-tiny/{resumed}-step12").returncode == 0
