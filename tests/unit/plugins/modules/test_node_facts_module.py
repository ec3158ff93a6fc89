import socket


from ansible_collections.multinode.deepspeed.plugins.modules import node_facts
from tests.unit.plugins.module_utils.provision.test_node import DISTS, make_venv


def test_merges_the_provisioned_files_later_wins(tmp_path, run_module):
    nccl = tmp_path / "deepspeed_env"
    nccl.write_text("NCCL_IB_DISABLE=1\nNCCL_SOCKET_IFNAME==eth0\nGLOO_SOCKET_IFNAME=eth0\n")
    stack = tmp_path / "stack.env"
    stack.write_text("# written by the stack role\nCUDA_HOME=/usr/local/cuda-13.0\nGLOO_SOCKET_IFNAME=ens5\n")
    venv, lib = make_venv(tmp_path, DISTS)
    res = run_module(node_facts, {"paths": [str(nccl), str(tmp_path / "missing"), str(stack)], "venv": venv,
                                  "trainer_dir": lib, "nvidia_smi": str(tmp_path / "no-nvidia-smi"), "port": ""})
    facts = res["ansible_facts"]
    assert res["changed"] is False and facts["multinode_node"]["files"] == [str(nccl), str(stack)]
    assert facts["multinode_node_env"] == {
        "NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "=eth0", "GLOO_SOCKET_IFNAME": "ens5",
        "CUDA_HOME": "/usr/local/cuda-13.0"}
    node = facts["multinode_node"]
    assert node["versions"]["deepspeed"] == "0.19.8" and node["versions"]["cuda"] == "12.6"
    assert len(node["stack_fingerprint"]) == 16 and node["memtotal_mb"] > 0
    assert "port" not in node
    assert facts["multinode_accelerators"]["status"] == "absent"


def test_no_files_no_venv_and_a_taken_port(tmp_path, run_module):
    sock = socket.socket()
    sock.bind(("", 0))
    sock.listen(1)
    try:
        res = run_module(node_facts, {"paths": [str(tmp_path / "none")], "venv": str(tmp_path / "none"),
                                      "nvidia_smi": str(tmp_path / "none"), "port": sock.getsockname()[1]})
    finally:
        sock.close()
    node = res["ansible_facts"]["multinode_node"]
    assert res["ansible_facts"]["multinode_node_env"] == {} and node["files"] == []
    assert "no venv" in node["versions"]["error"] and node["stack_fingerprint"] is None
    assert node["port_free"] is False and "is not free" in node["port_error"]


def test_the_run_accounts_uid():
    from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.node_read import user_id
    assert user_id("root") == 0
    assert user_id("no-such-account-mnds") is None


def test_a_job_variable_file_that_cannot_be_read_fails_the_module(tmp_path, run_module, monkeypatch):
    from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import node_read
    env = tmp_path / "deepspeed_env"
    env.write_text("A=1\n")

    def refuse(path, *args):
        raise IOError(13, "Permission denied")
    monkeypatch.setattr(node_read, "open", refuse, raising=False)
    res = run_module(node_facts, {"paths": [str(env)], "venv": str(tmp_path), "nvidia_smi": str(tmp_path / "none")})
    assert res["failed"] is True and res["msg"] == "cannot read %s: [Errno 13] Permission denied" % env


def test_which_finds_commands_as_get_bin_path(tmp_path, monkeypatch):
    from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import node_read
    tool = tmp_path / "tool"
    tool.write_text("#!/bin/sh\necho out; echo err >&2; exit 3\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert node_read.which("tool") == str(tool) and node_read.which("no-such-tool-mnds") is None
    assert node_read.run([str(tool)]) == (3, "out\n", "err\n")
    assert node_read.run([str(tmp_path / "missing")])[0] == 2
