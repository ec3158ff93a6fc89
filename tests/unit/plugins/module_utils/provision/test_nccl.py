"""NCCL profile selection over the fabric fixtures (real sysfs trees and ip -j addr output)."""
import json

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.nccl import (
    NcclError, env_file, job_profile, nccl_conf, node_profile)

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
