"""An agent never dies leaving ranks behind (issue 26, point 8): its file operations survive a full disk, a stale
NFS handle or an I/O error for a while; past that it stops this node's ranks and says why; SIGTERM stops them
too and takes the secrets file away."""
import errno
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from multinode_ds import agent

ROOT = Path(__file__).resolve().parents[3]
RANK = "import time; time.sleep(60)"
# What the plan passes every agent (backends.Stop.agent_argv).
PLAN = ["--lease-timeout", "137", "--leftover-grace", "5"]


def run_dir(tmp_path, name):
    d = tmp_path / "runs" / name
    (d / "control").mkdir(parents=True)
    (d / "control" / "lease").write_text("%f\n" % time.time())
    return d


def test_file_errors_are_tolerated_for_the_patience_then_named():
    trouble = agent.FileTrouble("w1", 5)
    trouble.failed(OSError(errno.ENOSPC, "No space left on device"), now=100)
    trouble.failed(OSError(errno.ENOSPC, "No space left on device"), now=104)
    trouble.ok()  # the disk took a write again: the count starts over
    trouble.failed(OSError(errno.ESTALE, "Stale file handle"), now=200)
    with pytest.raises(agent.GiveUp) as err:
        trouble.failed(OSError(errno.ESTALE, "Stale file handle"), now=206)
    assert str(err.value).startswith("stale file handle on w1:")
    assert agent.FileTrouble("w2", 0).reason() == "file error on w2: None (for 0s)"


def test_a_full_disk_stops_this_nodes_ranks_and_says_disk_full(tmp_path, monkeypatch, capfd):
    d = run_dir(tmp_path, "full")
    writes = {"n": 0}
    real = agent.write_json

    def write_json(path, data):
        writes["n"] += 1
        if writes["n"] > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(agent, "write_json", write_json)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        t0 = time.time()
        rc = agent.main(["--run-dir", str(d), "--host", "w1", "--interval", "0.1", "--io-patience", "1", *PLAN,
                         "--", sys.executable, "-c", RANK])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert rc == 1 and time.time() - t0 < 20
    assert "disk full on w1: [Errno 28] No space left on device" in capfd.readouterr().err
    assert agent.run_pids("full") == []  # the rank went with it
    assert json.loads((d / "control" / "ABORT").read_text())["reason"].startswith("disk full on w1")


def test_a_stale_lease_file_is_not_the_controller_going_away(tmp_path, monkeypatch):
    d = run_dir(tmp_path, "stale")
    args = agent.parse_args(["--run-dir", str(d), "--host", "w1", "--io-patience", "60", *PLAN])
    a = agent.Agent(args)
    real = Path.stat

    def stat(self, *a, **kw):
        if self.name == "lease":
            raise OSError(errno.ESTALE, "Stale file handle")
        return real(self, *a, **kw)

    monkeypatch.setattr(Path, "stat", stat)
    assert a.lease_stale() is False and a.trouble.since is not None


def test_sigterm_stops_the_ranks_and_removes_the_secrets(tmp_path):
    d = run_dir(tmp_path, "term")
    secrets = tmp_path / "secrets.json"
    secrets.write_text('{"K": "v"}')
    (d / ".deepspeed_env").write_text("MULTINODE_DS_SECRET_ENV=%s\n" % secrets)
    proc = subprocess.Popen([sys.executable, "-m", "multinode_ds.agent", "--run-dir", str(d), "--host", "w1",
                             "--interval", "0.2", *PLAN, "--", sys.executable, "-c", RANK], cwd=ROOT)
    try:
        deadline = time.time() + 20
        while time.time() < deadline and not agent.run_pids("term", exclude={proc.pid}):
            time.sleep(0.2)
        assert agent.run_pids("term", exclude={proc.pid})
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) != 0
        assert agent.run_pids("term") == [] and not secrets.exists()
        assert "was stopped (signal 15)" in json.loads((d / "control" / "ABORT").read_text())["reason"]
    finally:
        if proc.poll() is None:
            proc.kill()
