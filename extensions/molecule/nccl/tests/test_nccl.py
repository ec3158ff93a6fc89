"""NCCL settings chosen from the fixture fabrics: ib on the workers, tcp on the coordinator."""
import json
import os
import subprocess

WORKERS = {"mndsm-nccl-worker1", "mndsm-nccl-worker2"}
# podman exec straight into the nodes (much faster than an ansible run per command).
testinfra_hosts = ["podman://%s" % name for name in ["mndsm-nccl-coord"] + sorted(WORKERS)]
HCA = "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"


def conf(host, path):
    out = {}
    for line in host.file(path).content_string.splitlines():
        if line.strip() and not line.startswith("#"):
            key, value = line.split("=", 1)
            out[key] = value
    return out


def is_worker(host):
    return host.backend.get_hostname() in WORKERS


def test_nccl_conf_follows_the_fabric(host):
    nccl = host.file("/etc/nccl.conf")
    assert nccl.mode == 0o644
    values = conf(host, "/etc/nccl.conf")
    assert values["NCCL_SOCKET_IFNAME"] == "=eth0"
    if is_worker(host):
        assert values["NCCL_IB_DISABLE"] == "0"
        assert values["NCCL_IB_HCA"] == HCA
        assert "NCCL_IB_GID_INDEX" not in values
    else:
        assert values == {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "=eth0"}


def test_memlock_unlimited_only_for_rdma(host):
    limits = host.file("/etc/security/limits.d/90-multinode-deepspeed-memlock.conf")
    dropin = host.file("/etc/systemd/system.conf.d/90-multinode-deepspeed-memlock.conf")
    if is_worker(host):
        lines = [line.split()[:4] for line in limits.content_string.splitlines() if line and not line.startswith("#")]
        assert ["*", "soft", "memlock", "unlimited"] in lines and ["*", "hard", "memlock", "unlimited"] in lines
        assert "DefaultLimitMEMLOCK=infinity" in dropin.content_string
    else:
        assert not limits.exists and not dropin.exists


def test_every_node_has_the_same_job_variables(host):
    job = conf(host, "/etc/multinode-deepspeed/deepspeed_env")
    assert job == {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": HCA,
                   "NCCL_SOCKET_IFNAME": "=eth0"}


def test_launcher_env_file_parses_as_deepspeed_reads_it(host):
    if is_worker(host):
        assert not host.file("/home/deepspeed/.deepspeed_env").exists
        return
    # DeepSpeed's runner splits every line at the first '=' (no comments, no blank lines).
    exported = {}
    for line in host.file("/home/deepspeed/.deepspeed_env").content_string.splitlines():
        key, value = line.split("=", maxsplit=1)
        exported[key] = value
    assert exported["NCCL_IB_HCA"] == HCA and exported["NCCL_IB_DISABLE"] == "0"


def module_facts(host, module, args=""):
    """Run one of the collection's modules on the node through Ansible, return its facts."""
    cmd = ["ansible", host.backend.get_hostname(), "-i", os.environ["MOLECULE_INVENTORY_FILE"], "-m", module,
           "-a", args, "-o"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.split(" => ", 1)[1])["ansible_facts"]


def test_accelerator_facts_from_the_fake_nvidia_smi(host):
    acc = module_facts(host, "multinode.deepspeed.accelerator_facts")["multinode_accelerators"]
    if is_worker(host):
        assert acc["status"] == "ok" and acc["count"] == 8
        assert acc["names"] == ["NVIDIA H100 80GB HBM3"] and acc["cuda_driver_version"] == "12.4"
    else:
        assert acc["status"] == "absent" and acc["count"] == 0


def test_fabric_facts_from_the_fixture_tree(host):
    root = "/opt/mnds-fixtures/sysfs" if is_worker(host) else "/sys"
    fabric = module_facts(host, "multinode.deepspeed.fabric_facts", "sysfs_root=%s" % root)["multinode_fabric"]
    if is_worker(host):
        assert fabric["rdma_active_ports"] == ["mlx5_0:1", "mlx5_1:1", "mlx5_2:1", "mlx5_3:1"]
    else:
        assert fabric["rdma_active_ports"] == []
