"""The watch's dead man's switch: an SSH session of its own whose remote end writes the run's ABORT when the
watch's process says why, or goes away; nothing when the watch ended as it should."""
import json
import os
import stat

import pytest

from ansible_collections.multinode.deepspeed.plugins.action import watch


class FakeConnection(object):
    transport = "ssh"

    def __init__(self, ssh, prefix=()):
        self.ssh, self.prefix, self.built = ssh, list(prefix), None

    def get_option(self, name):
        return {"host": "coord", "ssh_executable": self.ssh}.get(name)

    def _build_command(self, binary, subsystem, host, cmd):
        self.built = self.prefix + [binary.encode(), b"-o", b"ControlMaster=auto", b"-o", b"ControlPath=/cp/x",
                                    host.encode(), cmd.encode()]
        return self.built


def action(conn):
    module = watch.ActionModule.__new__(watch.ActionModule)
    module._connection = conn
    return module


@pytest.fixture
def fake_ssh(tmp_path):
    """An 'ssh' that ignores its options and runs the remote command here."""
    path = tmp_path / "bin" / "ssh"
    path.parent.mkdir()
    path.write_text('#!/bin/sh\nfor a; do last="$a"; done\nexec /bin/sh -c "$last"\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def run_dir(tmp_path):
    (tmp_path / "run" / "control").mkdir(parents=True)
    return str(tmp_path / "run")


def test_the_switch_has_a_connection_of_its_own(tmp_path, fake_ssh, monkeypatch):
    seen = {}
    monkeypatch.setattr(watch.subprocess, "Popen", lambda argv, **kw: seen.setdefault("argv", argv))
    conn = FakeConnection(fake_ssh, prefix=[b"sshpass", b"-d", b"12"])
    action(conn)._dead_man_switch(run_dir(tmp_path))
    argv = seen["argv"]
    at = argv.index(fake_ssh.encode())
    # ssh keeps an option's first value: no multiplexing over Ansible's master, whatever Ansible's options say.
    assert argv[:at] == [b"sshpass", b"-d", b"12"]
    assert argv[at + 1:at + 5] == [b"-o", b"ControlMaster=no", b"-o", b"ControlPath=none"]
    # Issue 44, point 6: the session outlasts the agents' lease when the coordinator goes silent (ansible.cfg's
    # ServerAliveCountMax=3 x 15 s dropped it in a 45 s outage, and its remote end aborted the run).
    interval, count = argv[at + 6], argv[at + 8]
    assert interval == b"ServerAliveInterval=15" and count.startswith(b"ServerAliveCountMax=")
    from ansible_collections.multinode.deepspeed.plugins.module_utils.common.lease import lease_timeout
    assert 15 * int(count.split(b"=")[1]) > lease_timeout()


@pytest.mark.parametrize("reason,expected", [
    ("interrupted on the controller", "interrupted on the controller"),
    (None, watch.DEAD_MAN_REASON),  # the watch's process is gone: its end of the pipe closes
    (watch.ENDED, None),
])
def test_the_remote_end_writes_abort_unless_the_watch_ended(tmp_path, fake_ssh, reason, expected):
    rd = run_dir(tmp_path)
    switch = action(FakeConnection(fake_ssh))._dead_man_switch(rd)
    watch.ActionModule._release_switch(switch, wait=10, reason=reason)
    abort = os.path.join(rd, "control", "ABORT")
    if expected is None:
        assert not os.path.exists(abort)
    else:
        with open(abort) as fh:
            record = json.load(fh)
        assert record["reason"] == expected and record["host"] == "controller"


def test_an_abort_already_recorded_is_kept(tmp_path, fake_ssh):
    rd = run_dir(tmp_path)
    with open(os.path.join(rd, "control", "ABORT"), "w") as fh:
        fh.write('{"reason": "a rank failed"}\n')
    switch = action(FakeConnection(fake_ssh))._dead_man_switch(rd)
    watch.ActionModule._release_switch(switch, wait=10, reason="interrupted on the controller")
    with open(os.path.join(rd, "control", "ABORT")) as fh:
        assert json.load(fh)["reason"] == "a rank failed"
