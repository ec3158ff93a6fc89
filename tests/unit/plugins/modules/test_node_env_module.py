import json

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.multinode.deepspeed.plugins.modules import node_env


def run_module(capsys, args):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            node_env.main()
    return json.loads(capsys.readouterr().out)


def test_merges_the_provisioned_files_later_wins(tmp_path, capsys):
    nccl = tmp_path / "deepspeed_env"
    nccl.write_text("NCCL_IB_DISABLE=1\nNCCL_SOCKET_IFNAME==eth0\nGLOO_SOCKET_IFNAME=eth0\n")
    stack = tmp_path / "stack.env"
    stack.write_text("# written by the stack role\nCUDA_HOME=/usr/local/cuda-13.0\nGLOO_SOCKET_IFNAME=ens5\n")
    res = run_module(capsys, {"paths": [str(nccl), str(tmp_path / "missing"), str(stack)]})
    assert res["changed"] is False and res["files"] == [str(nccl), str(stack)]
    assert res["ansible_facts"]["multinode_node_env"] == {
        "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "=eth0", "GLOO_SOCKET_IFNAME": "ens5",
        "CUDA_HOME": "/usr/local/cuda-13.0"}


def test_no_files_no_variables(tmp_path, capsys):
    res = run_module(capsys, {"paths": [str(tmp_path / "none")]})
    assert res["ansible_facts"]["multinode_node_env"] == {} and res["files"] == []
