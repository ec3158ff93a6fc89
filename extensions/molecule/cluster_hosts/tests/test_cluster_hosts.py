"""Every node resolves every inventory name and alias to the node's real address, from /etc/hosts alone."""
import testinfra

NODES = ["mndsm-hosts-coord", "mndsm-hosts-w1", "mndsm-hosts-w2"]
ALIASES = {"mndsm-hosts-w1": ["gpu-a1"], "mndsm-hosts-w2": ["gpu-a2", "gpu-a2.lab.example"]}
# podman exec straight into the nodes (much faster than an ansible run per command).
testinfra_hosts = ["podman://%s" % name for name in NODES]
BEGIN = "# BEGIN multinode-deepspeed cluster names"


def address(name):
    """The node's real address on the scenario's network, read from the node itself."""
    other = testinfra.get_host("podman://%s" % name)
    return other.check_output("ip -4 -o addr show dev eth0").split()[3].split("/")[0]


def test_dns_is_really_absent(host):
    resolv = host.file("/etc/resolv.conf").content_string
    assert "nameserver 127.0.0.9" in resolv and "10.89." not in resolv


def test_block_is_at_the_top_once(host):
    lines = host.file("/etc/hosts").content_string.splitlines()
    assert lines[0].startswith(BEGIN), lines[:3]
    assert sum(1 for line in lines if line.startswith(BEGIN)) == 1
    block = lines[1:lines.index(next(x for x in lines if x.startswith("# END multinode-deepspeed")))]
    assert [entry.split()[1] for entry in block] == NODES


def test_every_name_resolves_to_the_nodes_address(host):
    for name in NODES:
        want = address(name)
        for alias in [name] + ALIASES.get(name, []):
            res = host.run("getent ahostsv4 %s", alias)
            assert res.rc == 0, (alias, res.stderr)
            assert res.stdout.split()[0] == want, (alias, res.stdout, want)


def test_the_block_comes_before_a_stale_line(host):
    # getent hosts takes the first matching line (as gethostbyname does): the block's, at the top.
    if host.backend.hostname == "mndsm-hosts-coord":
        assert "10.9.9.9 gpu-a1" in host.file("/etc/hosts").content_string
    assert host.run("getent hosts gpu-a1").stdout.split()[0] == address("mndsm-hosts-w1")
