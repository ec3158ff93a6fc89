"""The preflight filters: preflight_bandwidth (judge a test, AnsibleFilterError on bad input) and link_gbps."""
import json
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.deepspeed.plugins.filter import link_gbps as link_gbps_plugin
from ansible_collections.multinode.deepspeed.plugins.filter import preflight_bandwidth as bandwidth_plugin
from ansible_collections.multinode.deepspeed.plugins.filter.link_gbps import link_gbps
from ansible_collections.multinode.deepspeed.plugins.filter.preflight_bandwidth import preflight_bandwidth
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import fabric, nccl

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
GLOO = json.loads((FIXTURES / "preflight" / "gloo-2node-podman.json").read_text())


def test_filters_are_registered():
    assert bandwidth_plugin.FilterModule().filters() == {"preflight_bandwidth": preflight_bandwidth}
    assert link_gbps_plugin.FilterModule().filters() == {"link_gbps": link_gbps}


def one_size(busbw):
    """A two-rank test whose 64 MiB message reaches busbw GB/s (algbw == busbw on 2 ranks)."""
    nbytes = 64 << 20
    return {"label": "tcp", "ok": True, "error": "",
            "raw": {"world_size": 2, "results": [{"bytes": nbytes, "iters": 4, "seconds": nbytes / busbw / 1e9}]}}


def test_preflight_bandwidth_on_the_real_gloo_result():
    test = {"label": "tcp", "ok": True, "error": "", "raw": GLOO}
    res = preflight_bandwidth(test, 2, "tcp", "gloo", 10.0)
    assert res["status"] == "pass" and res["key"] == "gloo" and res["threshold_gbps"] == 0.0625
    assert len(res["rows"]) == len(GLOO["results"])
    assert res["busbw_gbps"] == max(r["busbw_gbps"] for r in res["rows"] if r["bytes"] >= 16 << 20)


def test_preflight_bandwidth_converts_what_jinja_passes():
    # Numbers arrive as strings from templates; an empty link means unknown.
    res = preflight_bandwidth(one_size(1.0), "2", "tcp", "nccl", "10")
    assert res["status"] == "pass" and res["link_gbps"] == 10.0 and res["threshold_gbps"] == 0.375
    assert preflight_bandwidth(one_size(1.0), 2, "tcp", "nccl", "")["status"] == "warn"
    assert preflight_bandwidth(one_size(1.0), 2, "tcp", "nccl")["status"] == "warn"


def test_preflight_bandwidth_fractions():
    assert preflight_bandwidth(one_size(1.0), 2, "tcp", "nccl", 10.0, {"tcp": 0.9})["status"] == "fail"
    assert preflight_bandwidth(one_size(1.0), 2, "tcp", "nccl", 10.0, None)["fraction"] == 0.3


def test_preflight_bandwidth_failed_or_missing_test_fails():
    res = preflight_bandwidth({"label": "ib", "ok": False, "error": "worker1: Call to ibv_modify_qp failed"},
                              2, "ib", "nccl", 400.0)
    assert res["status"] == "fail" and "Call to ibv_modify_qp failed" in res["reason"]
    assert preflight_bandwidth(None, 2, "ib", "nccl", 400.0)["reason"].endswith("no result")


@pytest.mark.parametrize("test, nodes, link, match", [
    ({"ok": True, "raw": {"results": []}}, 2, 10.0, "world_size"),                                   # KeyError
    ({"ok": True, "raw": {"world_size": 0, "results": []}}, 2, 10.0, "at least one rank"),          # PreflightError
    ({"ok": True, "raw": {"world_size": 2, "results": [{"bytes": 4096, "seconds": 0}]}}, 2, 10.0,
     "non-positive time"),
    ({"ok": True, "raw": {"world_size": 2, "results": [{"bytes": "4 KiB", "seconds": 1}]}}, 2, 10.0, "4 KiB"),
    ({"ok": True, "raw": {"world_size": 2, "results": [{"seconds": 1}]}}, 2, 10.0, "bytes"),
    (one_size(1.0), "two", 10.0, "two"),                                                              # ValueError
    (one_size(1.0), None, 10.0, "preflight_bandwidth"),                                               # TypeError
    (one_size(1.0), 2, "fast", "fast"),
])
def test_preflight_bandwidth_bad_input_is_a_filter_error(test, nodes, link, match):
    with pytest.raises(AnsibleFilterError, match=match) as err:
        preflight_bandwidth(test, nodes, "tcp", "nccl", link)
    assert str(err.value).startswith("preflight_bandwidth: ")


SYSFS = FIXTURES / "sysfs"


def facts(name, address):
    root = SYSFS / name
    interfaces = fabric.parse_ip_addr_json((root / "ip-addr.json").read_text())
    net = fabric.read_net(str(root), [i["name"] for i in interfaces])
    return fabric.fabric_facts(fabric.read_rdma(str(root)), interfaces, net, address)


@pytest.mark.parametrize("tree, address, gbps", [
    ("ib-mlx5-4port", "10.10.0.11", 1600.0),     # 4 x 400 Gb/s NDR ports
    ("roce", "10.20.0.21", 400.0),               # 2 x 200 Gb/s
    ("ethernet-only", "129.254.202.252", 1.0),   # eno1: 1000 Mb/s
    ("ib-down", "10.30.0.5", 25.0),              # tcp on eno1: 25000 Mb/s
])
def test_link_gbps_from_the_fixture_trees(tree, address, gbps):
    f = facts(tree, address)
    assert link_gbps(f, nccl.node_profile(f, host="h")) == gbps


def test_link_gbps_of_the_tcp_profile_on_an_rdma_node_is_the_socket_interface():
    f = facts("ib-mlx5-4port", "10.10.0.11")
    assert link_gbps(f, nccl.node_profile(f, host="h", requested="tcp")) == 10.0


def test_link_gbps_unknown():
    f = facts("ethernet-only", "129.254.202.252")
    assert link_gbps(f, nccl.node_profile(f, host="h", socket_ifname="docker0")) is None   # speed -1
    assert link_gbps(None, None) is None
    assert link_gbps({}, {"profile": "ib", "rdma_ports": ["mlx5_0:1"]}) is None
