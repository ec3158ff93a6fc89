"""The slurm backend on a real slurmctld, slurmd and slurmdbd (issue 13): train, a user's script, a killed rank,
Ctrl-C, the run's timeout, a node Slurm marks DOWN, and a batch script the user submits."""
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from e2e_nodes import NODES, left_on, load_summary, node_name, on_coord, podman, start_train, when_step

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def nothing_left(run_id, seconds=60):
    return left_on(NODES, run_id, seconds, every=1)


def sacct_state(job_id, seconds=20):
    """The job's state in Slurm's accounting (slurmdbd), once it has one that ends a job."""
    state = ""
    for _try in range(seconds):
        state = on_coord(f"sacct -n -P -X -j {job_id} -o State").stdout.strip().split(" ")[0]
        if state and state not in ("RUNNING", "PENDING", "COMPLETING"):
            break
        time.sleep(1)
    return state


def test_train_through_slurm_leaves_a_completed_job(slurm, run_playbook):
    run_id = f"e2e-slurm-{int(time.time())}"
    res = run_playbook("train.yml", "-e", "backend=slurm", "-e", "steps=20", "-e", f"run_id={run_id}",
                       "-e", "preflight=force", name="train-slurm")
    assert res.rc == 0, res.tail()
    summary = load_summary(run_id)
    assert summary["status"] == "success", summary["problems"]
    assert summary["backend"] == "slurm" and summary["world_size"] == 2
    assert summary["hosts"] == {"worker1": [0], "worker2": [1]}
    assert summary["last_loss"] < summary["first_loss"]
    record = summary["scheduler"]
    assert record["name"] == "slurm" and record["state"] == "COMPLETED" and record["exit_code"] == "0:0"
    assert record["nodes"] == "worker[1-2]" and record["source"] == "sacct" and record["elapsed"]
    assert sacct_state(record["job_id"]) == "COMPLETED"
    # The role's slurm_batch_sched_delay=0 (slurmctld places a batch job within its next second, never up to 3 s
    # later) and slurm_backfill_interval=1 (a backfill pass between the loop's).
    config = on_coord("scontrol show config").stdout
    assert [x.split("=", 1)[1].strip() for x in config.splitlines() if x.startswith("SchedulerParameters")] == [
        "bf_interval=1,batch_sched_delay=0"], config
    run = ROOT / "runs" / run_id
    assert sorted(p.name for p in (run / "logs").glob("*_rank*.log")) == ["slurm_rank0.log", "slurm_rank1.log"]
    assert "#SBATCH --kill-on-bad-exit" not in (run / "slurm" / "job.sbatch").read_text()
    assert "srun --kill-on-bad-exit=1" in (run / "slurm" / "job.sbatch").read_text()
    # Preflight checked what Slurm needs, not SSH.
    verdicts = json.loads((run / "preflight.json").read_text())["verdicts"]
    munge = dict((v["host"], v["status"]) for v in verdicts if v["check"] == "slurm munge")
    assert munge == {"coord": "pass", "worker1": "pass", "worker2": "pass"}
    part = dict((v["host"], v["status"]) for v in verdicts if v["check"] == "slurm partition")
    assert part == {"worker1": "pass", "worker2": "pass"}
    assert [v["status"] for v in verdicts if v["check"] == "ssh"] == ["skip"]
    assert nothing_left(run_id, 5) == {}


