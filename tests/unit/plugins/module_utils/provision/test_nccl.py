"""NCCL profile selection over the fabric fixtures (real sysfs trees and ip -j addr output)."""
import copy
import json

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.nccl import (
    NcclError, choose_hca, choose_profile, env_file, job_profile, nccl_conf, node_profile, rdma_inventory,
    unused_rdma_warnings)

from tests.unit.plugins.module_utils.sysfs_facts import facts


def test_infiniband_node_gets_ib_with_exact_hca_list():
    res = node_profile(facts("ib-mlx5-4port"), host="gpu1")
    assert res["profile"] == "ib" and res["memlock_unlimited"] is True
    assert res["env"]["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert res["env"]["NCCL_IB_DISABLE"] == "0"
    assert res["env"]["NCCL_SOCKET_IFNAME"] == "=eno1" and res["env"]["GLOO_SOCKET_IFNAME"] == "eno1"
    assert "NCCL_IB_GID_INDEX" not in res["env"] and res["warnings"] == []


def test_roce_node_gets_the_roce_v2_gid_index():
    res = node_profile(facts("roce"), host="r1")
    assert res["profile"] == "roce"
    assert res["env"]["NCCL_IB_GID_INDEX"] == "3"
    assert res["env"]["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1"
    assert res["env"]["NCCL_SOCKET_IFNAME"] == "=ens1f0np0"


def test_ethernet_only_node_gets_tcp_on_its_cluster_interface():
    res = node_profile(facts("ethernet-only"), host="jw2")
    assert res["profile"] == "tcp" and res["reason"] == "no RDMA device"
    assert res["env"] == {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "=eno1", "GLOO_SOCKET_IFNAME": "eno1"}
    assert res["memlock_unlimited"] is False and res["warnings"] == []


def test_ib_ports_down_fall_back_to_tcp_with_the_ibv_modify_qp_warning():
    res = node_profile(facts("ib-down"), host="w3")
    assert res["profile"] == "tcp" and res["env"]["NCCL_IB_DISABLE"] == "1"
    assert res["reason"] == "no active RDMA port"
    assert len(res["warnings"]) == 1
    assert "mlx5_0:1" in res["warnings"][0] and "ibv_modify_qp" in res["warnings"][0]


BAD_REQUESTS = [("ib-down", "ib"), ("ethernet-only", "ib"), ("ethernet-only", "roce"), ("ib-mlx5-4port", "roce")]


@pytest.mark.parametrize("fixture,requested", BAD_REQUESTS)
def test_requested_profile_that_cannot_work_names_host_variable_and_fix(fixture, requested):
    with pytest.raises(NcclError) as err:
        node_profile(facts(fixture), host="w9", requested=requested)
    msg = str(err.value)
    assert "host w9" in msg and "nccl_profile=%s" % requested in msg and "Fix:" in msg


def test_unknown_profile_is_refused():
    with pytest.raises(NcclError, match=r"host w1: nccl_profile='rdma' is not a profile"):
        node_profile(facts("roce"), host="w1", requested="rdma")


def test_tcp_can_be_forced_on_an_rdma_node_and_overrides_apply():
    res = node_profile(facts("ib-mlx5-4port"), host="gpu1", requested="tcp",
                       env={"NCCL_DEBUG": "INFO", "GLOO_SOCKET_IFNAME": ""})
    assert res["profile"] == "tcp" and res["env"]["NCCL_IB_DISABLE"] == "1"
    assert res["env"]["NCCL_DEBUG"] == "INFO" and "GLOO_SOCKET_IFNAME" not in res["env"]
    assert "not used" in res["warnings"][0]


def test_unknown_cluster_interface_asks_for_nccl_socket_ifname():
    with pytest.raises(NcclError, match="nccl_socket_ifname"):
        node_profile(facts("ethernet-only", address="192.0.2.99"), host="jw2")
    res = node_profile(facts("ethernet-only", address="192.0.2.99"), host="jw2", socket_ifname="eno1")
    assert res["env"]["NCCL_SOCKET_IFNAME"] == "=eno1"


def test_job_on_one_profile_splits_shared_and_node_local_variables():
    a = node_profile(facts("ib-mlx5-4port"), host="gpu1")
    b = node_profile(facts("ib-mlx5-4port"), host="gpu2", socket_ifname="eno2")
    job = job_profile({"gpu1": a, "gpu2": b})
    assert job["profile"] == "ib" and job["hosts"] == ["gpu1", "gpu2"]
    assert job["env"]["NCCL_IB_HCA"] == "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert "NCCL_SOCKET_IFNAME" not in job["env"]
    assert job["node_local"]["NCCL_SOCKET_IFNAME"] == {"gpu1": "=eno1", "gpu2": "=eno2"}


def test_job_with_mixed_profiles_fails_listing_every_node():
    with pytest.raises(NcclError) as err:
        job_profile({"gpu1": node_profile(facts("ib-mlx5-4port"), host="gpu1"),
                     "jw2": node_profile(facts("ethernet-only"), host="jw2")})
    msg = str(err.value)
    assert "gpu1" in msg and "ib" in msg and "jw2" in msg and "tcp" in msg
    assert "Fix: set nccl_profile to one value" in msg


def test_empty_job_is_an_error():
    with pytest.raises(NcclError, match="workers"):
        job_profile({})


def test_files_render_in_the_formats_nccl_and_deepspeed_read():
    env = node_profile(facts("roce"), host="r1")["env"]
    conf = nccl_conf(env)
    assert "NCCL_IB_GID_INDEX=3\n" in conf and "GLOO_SOCKET_IFNAME" not in conf
    lines = env_file(env).splitlines()
    assert all(line.count("=") >= 1 and not line.startswith("#") for line in lines)
    assert json.dumps(sorted(lines))
    with pytest.raises(NcclError):
        env_file({"BAD": "a\nb"})


# ---------------------------------------------------------------- the parts node_profile decides with


def _inventory(name):
    fabric = facts(name)
    return fabric, rdma_inventory(fabric)


@pytest.mark.parametrize("fixture,profile,reason", [
    ("ib-mlx5-4port", "ib", "4 active InfiniBand port(s)"), ("roce", "roce", "2 active RoCE v2 port(s)"),
    ("ethernet-only", "tcp", "no RDMA device"), ("ib-down", "tcp", "no active RDMA port")])
def test_choose_profile_auto_prefers_infiniband_then_roce_then_tcp(fixture, profile, reason):
    fabric, inventory = _inventory(fixture)
    assert choose_profile(fabric, "w1", "auto", inventory) == (profile, reason)


def test_choose_profile_keeps_a_request_the_ports_allow():
    fabric, inventory = _inventory("ib-mlx5-4port")
    assert choose_profile(fabric, "gpu1", "ib", inventory) == ("ib", "set by nccl_profile")
    assert choose_profile(fabric, "gpu1", "tcp", inventory) == ("tcp", "set by nccl_profile")
    fabric, inventory = _inventory("roce")
    assert choose_profile(fabric, "r1", "roce", inventory) == ("roce", "set by nccl_profile")


def test_choose_profile_refuses_ib_on_down_ports_naming_them():
    fabric, inventory = _inventory("ib-down")
    with pytest.raises(NcclError) as err:
        choose_profile(fabric, "w3", "ib", inventory)
    assert str(err.value) == (
        "host w3: nccl_profile=ib but the node has no active InfiniBand port (mlx5_0:1 InfiniBand DOWN 10 Gb/sec "
        "(4X SDR)). Fix: bring the ports up (ibstat), or set nccl_profile=auto (or tcp) for w3.")


def test_choose_profile_refuses_roce_on_infiniband_ports():
    fabric, inventory = _inventory("ib-mlx5-4port")
    with pytest.raises(NcclError, match=r"host gpu1: nccl_profile=roce but .* \(mlx5_0:1 InfiniBand ACTIVE 400 Gb/sec "
                                        r"\(4X NDR\); mlx5_1:1"):
        choose_profile(fabric, "gpu1", "roce", inventory)
    fabric, inventory = _inventory("ethernet-only")
    with pytest.raises(NcclError, match=r"RoCE v2 GID \(no RDMA device at all\)"):
        choose_profile(fabric, "jw2", "roce", inventory)


def test_unused_rdma_warnings_only_for_tcp_on_rdma_hardware():
    dummy, inventory = _inventory("ib-down")
    assert unused_rdma_warnings("w3", "tcp", inventory) == [
        "host w3: RDMA hardware is present but not used: mlx5_0:1 (InfiniBand, DOWN). The tcp profile sets "
        "NCCL_IB_DISABLE=1; without it NCCL tries the device and can die with 'Call to ibv_modify_qp failed'."]
    dummy, inventory = _inventory("roce")
    (warning,) = unused_rdma_warnings("r1", "tcp", inventory)
    assert "mlx5_0:1 (Ethernet, ACTIVE), mlx5_1:1 (Ethernet, ACTIVE)." in warning
    assert unused_rdma_warnings("r1", "roce", inventory) == []
    assert unused_rdma_warnings("jw2", "tcp", _inventory("ethernet-only")[1]) == []


def test_choose_hca_lists_the_active_infiniband_ports():
    dummy, inventory = _inventory("ib-mlx5-4port")
    ports, env, warnings = choose_hca("gpu1", "ib", inventory)
    assert [(d, p["netdev"]) for d, p in ports] == [("mlx5_0", "ibp12s0"), ("mlx5_1", "ibp75s0"),
                                                    ("mlx5_2", "ibp141s0"), ("mlx5_3", "ibp186s0")]
    assert env == {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"}
    assert warnings == []


def test_choose_hca_for_roce_adds_the_gid_index():
    dummy, inventory = _inventory("roce")
    ports, env, warnings = choose_hca("r1", "roce", inventory)
    assert [p["netdev"] for d, p in ports] == ["ens1f0np0", "ens1f1np1"]
    assert env == {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1", "NCCL_IB_GID_INDEX": "3"}
    assert warnings == []


def test_choose_hca_takes_the_lowest_of_differing_gid_indexes_and_warns():
    fabric = copy.deepcopy(facts("roce"))
    fabric["rdma"][1]["ports"][0]["roce_v2_gid_index"] = 1
    ports, env, warnings = choose_hca("r1", "roce", rdma_inventory(fabric))
    assert len(ports) == 2 and env["NCCL_IB_GID_INDEX"] == "1"
    assert warnings == ["host r1: the RoCE ports use different RoCE v2 GID indexes [1, 3]; NCCL takes one. "
                        "Using 1; set nccl_env: {NCCL_IB_GID_INDEX: ...} to choose."]


def test_choose_hca_for_tcp_disables_the_ib_transport():
    dummy, inventory = _inventory("ib-mlx5-4port")
    assert choose_hca("gpu1", "tcp", inventory) == ([], {"NCCL_IB_DISABLE": "1"}, [])
