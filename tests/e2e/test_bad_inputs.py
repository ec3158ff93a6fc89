"""Bad inputs fail before anything starts on the nodes, naming what is wrong and the fix (issue 4 (e)).

Every case runs train.yml against the provisioned local cluster and checks that the play stops with
its message and that no run directory was created on the shared storage.
"""
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
INVENTORY = ROOT / "inventories" / "local" / "hosts.yml"


def podman(*args, **kw):
    env = {"CONTAINERS_CONF": str(ROOT / ".cache" / "podman" / "containers.conf"), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, check=False, **kw)


def inventory_with(tmp_path, host, line):
    """The local inventory with one more host variable."""
    text = INVENTORY.read_text()
    marker = f"        {host}:\n"
    assert marker in text
    inv = tmp_path / "hosts.yml"
    inv.write_text(text.replace(marker, marker + f"          {line}\n"))
    return inv


CASES = [
    # (id, extra vars, inventory change, expected message fragments)
    ("unknown-model", ["model=gpt5"], None, ["invalid choice: 'gpt5'", "llama-tiny"]),
    ("model-too-big", ["model=llama"], None, ["needs about", "-e model=llama-tiny"]),
    ("steps-zero", ["steps=0"], None, ["steps=0", "whole number >= 1"]),
    ("bad-port", ["master_port=99999"], None, ["master_port=99999", "1024-65535"]),
    ("bad-backend", ["backend=mpi"], None, ["backend=mpi is not a launch backend", "-e backend=ssh-free"]),
    ("missing-entrypoint", ["entrypoint=/shared/nope.py"], None,
     ["entrypoint=/shared/nope.py does not exist", "Fix: put the script"]),
    ("missing-data", ["args='--data /shared/no-such-corpus'"], None, ["does not exist on this node"]),
    ("host-not-in-inventory", ["hosts=worker1,worker9"], None,
     ["host worker9 is named in include/exclude", "candidate hosts"]),
    ("zero-slots", [], ("worker2", "deepspeed_slots: 0"), ["host worker2: slots=0", "at least one slot"]),
    ("text-slots", [], ("worker1", "deepspeed_slots: two"), ["host worker1: slots='two' is not a whole number"]),
    ("coordinator-is-worker", [], None, ["coord is in both the coordinator and the workers group"]),
    ("invalid-ds-json", ["ds_config=/shared/bad-ds.json"], None, ["is not valid JSON"]),
    # Preflight (on by default) finds it first; with -e preflight=false the launch's own port check does.
    ("port-in-use", ["master_port=29611"], None,
     ["master_port on worker1: port 29611 is not free on the master", "-e master_port=<a free port>",
      "Preflight failed"]),
    ("port-in-use-no-preflight", ["master_port=29611", "preflight=false"], None,
     ["master_port=29611 is already in use on worker1", "-e master_port=<a free port>"]),
    ("slurm-bad-partition-name", ["backend=slurm", "slurm_partition=gpu;reboot"], None,
     ["slurm_partition='gpu;reboot' is not a Slurm name", "Fix: -e slurm_partition=<name>"]),
    # Preflight asks Slurm itself (sinfo on the coordinator).
    ("slurm-unknown-partition", ["backend=slurm", "slurm_partition=a100", "preflight_bandwidth=false"], None,
     ["slurm partition on coord: partition a100 does not exist (sinfo shows gpu)", "-e slurm_partition=<one of gpu>",
      "Preflight failed"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_fails_before_the_nodes_change(provisioned, run_playbook, tmp_path, case):
    name, extra, inv_change, expected = case
    inventory = None
    holder = None
    if inv_change:
        inventory = inventory_with(tmp_path, *inv_change)
    if name == "coordinator-is-worker":
        text = INVENTORY.read_text().replace("    workers:\n      hosts:\n",
                                             "    workers:\n      hosts:\n        coord: {}\n")
        inventory = tmp_path / "hosts.yml"
        inventory.write_text(text)
    if name == "invalid-ds-json":
        podman("exec", "mnds-coord", "sh", "-c", "printf '{\"zero_optimization\": {stage: 3}' > /shared/bad-ds.json")
    if name.startswith("port-in-use"):
        holder = subprocess.Popen(
            ["podman", "exec", "mnds-worker1", "python3", "-c",
             "import socket,time; s=socket.socket(); s.bind(('',29611)); s.listen(1); time.sleep(90)"],
            env={"CONTAINERS_CONF": str(ROOT / ".cache" / "podman" / "containers.conf"), "PATH": "/usr/bin:/bin"})
        time.sleep(2)
    run_id = f"e2e-bad-{name}-{int(time.time())}"
    args = []
    for e in extra + [f"run_id={run_id}"]:
        args += ["-e", e]
    try:
        res = run_playbook("train.yml", *args, inventory=inventory, name=f"bad-{name}")
    finally:
        if holder:
            holder.kill()
            podman("exec", "mnds-worker1", "pkill", "-f", "s.bind\\(\\(''.29611")
    assert res.rc != 0, res.tail()
    flat = " ".join(res.out.split())
    for fragment in expected:
        assert fragment in flat, f"{fragment!r} not in the output:\n{res.tail(30)}"
    assert podman("exec", "mnds-coord", "test", "-e", f"/shared/runs/{run_id}").returncode != 0
    assert "Start the run's agent" not in res.out


FIXTURES = ROOT / "tests" / "fixtures"
SITE_CASES = [
    # (id, extra vars, inventory change, expected message fragments) for site.yml (issue 3)
    ("unknown-nccl-profile", [], ("worker2", "nccl_profile: rdma"),
     ["host worker2: nccl_profile=rdma is not a profile", "Fix: set nccl_profile for worker2"]),
    ("nfs-server-not-in-inventory", ["shared_dir_provider=nfs", "nfs_server_host=nfs9"], None,
     ["nfs_server_host=nfs9 is not a host of this inventory", "Fix: set nfs_server_host"]),
    ("slurm-partition-node-not-a-worker", ["slurm=true", '{"slurm_partition_nodes": ["worker1", "worker9"]}'], None,
     ["slurm_partition_nodes lists worker9, which is not a worker of this inventory",
      "Fix: add worker9 to the workers group"]),
    ("slurm-cluster-name", ["slurm=true", "slurm_cluster_name=BigCluster"], None,
     ["slurm_cluster_name='BigCluster'", "Fix: -e slurm_cluster_name=<such a name>"]),
    ("torch-pin-driver-too-old", ["stack_torch_version=2.13.0"], ("worker2", "deepspeed_accelerator: cuda"),
     ["worker2: stack_torch_version 2.13.0 needs driver >= 560.28.03", "535.183.01",
      "Fix: upgrade the NVIDIA driver on worker2"]),
]


def fake_gpu(node, fixture):
    """A fake nvidia-smi on the node that prints captured output (tests/fixtures/nvidia-smi/<fixture>)."""
    name = f"mnds-{node}"
    podman("exec", name, "mkdir", "-p", "/opt/mnds-fixtures", "/etc/multinode-deepspeed-test")
    assert podman("cp", str(FIXTURES / "nvidia-smi" / fixture), f"{name}:/opt/mnds-fixtures/nvidia-smi").returncode == 0
    assert podman("cp", str(FIXTURES / "bin" / "nvidia-smi"), f"{name}:/usr/local/bin/nvidia-smi").returncode == 0
    podman("exec", name, "sh", "-c", "echo /opt/mnds-fixtures/nvidia-smi > /etc/multinode-deepspeed-test/nvidia-smi-fixture")


def remove_fake_gpu(node):
    podman("exec", f"mnds-{node}", "rm", "-rf", "/usr/local/bin/nvidia-smi", "/opt/mnds-fixtures",
           "/etc/multinode-deepspeed-test")


@pytest.mark.parametrize("case", SITE_CASES, ids=[c[0] for c in SITE_CASES])
def test_bad_inventory_value_fails_site_before_the_nodes_change(provisioned, run_playbook, tmp_path, case):
    name, extra, inv_change, expected = case
    inventory = inventory_with(tmp_path, *inv_change) if inv_change else None
    if name == "torch-pin-driver-too-old":
        fake_gpu("worker2", "a30-2")
    args = []
    for e in extra:
        args += ["-e", e]
    try:
        res = run_playbook("site.yml", *args, inventory=inventory, name=f"bad-site-{name}")
    finally:
        remove_fake_gpu("worker2")
    assert res.rc != 0, res.tail()
    flat = " ".join(res.out.split())
    for fragment in expected:
        assert fragment in flat, f"{fragment!r} not in the output:\n{res.tail(30)}"
    # It stopped before the play that changes the nodes, and nothing changed.
    assert "PLAY [Provision every node]" not in res.out
    assert all(r["changed"] == 0 for r in res.recap().values()), res.recap()
