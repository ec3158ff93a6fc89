"""The cluster's /etc/hosts block: addresses, names, and errors that name host, variable and fix."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.deepspeed.plugins.filter.cluster_hosts import cluster_hosts
from ansible_collections.multinode.deepspeed.plugins.module_utils.cluster_hosts import (
    ClusterHostsError, hosts_lines, node_address, node_from_vars)


def node(name, address, fallback="", aliases=None):
    return {"name": name, "address": address, "fallback": fallback, "aliases": aliases or []}


def test_one_line_per_node_in_inventory_order():
    lines = hosts_lines([node("coord", "10.89.0.10"), node("gpu-a1", "10.89.0.11", aliases=["worker1"]),
                         node("gpu-a2", "10.89.0.12")])
    assert lines == ["10.89.0.10 coord", "10.89.0.11 gpu-a1 worker1", "10.89.0.12 gpu-a2"]


def test_ipv6_is_normalised():
    assert hosts_lines([node("w1", "fd00:0::0011")]) == ["fd00::11 w1"]


def test_a_name_as_address_falls_back_to_the_facts():
    # ansible_host: a DNS name (or a podman container name): the node's default IPv4 from its facts.
    assert node_address(node("w1", "mndsm-hosts-w1", fallback="10.89.3.5")) == "10.89.3.5"
    assert hosts_lines([node("w1", None, fallback="10.0.0.7")]) == ["10.0.0.7 w1"]


def test_no_ip_at_all_names_host_variable_and_fix():
    with pytest.raises(ClusterHostsError) as err:
        hosts_lines([node("gpu-a1", "node1.lab.example")])
    msg = str(err.value)
    assert msg.startswith("cluster_hosts: gpu-a1: the cluster's address for it is 'node1.lab.example', not an IP")
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
    assert "'a b' cannot stand" in str(err.value) and "w2: the cluster's address" in str(err.value)


def test_empty_is_an_error():
    with pytest.raises(ClusterHostsError, match="cluster_hosts_hosts is empty"):
        hosts_lines([])


def test_address_order_from_the_hosts_variables():
    facts = {"ansible_facts": {"default_ipv4": {"address": "10.0.0.9"}}}
    fabric = {"multinode_fabric": {"cluster_address": "10.0.0.5"}}
    assert node_from_vars("w1", {})["address"] == "w1"
    assert node_from_vars("w1", {"ansible_host": "10.0.0.4"})["address"] == "10.0.0.4"
    assert node_from_vars("w1", dict(fabric, ansible_host="node1.lab"))["address"] == "10.0.0.5"
    assert node_from_vars("w1", dict(fabric, cluster_hosts_address="10.1.0.1"))["address"] == "10.1.0.1"
    got = node_from_vars("w1", dict(facts, ansible_host="node1.lab", cluster_hosts_aliases="w1.lab"))
    assert got == {"name": "w1", "address": "node1.lab", "fallback": "10.0.0.9", "aliases": ["w1.lab"]}
    # A fabric fact that did not resolve (None) does not hide ansible_host.
    assert node_from_vars("w1", {"multinode_fabric": {"cluster_address": None}, "ansible_host": "10.0.0.4"})[
        "address"] == "10.0.0.4"


def test_filter_reads_hostvars_and_raises_ansible_errors():
    hostvars = {"coord": {"ansible_host": "10.0.0.1"},
                "w1": {"ansible_host": "w1.lab", "ansible_facts": {"default_ipv4": {"address": "10.0.0.2"}},
                       "cluster_hosts_aliases": ["gpu-a1"]}}
    assert cluster_hosts(["coord", "w1"], hostvars) == ["10.0.0.1 coord", "10.0.0.2 w1 gpu-a1"]
    with pytest.raises(AnsibleFilterError, match="gpu-a1: the cluster's address for it is 'x'"):
        cluster_hosts(["gpu-a1"], {"gpu-a1": {"ansible_host": "x"}})
