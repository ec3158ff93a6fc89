import ipaddress
import os
import resource
import socket
import subprocess
import time

import pytest

from ansible_collections.multinode.deepspeed.plugins.modules import node_probe

# An ssh stand-in: the target is the argument before the remote command.  It records its arguments.
FAKE_SSH = """#!/bin/sh
echo "$@" >> "%(log)s"
prev=""; last=""
for a in "$@"; do prev="$last"; last="$a"; done
case "$prev" in
  good) echo unlimited; exit 0 ;;
  bad) echo "ssh: connect to host bad port 22: Connection refused" >&2; exit 255 ;;
esac
echo "unexpected target $prev" >&2
exit 3
"""


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "ssh-args.log"
    ssh = bindir / "ssh"
    ssh.write_text(FAKE_SSH % {"log": log})
    ssh.chmod(0o755)
    monkeypatch.setenv("PATH", "%s%s%s" % (bindir, os.pathsep, os.environ.get("PATH", "")))
    return log


def test_plain_probe_reads_the_node(tmp_path, run_module):
    before = time.time()
    res = run_module(node_probe, {"names": ["localhost"], "paths": [str(tmp_path)]})
    after = time.time()
    assert res["changed"] is False and not res.get("failed")
    assert res["hostname"] == socket.gethostname() and res["user"]
    assert before <= res["time"] <= after
    assert res["ssh"] == {}
    # The module alone does not bracket the clock: the action plugin adds that.
    assert "controller_before" not in res


def test_localhost_resolves_to_loopback(run_module):
    res = run_module(node_probe, {"names": ["localhost"]})
    addrs = res["resolved"]["localhost"]["addresses"]
    assert addrs and all(ipaddress.ip_address(a).is_loopback for a in addrs)
    assert len(addrs) == len(set(addrs))        # each address once, whatever the socket types


def test_unresolvable_name_gives_an_error(run_module):
    res = run_module(node_probe, {"names": ["no-such-host.invalid", "localhost"]})
    bad = res["resolved"]["no-such-host.invalid"]
    assert set(bad) == {"error"} and bad["error"]
    assert "addresses" in res["resolved"]["localhost"]


def test_resolve_keeps_getaddrinfo_order_without_duplicates(monkeypatch):
    infos = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.89.0.4", 0)),
             (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::4", 0, 0, 0)),
             (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.89.0.4", 0))]
    monkeypatch.setattr(node_probe.socket, "getaddrinfo", lambda *a: infos)
    assert node_probe.resolve("worker2") == {"addresses": ["10.89.0.4", "fd00::4"]}


def test_disk_of_a_directory_and_of_a_missing_path(tmp_path, run_module):
    missing = tmp_path / "not-there"
    res = run_module(node_probe, {"paths": [str(tmp_path), str(missing)]})
    here = res["disk"][str(tmp_path)]
    assert here["free_bytes"] > 0 and here["total_bytes"] >= here["free_bytes"]
    st = os.statvfs(str(tmp_path))
    assert here["total_bytes"] == st.f_blocks * st.f_frsize
    gone = res["disk"][str(missing)]
    assert set(gone) == {"error"}
    assert str(missing) in gone["error"] and "No such file or directory" in gone["error"]


def test_memlock_is_the_process_limit_in_kib(run_module):
    res = run_module(node_probe, {})
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    mem = res["memlock"]
    assert isinstance(mem["soft"], int) and isinstance(mem["hard"], int)
    assert mem["soft"] == (-1 if soft == resource.RLIM_INFINITY else soft // 1024)
    assert mem["hard"] == (-1 if hard == resource.RLIM_INFINITY else hard // 1024)


def test_kib():
    assert node_probe.kib(resource.RLIM_INFINITY) == -1
    assert node_probe.kib(8388608) == 8192 and node_probe.kib(1023) == 0


def test_ssh_to_targets(fake_ssh, run_module):
    res = run_module(node_probe, {"ssh_targets": ["good", "bad"], "ssh_timeout": 3})
    good, bad = res["ssh"]["good"], res["ssh"]["bad"]
    assert (good["rc"], good["stdout"], good["stderr"]) == (0, "unlimited", "")
    assert (bad["rc"], bad["stdout"]) == (255, "")
    assert bad["stderr"] == "ssh: connect to host bad port 22: Connection refused"
    assert good["seconds"] >= 0 and bad["seconds"] >= 0
    calls = sorted(fake_ssh.read_text().splitlines())
    assert calls == ["-o BatchMode=yes -o ConnectTimeout=3 -o LogLevel=ERROR bad ulimit -l",
                     "-o BatchMode=yes -o ConnectTimeout=3 -o LogLevel=ERROR good ulimit -l"]


def test_ssh_missing_is_exit_127(tmp_path, monkeypatch, run_module):
    monkeypatch.setenv("PATH", str(tmp_path))
    res = run_module(node_probe, {"ssh_targets": ["worker1"]})
    assert res["ssh"]["worker1"]["rc"] == 127 and "cannot run ssh" in res["ssh"]["worker1"]["stderr"]


def test_ssh_hanging_is_exit_124(monkeypatch):
    def hang(cmd, **kwargs):
        assert kwargs["timeout"] == 15
        raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])
    monkeypatch.setattr(node_probe.subprocess, "run", hang)
    out = {}
    node_probe.ssh_one("worker1", 5, out)
    assert out["worker1"]["rc"] == 124 and out["worker1"]["stdout"] == ""
    assert out["worker1"]["stderr"] == "ssh worker1: timed out after 15 s"
    assert "seconds" in out["worker1"]


def test_check_mode_reads_too(tmp_path, run_module):
    res = run_module(node_probe, {"paths": [str(tmp_path)], "_ansible_check_mode": True})
    assert res["changed"] is False and res["disk"][str(tmp_path)]["free_bytes"] > 0


def test_unknown_option_fails(run_module):
    res = run_module(node_probe, {"hosts": ["w1"]})
    assert res["failed"] is True and "hosts" in res["msg"]
