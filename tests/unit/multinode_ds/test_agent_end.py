"""When the agent ends a run on its node, and why: the launcher's failure and a failed rank abort the run
everywhere; an ABORT, a stale lease, the run's timeout or the run's end stop the agent's loop."""
import json
import os
import time

from multinode_ds import agent


def make(tmp_path, *argv):
    run_dir = tmp_path / "runs" / "run-e"
    (run_dir / "control").mkdir(parents=True)
    (run_dir / "nodes").mkdir()
    (run_dir / "control" / "lease").write_text("%f\n" % time.time())
    return agent.Agent(agent.parse_args(["--run-dir", str(run_dir), "--host", "n1", "--lease-timeout", "137",
                                         "--leftover-grace", "5", *argv]))


def abort_record(a):
    with open(a.control / "ABORT") as fh:
        record = json.load(fh)
    record.pop("time")
    return record


def test_a_watcher_goes_on_until_done(tmp_path):
    """What the run left running then is not waited for without bound (the agent's settle stops it)."""
    a = make(tmp_path)
    assert a.end_reason(None) is None
    (a.control / "DONE").write_text("1\n")
    assert a.end_reason(None) == "finished"


def test_a_launcher_ends_when_it_exited(tmp_path):
    a = make(tmp_path, "--", "true")
    a.child = object()  # started
    assert a.end_reason(None) is None
    assert a.end_reason(0) == "finished"


def test_an_abort_record_ends_it_first(tmp_path):
    a = make(tmp_path)
    (a.control / "DONE").write_text("1\n")
    (a.control / "ABORT").write_text('{"reason": "a rank on n2 exited with -9"}')
    assert a.end_reason(None) == "aborted"


def test_a_stale_lease_aborts_the_run(tmp_path):
    a = make(tmp_path, "--lease-timeout", "30")
    os.utime(a.control / "lease", (time.time() - 60, time.time() - 60))
    assert a.end_reason(None) == "the controller stopped watching (lease expired)"
    assert abort_record(a) == {"reason": "the controller stopped watching (lease expired)", "host": "n1"}


def test_the_runs_timeout_aborts_the_run(tmp_path):
    a = make(tmp_path, "--max-time", "600")
    a.started -= 601
    assert a.end_reason(None) == "the run exceeded its timeout of 600s"
    assert abort_record(a) == {"reason": "the run exceeded its timeout of 600s", "host": "n1"}


def test_a_failed_launcher_aborts_the_run_once(tmp_path):
    a = make(tmp_path, "--", "true")
    a.note_failure(3)
    a.note_failure(5)
    assert a.state["exit_code"] == 3
    assert abort_record(a) == {"reason": "the launcher on n1 exited with 3", "host": "n1", "exit_code": 3}


def test_a_failed_rank_in_the_launchers_log_aborts_the_run(tmp_path):
    a = make(tmp_path, "--", "true")
    line = "[ERROR] [launch.py:259:sigkill_handler] ['python', '--local_rank=1'] exits with return code = -9"
    a.log_path.write_text("rank 1 step 3\n%s\n" % line)
    a.note_failure(None)
    assert a.state["exit_code"] is None and a.state["failed_line"] == line
    assert abort_record(a) == {"reason": "a rank on n1 exited with -9", "host": "n1", "exit_code": -9, "line": line}


# pdsh's own output (the coordinator's launcher log of a real run whose worker2 refused SSH).
PDSH_NO_LOGIN = ("worker2: ssh: connect to host 10.89.0.12 port 22: Connection refused\n"
                 "pdsh@coord: worker2: ssh exited with exit code 255\n")
