from pathlib import Path

import pytest

from ansible_collections.multinode.deepspeed.plugins.modules import fabric_facts

SYSFS = Path(__file__).resolve().parents[3] / "fixtures" / "sysfs"


def ip_stub(tmp_path, tree, rc=0):
    """An `ip` that prints the tree's captured `ip -j addr` output (or fails like an old iproute2)."""
    stub = tmp_path / "ip"
    if rc:
        body = "echo 'Option \"-j\" is unknown, try \"ip -help\".' >&2\nexit %d\n" % rc
    else:
        body = 'test "$1 $2" = "-j addr" || exit 1\ncat "%s"\n' % (SYSFS / tree / "ip-addr.json")
    stub.write_text("#!/bin/sh\n" + body)
    stub.chmod(0o755)
    return str(stub)


@pytest.mark.parametrize("tree, address, iface, speed, active", [
    ("ib-mlx5-4port", "10.10.0.11", "eno1", 10000, ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1"]),
    ("roce", "10.20.0.21", "ens1f0np0", 200000, ["mlx5_0:1", "mlx5_1:1"]),
    ("ethernet-only", "129.254.202.252", "eno1", 1000, []),
    ("ib-down", "10.30.0.5", "eno1", 25000, []),
])
def test_trees(tmp_path, run_module, tree, address, iface, speed, active):
    res = run_module(fabric_facts, {"sysfs_root": str(SYSFS / tree), "address": address,
                                    "ip_command": ip_stub(tmp_path, tree)})
    assert res["changed"] is False and not res.get("failed") and not res.get("warnings")
    f = res["ansible_facts"]["multinode_fabric"]
    assert f["cluster_interface"] == iface and f["cluster_speed_mbps"] == speed
    assert f["cluster_address"] == address and f["rdma_active_ports"] == active


def test_roce_gid_index_through_module(tmp_path, run_module):
    res = run_module(fabric_facts, {"sysfs_root": str(SYSFS / "roce"), "ip_command": ip_stub(tmp_path, "roce"),
                                    "_ansible_check_mode": True})
    f = res["ansible_facts"]["multinode_fabric"]
    assert [p["roce_v2_gid_index"] for d in f["rdma"] for p in d["ports"]] == [3, 3]
    assert f["cluster_interface"] is None and f["cluster_address"] is None


def test_name_is_resolved(tmp_path, run_module, monkeypatch):
    def fake_getaddrinfo(host, port):
        assert host == "worker1"
        return [(2, 1, 6, "", ("172.16.5.21", 0)), (2, 2, 17, "", ("172.16.5.21", 0))]
    monkeypatch.setattr(fabric_facts.socket, "getaddrinfo", fake_getaddrinfo)
    res = run_module(fabric_facts, {"sysfs_root": str(SYSFS / "roce"), "address": "worker1",
                                    "ip_command": ip_stub(tmp_path, "roce")})
    f = res["ansible_facts"]["multinode_fabric"]
    assert f["cluster_interface"] == "eno1" and f["cluster_address"] == "172.16.5.21"


def test_unresolvable_name(tmp_path, run_module, monkeypatch):
    def fake_getaddrinfo(host, port):
        raise fabric_facts.socket.gaierror(-2, "Name or service not known")
    monkeypatch.setattr(fabric_facts.socket, "getaddrinfo", fake_getaddrinfo)
    res = run_module(fabric_facts, {"sysfs_root": str(SYSFS / "roce"), "address": "nowhere",
                                    "ip_command": ip_stub(tmp_path, "roce")})
    f = res["ansible_facts"]["multinode_fabric"]
    assert f["cluster_interface"] is None and f["cluster_address"] == "nowhere"


@pytest.fixture(name="warned")
def warned_fixture(monkeypatch):
    """The module's warnings, recorded where it calls warn() (ansible's own warning list is process-global)."""
    seen = []
    monkeypatch.setattr(fabric_facts.AnsibleModule, "warn", lambda self, msg: seen.append(msg))
    return seen


def test_without_ip_uses_sysfs_and_warns(tmp_path, run_module, warned):
    res = run_module(fabric_facts, {"sysfs_root": str(SYSFS / "ib-mlx5-4port"), "address": "10.10.0.11",
                                    "ip_command": str(tmp_path / "no-ip-here")})
    assert not res.get("failed")
    assert "sysfs without addresses" in " ".join(warned)
    f = res["ansible_facts"]["multinode_fabric"]
    names = [i["name"] for i in f["interfaces"]]
    assert "eno1" in names and "lo" not in names
    assert all(i["ipv4"] == [] for i in f["interfaces"])
    assert f["cluster_interface"] is None and len(f["rdma_active_ports"]) == 4


def test_ip_without_json_support_warns(tmp_path, run_module, warned):
    res = run_module(fabric_facts, {"sysfs_root": str(SYSFS / "ethernet-only"),
                                    "ip_command": ip_stub(tmp_path, "ethernet-only", rc=255)})
    assert not res.get("failed") and "supports -j" in " ".join(warned)
    assert sorted(i["name"] for i in res["ansible_facts"]["multinode_fabric"]["interfaces"]) == ["docker0", "eno1"]
