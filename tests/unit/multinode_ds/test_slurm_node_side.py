"""multinode_ds/slurm_rank.py: a rank's variables from srun's; multinode_ds/slurm.py:
how the job's end is read (srun's own lines, recorded in the run's ABORT)."""
import json
from pathlib import Path

import pytest

from multinode_ds import slurm, slurm_rank

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"


def test_local_size_from_slurms_tasks_per_node():
    assert slurm_rank.local_size("2(x3),1", 0) == 2 and slurm_rank.local_size("2(x3),1", 3) == 1
    assert slurm_rank.local_size("4", 0) == 4


def test_rank_variables_from_sruns():
    env = slurm_rank.rank_env({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
                               "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NUM_NODES": "2"}, "10.0.0.1", 29500)
    assert env == {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_SIZE": "2", "CROSS_RANK": "1",
                   "CROSS_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def test_the_plans_node_order_not_slurms():
    # slurm.conf lists worker2 first (SLURM_NODEID 0), the plan puts worker1 first.
    env = slurm_rank.rank_env({"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
                               "SLURM_STEP_TASKS_PER_NODE": "1,2", "SLURM_STEP_NUM_NODES": "2"}, "10.0.0.1", 29500,
                              ["worker1", "worker1", "worker2"])
    assert (env["CROSS_RANK"], env["CROSS_SIZE"], env["LOCAL_SIZE"]) == ("1", "2", "1")


def test_not_responding_down_and_fail_are_bad_drain_is_not():
    states = ("down", "down*", "idle*", "allocated*", "fail", "drained", "draining", "failing", "mixed", "idle")
    bad = [s for s in states if slurm.bad_node_state(s)]
    assert bad == ["down", "down*", "idle*", "allocated*", "fail"]


def test_sruns_lines_on_failed_tasks():
    assert slurm.srun_failures((FIXTURES / "batch-killed.out").read_text()) == [
        ("worker2", "1", -9, "Killed"), ("worker1", "0", -15, "Terminated")]


def test_the_task_that_failed_before_srun_stopped_the_step_comes_first():
    text = ("srun: launch/slurm: _step_signal: Terminating StepId=9.0\n"
            "srun: error: worker1: task 0: Terminated\n")
    text = "srun: error: worker2: task 1: Exited with exit code 2\n" + text
    assert slurm.srun_failures(text)[0] == ("worker2", "1", 2, "Exited with exit code 2")
    # The killed-by-srun line printed first still comes after the one before the step's stop.
    racy = ("srun: launch/slurm: _step_signal: Terminating StepId=9.0\nsrun: error: worker1: task 0: Terminated\n"
            "srun: error: worker2: task 1: Exited with exit code 2\n")
    assert slurm.srun_failures(racy)[0][0] == "worker1"
    assert slurm.srun_failures((FIXTURES / "batch-exit3.out").read_text())[0] == (
        "worker4", "4-5", 3, "Exited with exit code 3")


def make_job(tmp_path, batch, tasks="worker1\nworker1\nworker2\nworker2\nworker4\nworker4\n", names=None):
    (tmp_path / "slurm").mkdir()
    if names:
        (tmp_path / "slurm" / "names.json").write_text(json.dumps(names))
    (tmp_path / "control").mkdir()
    (tmp_path / "slurm" / "tasks").write_text(tasks)
    (tmp_path / "slurm" / "batch-7.out").write_text((FIXTURES / batch).read_text())
    job = slurm.Job(slurm.parse_args(["job", "--run-dir", str(tmp_path), "--host", "coord"]))
    job.job_id = "7"
    job.down_nodes = lambda nodelist: []
    return job


def test_a_failed_rank_is_the_runs_abort_with_its_node_rank_and_code(tmp_path, capsys):
    job = make_job(tmp_path, "batch-exit3.out")
    assert job.verdict({"state": "FAILED", "exit_code": "3:0", "elapsed": "00:00:09"}) == 3
    abort = json.loads((tmp_path / "control" / "ABORT").read_text())
    assert abort["host"] == "worker4" and abort["exit_code"] == 3
    assert abort["reason"] == ("rank 4-5 on worker4 exited with 3 (Slurm job 7 FAILED; srun --kill-on-bad-exit "
                               "ended every rank)")
    # DeepSpeed's launcher's line, with the local rank from the tasks file: what the run's diagnosis reads.
    assert "worker4: rank 4-5 (--local_rank=0) exits with return code = 3" in capsys.readouterr().out


def test_a_node_slurm_marks_down_is_the_cause(tmp_path):
    job = make_job(tmp_path, "batch-killed.out")
    job.down_nodes = lambda nodelist: [("worker2", "node worker2 is DOWN in Slurm (e2e-maintenance)")]
    assert job.verdict({"state": "NODE_FAIL", "exit_code": "0:0"}) == 1
    abort = json.loads((tmp_path / "control" / "ABORT").read_text())
    assert abort["host"] == "worker2"
    assert abort["reason"] == "node worker2 is DOWN in Slurm (e2e-maintenance); Slurm job 7 ended NODE_FAIL"


def test_a_completed_job_is_success_and_writes_no_abort(tmp_path):
    job = make_job(tmp_path, "batch-killed.out")
    assert job.verdict({"state": "COMPLETED", "exit_code": "0:0"}) == 0
    assert not (tmp_path / "control" / "ABORT").exists()


def test_slurms_node_names_are_reported_by_their_inventory_names(tmp_path, capsys):
    job = make_job(tmp_path, "batch-exit3.out", names={"worker4": "gpu-d4"})
    job.verdict({"state": "FAILED", "exit_code": "3:0"})
    abort = json.loads((tmp_path / "control" / "ABORT").read_text())
    assert abort["host"] == "gpu-d4" and "rank 4-5 on gpu-d4 exited with 3" in abort["reason"]
    assert "gpu-d4: rank 4-5 (--local_rank=0) exits with return code = 3" in capsys.readouterr().out


def test_a_job_that_ends_otherwise_is_blamed_on_the_coordinator_by_name(tmp_path):
    job = make_job(tmp_path, "batch-killed.out")
    (tmp_path / "slurm" / "batch-7.out").write_text("")
    assert job.verdict({"state": "TIMEOUT", "exit_code": "0:15"}) == 1
    abort = json.loads((tmp_path / "control" / "ABORT").read_text())
    assert abort == {**abort, "host": "coord", "reason": "Slurm job 7 reached its time limit"}


def test_a_lost_node_in_sruns_output_is_the_cause(tmp_path):
    job = make_job(tmp_path, "batch-killed.out")
    (tmp_path / "slurm" / "batch-7.out").write_text(
        "srun: error: Node failure on worker2\nsrun: error: worker1: task 0: Killed\n")
    job.verdict({"state": "NODE_FAIL", "exit_code": "0:0", "nodes": "worker[1-2]"})
    abort = json.loads((tmp_path / "control" / "ABORT").read_text())
    assert abort["host"] == "worker2" and abort["reason"] == "Slurm job 7 ended NODE_FAIL: node worker2 failed"


# Issue 26, 10: the queue record, from real `scontrol show job -o` lines (Slurm 23, the e2e cluster).
HELD = ("JobId=8 JobName=wrap UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=0 Nice=0 Account=root "
        "QOS=normal JobState=PENDING Reason=JobHeldUser Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 "
        "ExitCode=0:0 RunTime=00:00:00 TimeLimit=UNLIMITED TimeMin=N/A SubmitTime=2026-11-25T07:31:13 "
        "EligibleTime=Unknown AccrueTime=Unknown StartTime=Unknown EndTime=Unknown Deadline=N/A SuspendTime=None "
        "SecsPreSuspend=0 LastSchedEval=2026-11-25T07:31:13 Scheduler=Main Partition=gpu AllocNode:Sid=coord:8751 "
        "ReqNodeList=(null) ExcNodeList=(null) NodeList= NumNodes=2-2 NumCPUs=2 NumTasks=2 CPUs/Task=1 "
        "ReqB:S:C:T=0:0:*:* TRES=cpu=2,mem=44G,node=2,billing=2 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* "
        "MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 OverSubscribe=OK "
        "Contiguous=0 Licenses=(null) Network=(null) Command=(null) WorkDir=/ StdErr=/dev/null StdIn=/dev/null "
        "StdOut=/dev/null Power= \n")
BEHIND = HELD.replace("JobId=8", "JobId=10").replace("Reason=JobHeldUser", "Reason=Priority")
RUNNING = HELD.replace("JobState=PENDING Reason=JobHeldUser", "JobState=RUNNING Reason=None").replace(
    "NodeList= ", "NodeList=worker[1-2] ")


def test_a_held_job_is_queued_with_its_reason_and_fix():
    rec = slurm.queue_record("8", slurm.parse_scontrol(HELD), 100.0)
    assert rec == {"state": "queued", "label": "PENDING", "reason": "JobHeldUser", "job_id": "8", "since": 100.0,
                   "fix": "the job is held: scontrol release 8"}


def test_a_job_behind_others_is_queued_and_the_fix_names_the_partition():
    rec = slurm.queue_record("10", slurm.parse_scontrol(BEHIND), 100.0)
    assert (rec["state"], rec["reason"]) == ("queued", "Priority")
    assert "squeue -p gpu" in rec["fix"] and "queue_timeout" in rec["fix"]
    assert "scontrol show job 11 (Reason)" in slurm.queue_fix("BeginTime", "11", "gpu")


def test_a_running_job_has_started_and_stays_started():
    rec = slurm.queue_record("8", slurm.parse_scontrol(RUNNING), 100.0, started=130.0)
    assert (rec["state"], rec["started"], rec["label"]) == ("started", 130.0, "RUNNING")
    # Requeued after it ran: not a queue wait again (the job agent stops a requeued run itself).
    assert slurm.queue_record("8", slurm.parse_scontrol(BEHIND), 100.0, started=130.0)["state"] == "started"


def test_the_job_agent_writes_the_queue_record_when_it_changes(tmp_path, monkeypatch):
    (tmp_path / "control").mkdir()
    job = slurm.Job(slurm.parse_args(["job", "--run-dir", str(tmp_path), "--host", "coord"]))
    job.job_id, job.submitted = "8", 100.0
    job.info = slurm.parse_scontrol(HELD)
    job.note_queue()
    rec = json.loads((tmp_path / "control" / "queue.json").read_text())
    assert rec["state"] == "queued" and rec["reason"] == "JobHeldUser"
    monkeypatch.setattr(slurm.time, "time", lambda: 150.0)
    job.info = slurm.parse_scontrol(RUNNING)
    job.note_queue()
    assert json.loads((tmp_path / "control" / "queue.json").read_text())["started"] == 150.0


def test_the_rank_shims_three_options_are_required():
    argv = ["--run-dir", "/d", "--master-addr=10.0.0.1", "--master-port", "29500"]
    assert slurm_rank.parse_args(argv) == {"run_dir": "/d", "master_addr": "10.0.0.1", "master_port": "29500"}
    for bad in (argv[:3], argv + ["--extra"], []):
        with pytest.raises(SystemExit):
            slurm_rank.parse_args(bad)
