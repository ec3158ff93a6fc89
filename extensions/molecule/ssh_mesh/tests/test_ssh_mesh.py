"""The mesh really works: every node reaches every node over ssh with host key checking on."""
NODES = {"mndsm-ssh-coord": "coord", "mndsm-ssh-worker1": "worker1", "mndsm-ssh-worker2": "worker2"}
# podman exec straight into the nodes (much faster than an ansible run per command).
testinfra_hosts = ["podman://%s" % name for name in NODES]
KEY = "/root/.ssh/id_ed25519_cluster"


def test_key_files_are_private(host):
    key = host.file(KEY)
    assert key.exists and key.user == "root" and key.mode == 0o600
    assert host.file(KEY + ".pub").mode == 0o644
    assert host.file("/root/.ssh").mode == 0o700
    assert host.file("/root/.ssh/config").mode == 0o600


def test_authorized_key_is_restricted_to_cluster_addresses(host):
    lines = [line for line in host.file("/root/.ssh/authorized_keys").content_string.splitlines()
             if "multinode-deepspeed cluster" in line]
    assert len(lines) == 1, lines
    assert lines[0].startswith('from="'), lines[0]
    allowed = lines[0].split('"')[1].split(",")
    for name in NODES:
        res = host.run("getent ahostsv4 %s", name)
        assert res.rc == 0, res.stderr
        assert res.stdout.split()[0] in allowed, (name, allowed)
    assert "*" not in allowed and "0.0.0.0/0" not in allowed


def test_host_key_checking_is_never_disabled(host):
    config = host.file("/root/.ssh/config").content_string
    assert "StrictHostKeyChecking yes" in config
    assert "StrictHostKeyChecking no" not in config
    known = host.file("/etc/ssh/ssh_known_hosts").content_string
    for name in NODES.values():
        assert any(line.split()[0].split(",")[0] == name or name in line.split()[0].split(",")
                   for line in known.splitlines() if line.strip()), name


def test_ssh_to_every_node_itself_included(host):
    for name in NODES.values():
        res = host.run("ssh -o BatchMode=yes %s hostname", name)
        assert res.rc == 0, res.stderr
        assert res.stdout.strip() == name


def test_unknown_host_key_is_refused(host):
    # Without the known_hosts the role wrote, ssh must refuse: checking is on.
    res = host.run("ssh -o BatchMode=yes -o UserKnownHostsFile=/dev/null -o GlobalKnownHostsFile=/dev/null "
                   "worker1 true")
    assert res.rc != 0
    assert "Host key verification failed" in res.stderr


def test_pdsh_fans_out_from_the_coordinator(host):
    if host.backend.get_hostname() != "mndsm-ssh-coord":
        return
    res = host.run("PDSH_RCMD_TYPE=ssh pdsh -w coord,worker1,worker2 hostname")
    assert res.rc == 0, res.stderr
    got = sorted(line.split(": ", 1)[1] for line in res.stdout.splitlines())
    assert got == ["coord", "worker1", "worker2"]