def test_users_own_deepspeed_script_through_slurm(slurm, run_playbook):
    script = (Path(__file__).parent / "files" / "user_ds_script.py").read_text()
    res = podman("exec", "-i", node_name("coord"), "sh", "-c", "mkdir -p /shared/user && chown deepspeed /shared/user && cat > /shared/user/train_mlp.py",
                 input=script)
    assert res.returncode == 0, res.stderr
    run_id = f"e2e-slurm-user-{int(time.time())}"
    out = f"/shared/user/out-{run_id}"
    res = run_playbook("train.yml", "-e", "backend=slurm", "-e", "entrypoint=/shared/user/train_mlp.py",
                       "-e", f"args='--steps 6 --out {out}'", "-e", f"run_id={run_id}", "-e", "preflight=false",
                       name="user-slurm")
    assert res.rc == 0, res.tail()
    summary = load_summary(run_id)
    assert summary["status"] == "success", summary["problems"]
    assert summary["scheduler"]["state"] == "COMPLETED"
    done = on_coord(f"cat {out}/rank*.done").stdout.split("\n")
    assert sorted(filter(None, done)) == ["worker1 2", "worker2 2"]
    logs = "".join(p.read_text() for p in (ROOT / "runs" / run_id / "logs").glob("*_rank*.log"))
    assert "user-script rank 0/2 on worker1 step 6" in logs and "user-script rank 1/2 on worker2 step 6" in logs


def train_with_fault(run_playbook, run_id, step, fault, name):
    """A long run through slurm, ``fault()`` once rank 0 reached ``step``: (result, seconds from the fault to
    the end of the play)."""
    at = {}
    t = threading.Thread(target=lambda: at.setdefault("fault", when_step(run_id, step, fault)))
    t.start()
    res = run_playbook("train.yml", "-e", "backend=slurm", "-e", "steps=100000", "-e", f"run_id={run_id}",
                       "-e", "preflight=false", name=name)
    ended = time.time()
    t.join()
    assert at.get("fault"), f"the run never reached step {step}"
    assert res.rc != 0
    return res, ended - at["fault"]


def test_a_killed_rank_ends_the_job_on_every_node_and_names_the_rank(slurm, run_playbook):
    run_id = f"e2e-slurm-kill-{int(time.time())}"
    res, took = train_with_fault(run_playbook, run_id, 5, lambda: podman(
        "exec", node_name("worker2"), "pkill", "-9", "-f", "--", "-u -m multinode_ds.train"), "slurm-killed-rank")
    assert took < 60, f"the playbook ended {took:.0f}s after the kill"
    print(f"the play failed {took:.1f}s after the kill")
    flat = " ".join(res.out.split())
    assert "Failed first: rank 1 on worker2, exit code -9" in flat, res.tail()
    assert "rank 1 on worker2 exited with -9 (SIGKILL)" in flat, res.tail()
    summary = load_summary(run_id)
    assert summary["abort"]["reason"].startswith("rank 1 on worker2 exited with -9 (killed) (Slurm job ")
    assert "srun --kill-on-bad-exit ended every rank" in summary["abort"]["reason"]
    assert summary["status"] == "failed" and summary["failure"]["rank"] == 1
    assert summary["scheduler"]["state"] == "FAILED"
    assert sacct_state(summary["scheduler"]["job_id"]) == "FAILED"
    assert nothing_left(run_id) == {}


def test_ctrl_c_cancels_the_slurm_job(slurm):
    run_id = f"e2e-slurm-ctrlc-{int(time.time())}"
    proc, out, log = start_train(["-e", "backend=slurm", "-e", "steps=100000", "-e", f"run_id={run_id}",
                                  "-e", "preflight=false"], "slurm-ctrl-c")
    try:
        interrupted = when_step(run_id, 3, lambda: os.killpg(proc.pid, signal.SIGINT))
        assert interrupted, "the run never started"
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
        out.close()
    assert proc.returncode != 0
    ended = time.time()
    assert nothing_left(run_id) == {}, "the run's processes outlived Ctrl-C"
    print(f"the play ended {ended - interrupted:.1f}s and every node was clean {time.time() - interrupted:.1f}s "
          f"after Ctrl-C")
    record = json.loads(on_coord(f"cat /shared/runs/{run_id}/scheduler.json").stdout)
    assert sacct_state(record["job_id"]) == "CANCELLED"
    assert on_coord(f"squeue -h -j {record['job_id']}").stdout.strip() == ""
    assert "scancel %s" % record["job_id"] in on_coord(f"cat /shared/runs/{run_id}/nodes/coord.launcher.log").stdout


