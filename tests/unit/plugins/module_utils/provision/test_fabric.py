import os
from pathlib import Path

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.fabric import (
    cluster_interface, fabric_facts, interfaces_from_net, parse_ip_addr_json, parse_rate, read_net, read_rdma,
    roce_v2_gid_index)

SYSFS = Path(__file__).resolve().parents[4] / "fixtures" / "sysfs"
KEYS = {"rdma", "rdma_active_ports", "interfaces", "cluster_interface", "cluster_address", "cluster_speed_mbps"}
PORT_KEYS = {"port", "state", "state_code", "phys_state", "rate", "rate_gbps", "link_layer", "netdev",
             "roce_v2_gid_index"}


def facts_of(name, address):
    root = str(SYSFS / name)
    interfaces = parse_ip_addr_json((SYSFS / name / "ip-addr.json").read_text())
    net = read_net(root, [i["name"] for i in interfaces])
    return fabric_facts(read_rdma(root), interfaces, net, address)


def test_ib_4port():
    rdma = read_rdma(str(SYSFS / "ib-mlx5-4port"))
    assert [d["device"] for d in rdma] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert [d["ports"][0]["netdev"] for d in rdma] == ["ibp12s0", "ibp75s0", "ibp141s0", "ibp186s0"]
    for dev in rdma:
        (port,) = dev["ports"]
        assert set(port) == PORT_KEYS
        assert port["port"] == 1
        assert (port["state"], port["state_code"], port["phys_state"]) == ("ACTIVE", 4, "LinkUp")
        assert port["rate"] == "400 Gb/sec (4X NDR)" and port["rate_gbps"] == 400.0
        assert port["link_layer"] == "InfiniBand" and port["roce_v2_gid_index"] is None
    f = facts_of("ib-mlx5-4port", "10.10.0.11")
    assert set(f) == KEYS
    assert f["rdma_active_ports"] == ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1"]
    assert f["cluster_interface"] == "eno1" and f["cluster_speed_mbps"] == 10000
    assert f["cluster_address"] == "10.10.0.11"
    by_name = {i["name"]: i for i in f["interfaces"]}
    assert "lo" not in by_name
    assert by_name["ibp12s0"]["ipv4"] == ["192.168.100.11/24"] and by_name["ibp12s0"]["link_type"] == "infiniband"
    assert by_name["ibp12s0"]["speed_mbps"] == 400000 and by_name["ibp12s0"]["mtu"] == 4092
    assert by_name["eno2"]["speed_mbps"] is None and by_name["eno2"]["operstate"] == "DOWN"
    assert facts_of("ib-mlx5-4port", "192.168.100.61")["cluster_interface"] == "ibp75s0"


def test_roce():
    f = facts_of("roce", "10.20.0.21")
    ports = [(d["device"], p) for d in f["rdma"] for p in d["ports"]]
    assert [(dev, p["netdev"]) for dev, p in ports] == [("mlx5_0", "ens1f0np0"), ("mlx5_1", "ens1f1np1")]
    for dev, port in ports:
        assert port["link_layer"] == "Ethernet" and port["state"] == "ACTIVE"
        assert port["roce_v2_gid_index"] == 3
        assert port["rate_gbps"] == 200.0
    assert f["rdma_active_ports"] == ["mlx5_0:1", "mlx5_1:1"]
    assert f["cluster_interface"] == "ens1f0np0" and f["cluster_speed_mbps"] == 200000
    assert facts_of("roce", "172.16.5.21")["cluster_interface"] == "eno1"


def test_ethernet_only():
    assert read_rdma(str(SYSFS / "ethernet-only")) == []
    f = facts_of("ethernet-only", "129.254.202.252")
    assert f["rdma"] == [] and f["rdma_active_ports"] == []
    assert f["cluster_interface"] == "eno1" and f["cluster_speed_mbps"] == 1000
    by_name = {i["name"]: i for i in f["interfaces"]}
    assert sorted(by_name) == ["docker0", "eno1"]
    assert by_name["docker0"]["speed_mbps"] is None and by_name["docker0"]["ipv4"] == ["172.17.0.1/16"]
    assert by_name["eno1"]["ipv6"] == ["fe80::b696:91ff:fe3c:7e52/64"]


def test_ib_down():
    f = facts_of("ib-down", "10.30.0.5")
    (port,) = f["rdma"][0]["ports"]
    assert (port["state"], port["state_code"], port["phys_state"]) == ("DOWN", 1, "Disabled")
    assert port["rate"] == "10 Gb/sec (4X SDR)" and port["rate_gbps"] == 10.0
    assert port["netdev"] == "ibp12s0"
    assert f["rdma_active_ports"] == []
    assert f["cluster_interface"] == "eno1" and f["cluster_speed_mbps"] == 25000
    assert {i["name"]: i for i in f["interfaces"]}["ibp12s0"]["speed_mbps"] is None


@pytest.mark.parametrize("tree", ["ib-mlx5-4port", "roce", "ethernet-only", "ib-down"])
def test_no_or_unknown_address(tree):
    assert facts_of(tree, None)["cluster_interface"] is None
    f = facts_of(tree, "203.0.113.9")
    assert f["cluster_interface"] is None and f["cluster_speed_mbps"] is None
    assert facts_of(tree, "node1.example")["cluster_interface"] is None


def test_loopback_address_is_lo_but_lo_is_not_listed():
    f = facts_of("ethernet-only", "127.0.0.1")
    assert f["cluster_interface"] == "lo" and f["cluster_speed_mbps"] is None
    assert "lo" not in [i["name"] for i in f["interfaces"]]


