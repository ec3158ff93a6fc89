"""Nothing of the agent waits on the shared directory without bound (issue 44, points 7 and 14): a file operation
that hangs (a hard NFS mount whose server is gone) is given up after --io-patience, the node's ranks are stopped from
what the agent knows locally, and it says why; its own start (mkdirs, .deepspeed_env, the launcher's log) is guarded
as every other file operation is; and whoever waits for it to watch (pdsh's command) hears whether it does."""
import errno
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from multinode_ds import agent

from test_agent_files import PLAN, RANK, ROOT, run_dir  # the same run directory and agent options


def main(d, *argv):
    previous = signal.getsignal(signal.SIGTERM)
    try:
        return agent.main(["--run-dir", str(d), "--host", "w1", "--interval", "0.1", "--io-patience", "1", *PLAN,
                           *argv])
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_heartbeat_that_hangs_stops_the_ranks_within_the_deadline_and_says_why(tmp_path, monkeypatch, capfd):
    d = run_dir(tmp_path, "hung-%d" % os.getpid())
    release = threading.Event()
    writes = {"n": 0}
    real = agent.write_json

    def write_json(path, data):
        writes["n"] += 1
        if writes["n"] > 3:
            release.wait(60)  # the mount hangs: the call does not return, and no error comes
        real(path, data)

    monkeypatch.setattr(agent, "write_json", write_json)
    try:
        t0 = time.time()
        rc = main(d, "--", sys.executable, "-c", RANK)
        took = time.time() - t0
        assert rc == 1 and took < 1 + 3 + 3 + 2, took  # the deadline, the kill sequence's two waits, a margin
        assert agent.run_pids(d.name) == []  # the rank went, found through /proc
        err = capfd.readouterr().err
        assert "writing the heartbeat on w1 did not return within 1s (a hung shared directory?); stopping this " \
               "node's ranks" in err, err
    finally:
        release.set()
        for pid in agent.run_pids(d.name):
            os.kill(pid, signal.SIGKILL)


def test_a_call_past_its_deadline_marks_the_directory_hung_and_asks_nothing_more_of_it():
    io = agent.SharedIO("w1", 0.2)
    gate = threading.Event()
    try:
        assert io.call("reading", lambda: 7) == 7
        try:
            io.call("looking for control/ABORT", gate.wait, 30)
            raise AssertionError("no Hung")
        except agent.Hung as exc:
            assert str(exc) == "looking for control/ABORT on w1 did not return within 0s (a hung shared directory?)"
        t0 = time.time()
        try:
            io.call("reading", lambda: 7)
            raise AssertionError("no Hung")
        except agent.Hung:
            assert time.time() - t0 < 0.1
    finally:
        gate.set()


def test_errors_are_the_callers(tmp_path):
    io = agent.SharedIO("w1", 5)
    try:
        io.call("reading", os.stat, tmp_path / "none")
        raise AssertionError("no error")
    except FileNotFoundError:
        pass
    assert io.stuck is None


def test_the_run_directory_that_cannot_be_created_is_named_and_nothing_starts(tmp_path, monkeypatch, capfd):
    d = run_dir(tmp_path, "nomkdir")
    real = Path.mkdir

    def mkdir(self, *a, **kw):
        if self.name == "nodes":
            raise OSError(errno.EIO, "Input/output error")
        return real(self, *a, **kw)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    t0 = time.time()
    assert main(d, "--", sys.executable, "-c", RANK) == 1 and time.time() - t0 < 6
    err = capfd.readouterr().err
    assert "creating the run's nodes/ and control/ on w1 failed: [Errno 5] Input/output error" in err
    assert "I/O error on w1: [Errno 5] Input/output error (for 1s); stopping this node's ranks" in err
    assert agent.run_pids("nomkdir") == []


def test_an_unreadable_deepspeed_env_is_named_and_the_launcher_never_starts(tmp_path, capfd):
    d = run_dir(tmp_path, "noenv")
    (d / ".deepspeed_env").mkdir()  # read_env_file: IsADirectoryError
    marker = tmp_path / "started"
    assert main(d, "--", sys.executable, "-c", "open(%r, 'w')" % str(marker)) == 1
    assert "reading .deepspeed_env on w1 failed: [Errno 21] Is a directory" in capfd.readouterr().err
    assert not marker.exists()
    assert json.loads((d / "nodes" / "w1.json").read_text())["state"] == "aborted"


def test_a_launchers_log_that_cannot_be_opened_is_named(tmp_path, monkeypatch, capfd):
    d = run_dir(tmp_path, "nolog")

    def start(*a):
        raise OSError(errno.ESTALE, "Stale file handle")

    monkeypatch.setattr(agent, "_start", start)
    assert main(d, "--", sys.executable, "-c", RANK) == 1
    err = capfd.readouterr().err
    assert "starting the launcher (its log, the run directory) on w1 failed: [Errno 116] Stale file handle" in err
    assert "stale file handle on w1" in json.loads((d / "control" / "ABORT").read_text())["reason"]


def ready_word(d, *argv):
    """What an agent started with --ready-fd writes to it before it closes it (its run: a launcher of 0.5 s)."""
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "multinode_ds.agent", "--run-dir", str(d), "--host", "w1",
                             "--interval", "0.2", *PLAN, "--ready-fd", str(w), *argv,
                             "--", sys.executable, "-c", "import time; time.sleep(0.5)"],
                            cwd=ROOT, pass_fds=(w,), stderr=subprocess.DEVNULL)
    os.close(w)
    with os.fdopen(r, "rb") as fh:
        word = fh.read()  # to its end: the agent closed it (or exited)
    proc.wait(20)
    return word, proc.returncode


def test_the_agent_says_ready_once_it_watches_and_nothing_when_it_does_not(tmp_path):
    d = run_dir(tmp_path, "ready")
    assert ready_word(d) == (b"ready\n", 0)
    assert json.loads((d / "nodes" / "w1.json").read_text())["state"] == "finished"
    d = run_dir(tmp_path, "aborted")
    (d / "control" / "ABORT").write_text("{}")
    assert ready_word(d) == (b"", 1)
