"""run_summary's message (run/collected.message): what the playbook says at the end of a run (pure function)."""
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.collected import message

REPORT, PATH = "runs/r1/report.md", "runs/r1/summary.json"


def success(**kw):
    summary = {"run_id": "r1", "status": "success", "problems": [], "world_size": 3,
               "hosts": {"worker2": [2], "worker1": [0, 1]}, "first_loss": 10.4567, "last_loss": 2.25,
               "steps": 30, "wall_time": 42.4}
    summary.update(kw)
    return summary


def test_success_with_loss():
    lines = message(success(), REPORT, PATH).splitlines()
    assert lines == ["Run r1: world size 3 on worker1 ranks [0, 1], worker2 ranks [2]",
                     "Loss 10.457 -> 2.250 in 30 steps, 42 s",
                     "Report: runs/r1/report.md",
                     "Summary: runs/r1/summary.json"]


def test_success_with_a_user_script():
    text = message(success(first_loss=None, last_loss=None, steps=None, entrypoint="/shared/train.py",
                           wall_time=7.2), REPORT, PATH)
    lines = text.splitlines()
    assert lines[1] == "/shared/train.py finished on every rank in 7 s"
    assert "Loss" not in text
    assert lines[-2:] == ["Report: %s" % REPORT, "Summary: %s" % PATH]


def test_success_without_hosts_names_the_hostfile_and_no_time():
    text = message(success(hosts={}, hostfile="worker1 slots=1\nworker2 slots=1\n", first_loss=None,
                           entrypoint="/x.py", wall_time=None), REPORT, PATH)
    assert text.splitlines()[0] == "Run r1: world size 3 on worker1 slots=1"
    assert "/x.py finished on every rank in 0 s" in text


def test_failure_with_failure_and_diagnosis():
    summary = {"run_id": "r2", "status": "failed", "wall_time": 12.0,
               "problems": ["rank 1 on worker2 exited with 1", "rank 1 wrote no final record"],
               "failure": {"rank": 1, "host": "worker2", "exit_code": 1, "log": "logs/worker2_rank1.log",
                           "last_lines": "Traceback (most recent call last):\nRuntimeError: CUDA out of memory"},
               "diagnosis": [{"id": "cuda_oom", "cause": "a rank ran out of GPU memory.",
                              "remedy": "use a smaller model or ZeRO stage 3."},
                             {"id": "nccl_timeout", "cause": "NCCL timed out.", "remedy": "check the network."}]}
    text = message(summary, REPORT, PATH)
    lines = text.splitlines()
    assert lines[0] == "Run r2 failed: rank 1 on worker2 exited with 1; rank 1 wrote no final record"
    assert "Failed first: rank 1 on worker2, exit code 1" in lines
    assert "Last lines of logs/worker2_rank1.log:" in lines
    assert "RuntimeError: CUDA out of memory" in lines
    assert "Diagnosis (cuda_oom): a rank ran out of GPU memory. Fix: use a smaller model or ZeRO stage 3." in lines
    assert "Diagnosis (nccl_timeout): NCCL timed out. Fix: check the network." in lines
    assert lines[-1] == "Report: %s" % REPORT
    # Order: outcome, the first failure, its log, the diagnoses, the report.
    assert lines.index("Failed first: rank 1 on worker2, exit code 1") < lines.index(
        "Diagnosis (cuda_oom): a rank ran out of GPU memory. Fix: use a smaller model or ZeRO stage 3.")
    assert "Loss" not in text and "world size" not in text


def test_failure_without_failure_or_diagnosis():
    summary = {"run_id": "r3", "status": "failed", "problems": ["the run was aborted by coord: lease expired"],
               "failure": None, "diagnosis": [], "first_loss": 1.0, "last_loss": 0.5}
    assert message(summary, REPORT, PATH).splitlines() == [
        "Run r3 failed: the run was aborted by coord: lease expired", "Report: %s" % REPORT]


def test_failure_without_last_lines_has_no_log_section():
    summary = {"run_id": "r4", "status": "failed", "problems": ["x"],
               "failure": {"rank": 0, "host": "w1", "exit_code": -9}}
    text = message(summary, REPORT, PATH)
    assert "Failed first: rank 0 on w1, exit code -9" in text and "Last lines" not in text