def test_cluster_interface_ipv6():
    interfaces = [{"name": "eth0", "ipv4": [], "ipv6": ["2001:db8::5/64", "fe80::1/64"]}]
    assert cluster_interface(interfaces, "2001:db8:0::5") == "eth0"
    assert cluster_interface(interfaces, "fe80::1%eth0") == "eth0"
    assert cluster_interface(interfaces, "2001:db8::6") is None


def _copy_port(tmp_path, tree="roce", dev="mlx5_0"):
    import shutil
    shutil.copytree(str(SYSFS / tree), str(tmp_path / "sys"))
    return tmp_path / "sys" / "class" / "infiniband" / dev / "ports" / "1"


def test_roce_without_ipv4_mapped_gid_falls_back_to_link_local_v2(tmp_path):
    port = _copy_port(tmp_path)
    for i in ("2", "3"):
        (port / "gids" / i).write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")
    assert roce_v2_gid_index(str(port)) == 1
    assert read_rdma(str(tmp_path / "sys"))[0]["ports"][0]["roce_v2_gid_index"] == 1


def test_unreadable_gid_attrs_are_absent(tmp_path):
    port = _copy_port(tmp_path)
    # Real sysfs raises EINVAL on reading an unset gid_attrs entry; a directory raises OSError too.
    os.remove(str(port / "gid_attrs" / "types" / "3"))
    os.mkdir(str(port / "gid_attrs" / "types" / "3"))
    os.remove(str(port / "gid_attrs" / "ndevs" / "1"))
    os.mkdir(str(port / "gid_attrs" / "ndevs" / "1"))
    rdma = read_rdma(str(tmp_path / "sys"))
    assert rdma[0]["ports"][0]["roce_v2_gid_index"] == 1
    assert rdma[0]["ports"][0]["netdev"] == "ens1f0np0"


def test_roce_netdev_falls_back_to_device_net(tmp_path):
    import shutil
    port = _copy_port(tmp_path)
    shutil.rmtree(str(port / "gid_attrs" / "ndevs"))
    assert read_rdma(str(tmp_path / "sys"))[0]["ports"][0]["netdev"] == "ens1f0np0"


def test_ib_netdev_by_dev_port(tmp_path):
    base = tmp_path / "class" / "infiniband" / "mlx5_0"
    for p in ("1", "2"):
        port = base / "ports" / p
        port.mkdir(parents=True)
        (port / "state").write_text("4: ACTIVE\n")
        (port / "link_layer").write_text("InfiniBand\n")
    for name, dev_port in (("ib0", "0"), ("ib1", "1")):
        (base / "device" / "net" / name).mkdir(parents=True)
        (base / "device" / "net" / name / "dev_port").write_text(dev_port + "\n")
    rdma = read_rdma(str(tmp_path))
    assert [(p["port"], p["netdev"]) for p in rdma[0]["ports"]] == [(1, "ib0"), (2, "ib1")]
    assert [p["rate"] for p in rdma[0]["ports"]] == [None, None]


def test_missing_sysfs():
    assert read_rdma("/nonexistent") == []
    assert read_net("/nonexistent") == {}


def test_read_net_all_and_speeds():
    net = read_net(str(SYSFS / "ethernet-only"))
    assert sorted(net) == ["docker0", "eno1", "lo"]
    assert net["eno1"] == {"speed_mbps": 1000, "operstate": "up", "mtu": 1500, "mac": "b4:96:91:3c:7e:52",
                           "link_type": "ether"}
    assert net["docker0"]["speed_mbps"] is None  # sysfs says -1
    assert net["lo"]["speed_mbps"] is None and net["lo"]["link_type"] == "loopback"  # unreadable
    assert read_net(str(SYSFS / "ethernet-only"), ["eno1", "gone0"]).keys() == {"eno1"}


def test_interfaces_from_net_without_ip():
    net = read_net(str(SYSFS / "ib-mlx5-4port"))
    f = fabric_facts([], interfaces_from_net(net), net, "10.10.0.11")
    names = [i["name"] for i in f["interfaces"]]
    assert "lo" not in names and "eno1" in names and "ibp12s0" in names
    assert all(i["ipv4"] == [] for i in f["interfaces"])
    assert {i["name"]: i for i in f["interfaces"]}["eno1"]["operstate"] == "UP"
    assert f["cluster_interface"] is None


def test_parse_ip_addr_json():
    ifaces = parse_ip_addr_json((SYSFS / "roce" / "ip-addr.json").read_text())
    assert [i["name"] for i in ifaces] == ["lo", "eno1", "ens1f0np0", "ens1f1np1"]
    ens = ifaces[2]
    assert ens == {"name": "ens1f0np0", "operstate": "UP", "mtu": 9000, "mac": "b8:3f:d2:4a:10:e0",
                   "link_type": "ether", "ipv4": ["10.20.0.21/24"], "ipv6": ["fe80::ba3f:d2ff:fe4a:10e0/64"]}
    assert parse_ip_addr_json("[]") == []
    assert parse_ip_addr_json('[{"ifindex": 9, "ifname": "x", "addr_info": [{}]}]')[0]["ipv4"] == []
    with pytest.raises(ValueError):
        parse_ip_addr_json("Option \"-j\" is unknown")
    with pytest.raises(ValueError):
        parse_ip_addr_json("{}")


def test_parse_rate():
    assert parse_rate("400 Gb/sec (4X NDR)") == 400.0
    assert parse_rate("2.5 Gb/sec (1X SDR)") == 2.5
    assert parse_rate(None) is None and parse_rate("weird") is None