def test_the_runs_timeout_cancels_the_slurm_job(slurm, run_playbook):
    run_id = f"e2e-slurm-timeout-{int(time.time())}"
    res = run_playbook("train.yml", "-e", "backend=slurm", "-e", "steps=100000", "-e", "timeout=20",
                       "-e", f"run_id={run_id}", "-e", "preflight=false", name="slurm-timeout")
    assert res.rc != 0
    assert "timeout of 20s" in " ".join(res.out.split()), res.tail()
    summary = load_summary(run_id)
    assert sacct_state(summary["scheduler"]["job_id"]) == "CANCELLED"
    assert nothing_left(run_id) == {}


def test_a_node_slurm_marks_down_is_named_as_the_cause(slurm, run_playbook):
    run_id = f"e2e-slurm-down-{int(time.time())}"
    try:
        res, took = train_with_fault(run_playbook, run_id, 3, lambda: on_coord(
            "scontrol update nodename=worker2 state=down reason=e2e-maintenance"), "slurm-node-down")
    finally:
        on_coord("scontrol update nodename=worker2 state=resume")
    assert took < 60
    print(f"the play failed {took:.1f}s after scontrol set worker2 DOWN")
    flat = " ".join(res.out.split())
    assert "node worker2 is DOWN" in flat and "e2e-maintenance" in flat, res.tail()
    assert nothing_left(run_id) == {}
    wait_both_idle(30)


def test_slurm_submit_false_writes_a_batch_script_that_runs_by_hand(slurm, run_playbook):
    run_id = f"e2e-slurm-script-{int(time.time())}"
    res = run_playbook("train.yml", "-e", "backend=slurm", "-e", "slurm_submit=false", "-e", "steps=8",
                       "-e", f"run_id={run_id}", "-e", "preflight=false",
                       "-e", json.dumps({"secret_env": {"MY_TOKEN": "tok-handoff"}}), name="slurm-submit-false")
    assert res.rc == 0, res.tail()
    assert "tok-handoff" not in res.out
    script = f"/shared/runs/{run_id}/slurm/job.sbatch"  # the local inventory's shared_dir_path
    assert f"Submit it with: sbatch {script}" in " ".join(res.out.split())
    assert on_coord(f"sacct -n -X --name=mnds-{run_id} -o JobID").stdout.strip() == ""
    # The run handed to the user has its secrets on every rank node already, owned by the run's (non-root) user.
    for node in ("worker1", "worker2"):
        got = podman("exec", node_name(node), "stat", "-c", "%U %a",
                     f"/opt/multinode-deepspeed/secrets/runs/{run_id}.json").stdout.split()
        assert got == ["deepspeed", "600"], (node, got)
    job_id = on_coord(f"su -s /bin/sh deepspeed -c 'sbatch --parsable {script}'").stdout.strip()
    assert job_id.isdigit()
    assert sacct_state(job_id, 120) == "COMPLETED"
    steps = on_coord(f"grep -c '\"event\": \"step\"' /shared/runs/{run_id}/metrics/rank1.jsonl").stdout.strip()
    assert steps == "8"


def wait_both_idle(seconds):
    """Wait until Slurm has both workers idle again (after a test set worker2 down)."""
    for _try in range(seconds):
        if sorted(on_coord("sinfo -h -N -o '%N|%T'").stdout.split()) == ["worker1|idle", "worker2|idle"]:
            return
        time.sleep(1)
    pytest.fail("worker2 did not come back idle")


def _sinfo(node):
    """(state, reason) of ``node`` in sinfo."""
    out = on_coord(f"sinfo -h -N -n {node} -o '%T|%E'").stdout.strip().split("|")
    return out[0], out[1] if len(out) > 1 else ""


