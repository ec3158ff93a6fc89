"""The cluster's /etc/hosts block: addresses, names, and errors that name host, variable and fix."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.deepspeed.plugins.filter.cluster_hosts import cluster_hosts
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.cluster_hosts import (
    ClusterHostsError, hosts_lines, node_address, node_from_vars)


def node(name, *candidates, fallback="", aliases=None, explicit=None):
    return {"name": name, "explicit": explicit, "candidates": list(candidates), "fallback": fallback,
            "aliases": aliases or []}


def test_one_line_per_node_in_inventory_order():
    lines = hosts_lines([node("coord", "10.89.0.10"), node("gpu-a1", "10.89.0.11", aliases=["worker1"]),
                         node("gpu-a2", "10.89.0.12")])
    assert lines == ["10.89.0.10 coord", "10.89.0.11 gpu-a1 worker1", "10.89.0.12 gpu-a2"]


def test_ipv6_is_normalised():
    assert hosts_lines([node("w1", "fd00:0::0011")]) == ["fd00::11 w1"]


def test_a_name_as_address_falls_back_to_the_facts():
    # ansible_host: a DNS name (or a podman container name): the node's default IPv4 from its facts.
    assert node_address(node("w1", "mndsm-hosts-w1", "w1", fallback="10.89.3.5")) == "10.89.3.5"
    assert hosts_lines([node("w1", None, fallback="10.0.0.7")]) == ["10.0.0.7 w1"]


def test_loopback_from_the_fabric_facts_is_passed_over():
    # ansible_host is the machine's own name, which Debian resolves to 127.0.1.1 on the node itself.
    assert node_address(node("w1", "127.0.1.1", "w1", "w1", fallback="10.0.0.7")) == "10.0.0.7"
    with pytest.raises(ClusterHostsError) as err:
        node_address(node("w1", "127.0.1.1", "w1"))
    assert "127.0.1.1 is a loopback address" in str(err.value) and "cluster_hosts_address" in str(err.value)


def test_unusable_addresses_are_refused():
    for bad, why in (("0.0.0.0", "the unspecified"), ("224.0.0.1", "a multicast"), ("169.254.1.1", "a link-local"),
                     ("::1", "a loopback"), ("fe80::1", "a link-local")):
        with pytest.raises(ClusterHostsError, match=why):
            hosts_lines([node("w1", bad)])


def test_an_explicit_address_must_be_usable_and_is_never_passed_over():
    assert node_address(node("w1", "10.0.0.5", explicit="10.1.0.1")) == "10.1.0.1"
    with pytest.raises(ClusterHostsError, match=r"w1: cluster_hosts_address='127.0.0.1' 127.0.0.1 is a loopback"):
        node_address(node("w1", "10.0.0.5", explicit="127.0.0.1"))
    with pytest.raises(ClusterHostsError, match="is not an IP address"):
        node_address(node("w1", "10.0.0.5", explicit="node1.lab"))


def test_values_cannot_add_lines_to_etc_hosts():
    # A zone id may hold anything, a newline included; names may not end in one either.
    for bad in ("fe80::1%eth0", "fe80::1%x\n6.6.6.6 evil", "10.0.0.1\n6.6.6.6 evil", "10.0.0.1 evil"):
        with pytest.raises(ClusterHostsError):
            hosts_lines([node("w1", explicit=bad)])
    with pytest.raises(ClusterHostsError, match="cannot stand in /etc/hosts"):
        hosts_lines([node("gpu\n", "10.0.0.1")])
    with pytest.raises(ClusterHostsError, match="cannot stand in /etc/hosts"):
        hosts_lines([node("w1", "10.0.0.1", aliases=["ok\n6.6.6.6 evil"])])


def test_no_ip_at_all_names_host_variable_and_fix():
    with pytest.raises(ClusterHostsError) as err:
        hosts_lines([node("gpu-a1", "node1.lab.example", "gpu-a1")])
    msg = str(err.value)
    assert msg.startswith("cluster_hosts: gpu-a1: no address for it that the other nodes can use "
                          "('node1.lab.example' is not an IP address; 'gpu-a1' is not an IP address")
    assert "Fix: set cluster_hosts_address: <the IP the other nodes reach it at> for gpu-a1" in msg
    assert "cluster_hosts_file: false" in msg


def test_bad_names_are_refused():
    for bad in ("gpu a1", "-w1", "w1\n10.0.0.1 evil", "w1#x", "", "w.", "ünï"):
        with pytest.raises(ClusterHostsError, match="cannot stand in /etc/hosts"):
            hosts_lines([node(bad, "10.0.0.1")])
    with pytest.raises(ClusterHostsError, match="correct cluster_hosts_aliases for w1"):
        hosts_lines([node("w1", "10.0.0.1", aliases=["ok", "not ok"])])
    assert hosts_lines([node("w_1.lab", "10.0.0.1")]) == ["10.0.0.1 w_1.lab"]


def test_one_name_two_addresses_is_refused_case_insensitively():
    with pytest.raises(ClusterHostsError) as err:
        hosts_lines([node("w1", "10.0.0.1", aliases=["gpu"]), node("w2", "10.0.0.2", aliases=["GPU"])])
    assert "the name GPU is given to 10.0.0.1 (by w1) and to 10.0.0.2 (by w2)" in str(err.value)
    # The same name twice at one address is harmless.
    assert len(hosts_lines([node("w1", "10.0.0.1", aliases=["w1"])])) == 1


def test_every_problem_is_reported_at_once():
    with pytest.raises(ClusterHostsError) as err:
        hosts_lines([node("a b", "10.0.0.1"), node("w2", "name")])
    assert "'a b' cannot stand" in str(err.value) and "w2: no address for it" in str(err.value)


def test_empty_is_an_error():
    with pytest.raises(ClusterHostsError, match="cluster_hosts_hosts is empty"):
        hosts_lines([])


def address(name, hostvars):
    return node_address(node_from_vars(name, hostvars))


def test_address_order_from_the_hosts_variables():
    facts = {"ansible_facts": {"default_ipv4": {"address": "10.0.0.9"}}}
    fabric = {"multinode_fabric": {"cluster_address": "10.0.0.5"}}
    assert address("10.0.0.3", {}) == "10.0.0.3"
    assert address("w1", {"ansible_host": "10.0.0.4"}) == "10.0.0.4"
    assert address("w1", dict(fabric, ansible_host="node1.lab")) == "10.0.0.5"
    assert address("w1", dict(fabric, cluster_hosts_address="10.1.0.1")) == "10.1.0.1"
    assert address("w1", dict(facts, ansible_host="node1.lab")) == "10.0.0.9"
    got = node_from_vars("w1", dict(facts, ansible_host="node1.lab", cluster_hosts_aliases="w1.lab"))
    assert got["aliases"] == ["w1.lab"] and got["fallback"] == "10.0.0.9"
    # A fabric fact that did not resolve (None) does not hide ansible_host.
    assert address("w1", {"multinode_fabric": {"cluster_address": None}, "ansible_host": "10.0.0.4"}) == "10.0.0.4"


def test_filter_reads_hostvars_and_raises_ansible_errors():
    hostvars = {"coord": {"ansible_host": "10.0.0.1"},
                "w1": {"ansible_host": "w1.lab", "ansible_facts": {"default_ipv4": {"address": "10.0.0.2"}},
                       "cluster_hosts_aliases": ["gpu-a1"]}}
    assert cluster_hosts(["coord", "w1"], hostvars) == ["10.0.0.1 coord", "10.0.0.2 w1 gpu-a1"]
    with pytest.raises(AnsibleFilterError, match="gpu-a1: no address for it"):
        cluster_hosts(["gpu-a1"], {"gpu-a1": {"ansible_host": "x"}})
