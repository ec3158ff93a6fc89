"""A finished run stays finished (issue 44, point 5): what a run leaves running after its launcher exited (on a
watcher: after DONE) gets a short grace, is stopped and is named (``left_pids``), never the run's failure; and the
agent never waits for it without bound."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from multinode_ds import agent

GRACE = 1.0
# A launcher that starts a child in a session of its own (as a daemon, a tracker's sidecar would) and exits
# with the code given; the child carries the run's marker, as every process the launcher starts does.
LEAVES_CHILD = ("import subprocess, sys\n"
                "subprocess.Popen(['sleep', sys.argv[1]], start_new_session=True, stdout=subprocess.DEVNULL)\n"
                "sys.exit(int(sys.argv[2]))\n")


def run_dir(tmp_path, name):
    d = tmp_path / "runs" / name
    (d / "control").mkdir(parents=True)
    (d / "control" / "lease").write_text("%f\n" % time.time())
    return d


def alive(pid):
    """Whether ``pid`` runs (a zombie does not: nothing reaps an orphan here but init)."""
    try:
        with open("/proc/%d/stat" % pid) as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def main(d, *argv):
    previous = signal.getsignal(signal.SIGTERM)
    try:
        return agent.main(["--run-dir", str(d), "--host", "n1", "--interval", "0.2", "--lease-timeout", "137",
                           "--leftover-grace", str(GRACE), *argv])
    finally:
        signal.signal(signal.SIGTERM, previous)


def beat(d):
    return json.loads((d / "nodes" / "n1.json").read_text())


@pytest.fixture(name="cleanup")
def cleanup_fixture():
    """Kills what a test's run left if the agent did not (so that a failing test leaves nothing behind)."""
    ids = []
    yield ids.append
    for run_id in ids:
        for pid in agent.run_pids(run_id):
            os.kill(pid, signal.SIGKILL)


def test_a_child_left_by_a_launcher_that_exited_0_is_stopped_after_the_grace_and_named(tmp_path, cleanup):
    d = run_dir(tmp_path, "left-ok-%d" % os.getpid())
    cleanup(d.name)
    t0 = time.time()
    rc = main(d, "--", sys.executable, "-c", LEAVES_CHILD, "300", "0")
    took = time.time() - t0
    assert rc == 0 and GRACE <= took < GRACE + 5, took
    final = beat(d)
    assert final["state"] == "finished" and final["reason"] == "finished" and final["exit_code"] == 0
    [left] = final["left_pids"]
    assert left["cmd"] == "sleep 300" and left["stopped"] is True and final["pids"] == []
    assert not alive(left["pid"]) and agent.run_pids(d.name) == []
    assert not (d / "control" / "ABORT").exists()  # never the run's failure


def test_a_child_that_ends_within_the_grace_is_neither_stopped_nor_named(tmp_path, cleanup):
    d = run_dir(tmp_path, "left-brief-%d" % os.getpid())
    cleanup(d.name)
    t0 = time.time()
    assert main(d, "--", sys.executable, "-c", LEAVES_CHILD, "0.3", "0") == 0
    assert time.time() - t0 < GRACE + 1.5 and beat(d)["left_pids"] == []


def test_a_child_left_by_a_failed_launcher_is_stopped_with_the_run_and_named(tmp_path, cleanup):
    d = run_dir(tmp_path, "left-failed-%d" % os.getpid())
    cleanup(d.name)
    assert main(d, "--", sys.executable, "-c", LEAVES_CHILD, "300", "3") == 3
    final = beat(d)
    assert final["state"] == "aborted" and [e["cmd"] for e in final["left_pids"]] == ["sleep 300"]
    assert agent.run_pids(d.name) == []
    assert json.loads((d / "control" / "ABORT").read_text())["reason"] == "the launcher on n1 exited with 3"


def test_a_watcher_stops_what_is_left_after_done(tmp_path, cleanup):
    d = run_dir(tmp_path, "left-watch-%d" % os.getpid())
    cleanup(d.name)
    env = dict(os.environ, MULTINODE_DS_RUN_ID=d.name)
    stray = subprocess.Popen(["sleep", "300"], env=env, start_new_session=True)
    try:
        (d / "control" / "DONE").write_text("1\n")
        t0 = time.time()
        assert main(d) == 0 and time.time() - t0 < GRACE + 5
        assert stray.wait(5) == -signal.SIGTERM
        assert beat(d)["left_pids"] == [{"pid": stray.pid, "cmd": "sleep 300", "stopped": True}]
    finally:
        if stray.poll() is None:
            stray.kill()


def test_a_command_line_is_kept_short():
    long = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "x" * 500])
    try:
        deadline = time.time() + 10
        text = agent.cmdline(long.pid)
        while "import time" not in text and time.time() < deadline:  # the child may not have exec'd yet
            time.sleep(0.02)
            text = agent.cmdline(long.pid)
        assert len(text) == agent.CMD_CHARS and text.startswith(sys.executable + " -c import time")
        assert text.endswith("xxx...")
    finally:
        long.kill()
        long.wait()
    assert agent.cmdline(long.pid) == ""  # gone


def test_the_heartbeat_names_an_op_being_compiled(tmp_path):
    """Issue 44, point 8: a young build lock under the ranks' TORCH_EXTENSIONS_DIR is an op being compiled."""
    ext = tmp_path / "ext"
    (ext / "cpu_adam").mkdir(parents=True)
    a = agent.Agent.__new__(agent.Agent)
    a.run_env = {"TORCH_EXTENSIONS_DIR": str(ext)}
    assert a.building() == []
    (ext / "cpu_adam" / "lock").write_text("")
    assert [b["op"] for b in a.building()] == ["cpu_adam"]
    a.run_env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "none")}
    assert a.building() == []