def test_a_node_lost_under_slurm_is_drained_and_the_run_goes_on_without_it(slurm, run_playbook, tmp_path):
    """Issue 22 on Slurm: worker2 goes DOWN at step 60 (Slurm ends the job NODE_FAIL); with -e restarts=1
    -e min_nodes=1 worker2 is drained with the reason and a second job, with worker2 in --exclude, finishes on
    worker1 from the newest whole checkpoint; -e unquarantine=worker2 gives it back to Slurm."""
    run_id = f"e2e-slurm-recover-{int(time.time())}"
    at = {}
    down = "scontrol update nodename=worker2 state=down reason=e2e-node-lost"
    t = threading.Thread(target=lambda: at.setdefault(
        "fault", when_step(run_id, 60, lambda: on_coord(down), attempt=1)))
    t.start()
    try:
        res = run_playbook("train.yml", "-e", "backend=slurm", "-e", "save_interval=50", "-e", "steps=300",
                           "-e", f"run_id={run_id}", "-e", "preflight=false", "-e", "restarts=1", "-e", "min_nodes=1",
                           "-e", f"quarantine_file={tmp_path}/q.json", "-e", f"spares_file={tmp_path}/s.json",
                           name="slurm-recover")
        t.join()
        assert at.get("fault") and res.rc == 0, res.tail()
        summary = load_summary(run_id)
        first, second = summary["attempts"]
        print(f"worker2 DOWN to the second job's first step: {second['fault_to_first_step']} s; "
              f"goodput {summary['goodput']}")
        assert first["kind"] == "lost" and first["failed_nodes"] == ["worker2"] and first["retried"] is True
        assert second["nodes"] == ["worker1"] and second["start_step"] >= 50 and second["last_step"] == 300
        run = ROOT / "runs" / run_id / "attempts"
        jobs = [json.loads((run / str(n) / "scheduler.json").read_text())["job_id"] for n in (1, 2)]
        assert [sacct_state(j) for j in jobs] == ["NODE_FAIL", "COMPLETED"], jobs
        assert "#SBATCH --exclude=worker2\n" in (run / "2" / "slurm" / "job.sbatch").read_text()
        state, reason = _sinfo("worker2")
        assert "drain" in state and reason == f"multinode-deepspeed: lost in run {run_id} (attempt 1)", (state, reason)
        assert "Keep the nodes lost in the run out of Slurm" in res.out
        assert nothing_left(run_id, 10) == {}
        # The drained node is given back by -e unquarantine= (the next run uses both nodes again).
        again = run_playbook("train.yml", "-e", "backend=slurm", "-e", "steps=5", "-e", f"run_id={run_id}-again",
                             "-e", "preflight=false", "-e", "unquarantine=worker2",
                             "-e", f"quarantine_file={tmp_path}/q.json", name="slurm-unquarantine")
        assert again.rc == 0, again.tail()
        assert load_summary(f"{run_id}-again")["hosts"] == {"worker1": [0], "worker2": [1]}
    finally:
        if "drain" in _sinfo("worker2")[0] or "down" in _sinfo("worker2")[0]:
            on_coord("scontrol update nodename=worker2 state=resume")


def test_a_node_given_back_that_slurm_does_not_hear_from_stops_the_play_before_the_run(slurm, run_playbook):
    """-e unquarantine= resumes a node a run drained, then waits until Slurm hears from it: a node whose slurmd is
    gone stays IDLE* (not responding) and the play stops naming it, before the run's directory is written."""
    run_id = f"e2e-slurm-mute-{int(time.time())}"
    podman("exec", node_name("worker2"), "pkill", "-x", "slurmd")
    try:
        on_coord(f"scontrol update nodename=worker2 state=down reason='multinode-deepspeed: lost in run {run_id}'")
        res = run_playbook("train.yml", "-e", "backend=slurm", "-e", "steps=5", "-e", f"run_id={run_id}",
                           "-e", "preflight=false", "-e", "unquarantine=worker2", "-e", "backend_slurm_resume_wait=3",
                           name="slurm-mute")
        flat = " ".join(res.out.split())
        assert res.rc != 0 and "Slurm does not hear from worker2 idle*" in flat, res.tail()
        assert "Fix: start slurmd there" in flat
        assert on_coord(f"test -e /shared/runs/{run_id}").returncode != 0
    finally:
        podman("exec", node_name("worker2"), "/etc/init.d/slurmd", "start")
        on_coord("scontrol update nodename=worker2 state=resume")
        wait_both_idle(60)
