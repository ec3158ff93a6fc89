"""The filters raise AnsibleFilterError with the module_utils' messages, and add the printed table."""
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.multinode.deepspeed.plugins.filter.nccl_job import nccl_job
from ansible_collections.multinode.deepspeed.plugins.filter.nccl_profile import nccl_profile
from ansible_collections.multinode.deepspeed.plugins.filter.select_stack import select_stack

CPU = {"python": "3.11.2", "accelerator": "cpu"}
A30 = {"python": "3.11.2", "accelerator": "cuda", "driver_version": "535.183.01", "cuda_driver_version": "12.2"}
TCP_FABRIC = {"rdma": [], "cluster_interface": "eth0", "cluster_address": "10.0.0.2"}


def test_select_stack_ignores_empty_pins_and_prints_a_table():
    res = select_stack({"coord": CPU, "w1": CPU}, {"torch": "2.13.0", "cuda": "", "deepspeed": None})
    assert res["torch"] == "2.13.0" and res["builds"] == {"coord": "cpu", "w1": "cpu"}
    assert res["table"].splitlines()[0].split()[:3] == ["HOST", "PYTHON", "ACCEL"]


def test_select_stack_error_names_host_variable_and_fix():
    with pytest.raises(AnsibleFilterError) as err:
        select_stack({"coord": CPU, "a30": A30}, {"torch": "2.13.0"})
    msg = str(err.value)
    assert "a30: stack_torch_version 2.13.0 needs driver >= 560.28.03" in msg and "Fix:" in msg


def test_select_stack_bad_matrix_extra_is_a_clear_error():
    with pytest.raises(AnsibleFilterError, match="stack_matrix_extra"):
        select_stack({"coord": CPU}, {}, {"torch": {"9.9": {"builds": ["cu999"]}}})


def test_nccl_filters():
    node = nccl_profile(TCP_FABRIC, "w1")
    assert node["profile"] == "tcp" and node["env"]["NCCL_SOCKET_IFNAME"] == "=eth0"
    job = nccl_job({"w1": node, "w2": nccl_profile(TCP_FABRIC, "w2")})
    assert job["env"] == node["env"] and job["node_local"] == {}
    with pytest.raises(AnsibleFilterError, match="host w1: nccl_profile=ib but the node has no active InfiniBand"):
        nccl_profile(TCP_FABRIC, "w1", "ib")
    with pytest.raises(AnsibleFilterError, match="different NCCL profiles"):
        nccl_job({"w1": node, "w2": dict(node, profile="ib", reason="x")})
