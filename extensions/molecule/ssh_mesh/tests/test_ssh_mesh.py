"""The mesh really works, and holds no more than it needs: the run's non-root account with one uid everywhere; a
private key only on the login node (the coordinator), authorized on every node from its addresses only; every node
reachable from it over ssh with host key checking on, and no login from a worker to another node."""
import os
import subprocess
from pathlib import Path

NODES = {"mndsm-ssh-coord": "coord", "mndsm-ssh-worker1": "worker1", "mndsm-ssh-worker2": "worker2"}
# podman exec straight into the nodes (much faster than an ansible run per command).
testinfra_hosts = ["podman://%s" % name for name in NODES]
USER = "deepspeed"
HOME = "/home/deepspeed"
KEY = HOME + "/.ssh/id_ed25519_cluster"


def is_coord(host):
    return host.backend.get_hostname() == "mndsm-ssh-coord"


def test_the_run_user_is_not_root_and_has_one_uid(host):
    user = host.user(USER)
    assert user.exists and user.uid == 2000 and user.home == HOME


def test_only_the_login_node_holds_a_private_key(host):
    key = host.file(KEY)
    if is_coord(host):
        assert key.exists and key.user == USER and key.mode == 0o600
        assert host.file(KEY + ".pub").mode & 0o022 == 0
        assert host.file(HOME + "/.ssh/config").mode == 0o600
    else:
        assert not key.exists and not host.file(KEY + ".pub").exists
        assert not host.file(HOME + "/.ssh/config").exists
    assert host.file(HOME + "/.ssh").mode == 0o700 and host.file(HOME + "/.ssh").user == USER


def test_authorized_key_is_the_coordinators_from_its_addresses(host):
    lines = [line for line in host.file(HOME + "/.ssh/authorized_keys").content_string.splitlines()
             if "multinode-deepspeed cluster" in line]
    assert len(lines) == 1 and lines[0].endswith("multinode-deepspeed cluster mndsm-ssh-coord"), lines
    assert lines[0].startswith('from="'), lines[0]
    allowed = lines[0].split('"')[1].split(",")
    assert host.run("getent ahostsv4 mndsm-ssh-coord").stdout.split()[0] in allowed
    for worker in ("mndsm-ssh-worker1", "mndsm-ssh-worker2"):
        assert host.run("getent ahostsv4 %s", worker).stdout.split()[0] not in allowed, (worker, allowed)
    assert ("127.0.0.1" in allowed) == is_coord(host)
    assert "*" not in allowed and "0.0.0.0/0" not in allowed


def test_host_key_checking_is_never_disabled(host):
    if is_coord(host):
        config = host.file(HOME + "/.ssh/config").content_string
        assert "StrictHostKeyChecking yes" in config and "StrictHostKeyChecking no" not in config
    known = host.file("/etc/ssh/ssh_known_hosts").content_string
    for name in NODES.values():
        assert any(name in line.split()[0].split(",") for line in known.splitlines() if line.strip()), name


def test_ssh_from_the_coordinator_to_every_node_and_from_no_worker(host):
    for name in NODES.values():
        res = host.run("su -s /bin/sh %s -c 'ssh -o BatchMode=yes -o ConnectTimeout=5 %s hostname'", USER, name)
        if is_coord(host):
            assert res.rc == 0, res.stderr
            assert res.stdout.strip() == name
        else:
            assert res.rc != 0, (host.backend.get_hostname(), name)


def test_unknown_host_key_is_refused(host):
    if not is_coord(host):
        return
    # Without the known_hosts the role wrote, ssh must refuse: checking is on.
    res = host.run("su -s /bin/sh %s -c 'ssh -o BatchMode=yes -o UserKnownHostsFile=/dev/null "
                   "-o GlobalKnownHostsFile=/dev/null worker1 true'", USER)
    assert res.rc != 0
    assert "Host key verification failed" in res.stderr


def test_pdsh_fans_out_from_the_coordinator(host):
    if not is_coord(host):
        return
    res = host.run("su -s /bin/sh %s -c 'PDSH_RCMD_TYPE=ssh pdsh -w coord,worker1,worker2 hostname'", USER)
    assert res.rc == 0, res.stderr
    got = sorted(line.split(": ", 1)[1] for line in res.stdout.splitlines())
    assert got == ["coord", "worker1", "worker2"]


def test_a_node_that_failed_earlier_is_named_not_a_missing_host_key(host):
    """A node that failed a task before the role: every other node's play names it and says to fix its error first
    (it used to fail on an attribute of the failed node that was never read)."""
    if not is_coord(host):
        return
    playbook = Path(__file__).resolve().parents[1] / "failed_node.yml"
    proc = subprocess.run(["ansible-playbook", "-i", os.environ["MOLECULE_INVENTORY_FILE"], str(playbook)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    flat = " ".join(proc.stdout.split())
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "mndsm-ssh-worker2: no host key read in this play" in flat, proc.stdout[-3000:]
    assert "that node's error first" in flat and "HostVarsVars" not in flat
    # The nodes left still hold their mesh.
    assert host.run("su -s /bin/sh %s -c 'ssh -o BatchMode=yes mndsm-ssh-worker1 hostname'", USER).rc == 0