# A rank killed on worker2 (a real run): DeepSpeed's launcher says so, then pdsh gives its node's exit.
PDSH_RANK_KILLED = (
    "worker2: [2026-11-26 16:55:25,672] [INFO] [launch.py:253:sigkill_handler] Killing subprocess 5064\n"
    "worker2: [2026-11-26 16:55:25,672] [ERROR] [launch.py:259:sigkill_handler] ['/opt/multinode-deepspeed/venv/bin/"
    "python3', '-u', '-m', 'multinode_ds.rank', '--local_rank=0', '--run-dir', '/shared/runs/e2e-kill-1795712116'] "
    "exits with return code = -9\n"
    "pdsh@coord: worker2: ssh exited with exit code 247\n")


def test_a_node_pdsh_could_not_log_in_to_aborts_the_run_naming_it_lost(tmp_path):
    a = make(tmp_path, "--", "pdsh")
    a.log_path.write_text(PDSH_NO_LOGIN)
    a.note_failure(None)
    why = "worker2: ssh: connect to host 10.89.0.12 port 22: Connection refused"
    assert a.state["failed_line"] == why
    assert abort_record(a) == {"reason": "the launch on worker2 ended with 255 (%s)" % why, "host": "n1",
                               "exit_code": 255, "line": why, "node": "worker2", "lost": ["worker2"]}


def test_a_nodes_command_that_failed_there_aborts_the_run_naming_the_node_not_lost(tmp_path):
    a = make(tmp_path, "--", "pdsh")
    why = "worker1: sh: 1: .: cannot open /shared/runs/r/.deepspeed_env: No such file"
    # Read in two pieces, as the agent reads a growing log: the node's line, then pdsh's.
    a.log_path.write_text(why + "\n")
    a.note_failure(None)
    assert not (a.control / "ABORT").exists()
    with open(a.log_path, "a") as fh:
        fh.write("pdsh@coord: worker1: ssh exited with exit code 2\n")
    a.note_failure(None)
    assert abort_record(a) == {"reason": "the launch on worker1 ended with 2 (%s)" % why, "host": "n1",
                               "exit_code": 2, "line": why, "node": "worker1"}


def test_a_failed_rank_comes_before_pdshs_line_for_its_node(tmp_path):
    a = make(tmp_path, "--", "pdsh")
    a.log_path.write_text(PDSH_RANK_KILLED)
    a.note_failure(None)
    record = abort_record(a)
    assert record["reason"] == "a rank on n1 exited with -9" and "node" not in record and "lost" not in record


def test_pdshs_line_for_a_node_that_ended_well_is_no_failure(tmp_path):
    a = make(tmp_path, "--", "pdsh")
    a.log_path.write_text("worker1: done\npdsh@coord: worker1: ssh exited with exit code 0\n")
    a.note_failure(None)
    assert not (a.control / "ABORT").exists() and a.state["failed_line"] is None


def timed_pause(a, after=None, delay=0.3):
    """Seconds one pause took, with ``after`` run ``delay`` seconds into it (in a thread)."""
    import threading
    if after is not None:
        threading.Timer(delay, after).start()
    t0 = time.monotonic()
    a.pause()
    return time.monotonic() - t0


def test_a_pause_is_one_heartbeat_unless_something_happens(tmp_path):
    a = make(tmp_path, "--interval", "4")
    assert timed_pause(a) >= 4
    # A watcher wakes when DONE appears, not at its next beat; DONE already there does not make it spin.
    assert timed_pause(a, lambda: (a.control / "DONE").write_text("1\n")) < 3
    assert timed_pause(a) >= 4
    assert timed_pause(a, lambda: (a.control / "ABORT").write_text("{}")) < 3


def test_a_launcher_wakes_when_its_launcher_exits(tmp_path):
    import subprocess
    import sys
    a = make(tmp_path, "--interval", "5")
    a.child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    assert timed_pause(a) < 4 and a.child.poll() == 0
    # A launcher does not wait for DONE (the controller writes it for the watchers).
    a.child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert timed_pause(a, lambda: (a.control / "DONE").write_text("1\n"), 0.2) >= 5
    finally:
        a.child.kill()
        a.child.wait()
