"""Bad inputs fail before anything starts on the nodes, naming what is wrong and the fix (issue 4 (e)).

Every case runs train.yml against the provisioned local cluster and checks that the play stops with
its message and that no run directory was created on the shared storage.
"""
import json
import subprocess
import time
from pathlib import Path

import pytest
from e2e_nodes import INVENTORY, fake_gpu, node_name, remove_fake_gpu

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


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
    # A path on the controller (the play reads it there and writes it into the run directory).
    ("invalid-ds-json", ["ds_config=BAD_DS_JSON"], None, ["ds_config=", "bad-ds.json is not JSON", "Fix: correct"]),
    # Issue 44, point 9: what DeepSpeed rejects at engine start, refused before launch (its own checks, on a worker).
    ("ds-config-batch-as-text", ["ds_config=BAD_DS_JSON"], None,
     ['ds_config: train_batch_size is "sixteen"', "set train_batch_size to a whole number of at least 1"]),
    ("ds-config-zero-stage-7", ["ds_config=BAD_DS_JSON"], None,
     ["ds_config: zero_optimization.stage 7", "set zero_optimization.stage to one of 0, 1, 2, 3"]),
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


BAD_DS_JSON = {"invalid-ds-json": '{"zero_optimization": {stage: 3}',
               "ds-config-batch-as-text": '{"train_batch_size": "sixteen"}',
               "ds-config-zero-stage-7": '{"zero_optimization": {"stage": 7}}'}


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
    if "BAD_DS_JSON" in " ".join(extra):
        (tmp_path / "bad-ds.json").write_text(BAD_DS_JSON[name])
        extra = [e.replace("BAD_DS_JSON", str(tmp_path / "bad-ds.json")) for e in extra]
    if name.startswith("port-in-use"):
        holder = subprocess.Popen(
            ["podman", "exec", node_name("worker1"), "python3", "-c",
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
            podman("exec", node_name("worker1"), "pkill", "-f", "s.bind\\(\\(''.29611")
    assert res.rc != 0, res.tail()
    flat = " ".join(res.out.split())
    for fragment in expected:
        assert fragment in flat, f"{fragment!r} not in the output:\n{res.tail(30)}"
    assert podman("exec", node_name("coord"), "test", "-e", f"/shared/runs/{run_id}").returncode != 0
    assert "Start the run's agent" not in res.out


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


# Issue 15: more values a real user types. The plan names every bad value of a play at once, so each group is one
# play (a few seconds), and each value in it has its own message and fix (docs/bad-inputs.md).
GROUPS = [
    ("plan-values-1",
     {"steps": "-5", "timeout": "1h", "run_id": "my run", "resume": "maybe", "preflight": "sometimes",
      "hosts": "worker1,worker1", "master_port": "29500.5", "deepspeed_rank_env": "NCCL_DEBUG=INFO",
      "secret_env": "WANDB_API_KEY=abc"},
     ["steps=-5 must be a whole number >= 1", "timeout=1h must be a whole number >= 10",
      "run_id='my run': letters, digits", "resume=maybe is not a yes/no value",
      "preflight=sometimes is not a yes/no value", "hosts lists worker1 twice",
      "master_port=29500.5 must be a whole number in 1024-65535", "deepspeed_rank_env must be a mapping",
      "secret_env must be a mapping"]),
    ("plan-values-2",
     {"steps": "100000000000", "timeout": "300", "stall_timeout": "600", "run_id": "r\u00fcn-\u00e9t\u00e9",
      "model": "llama tiny", "args": "--steps 5 --checkpoint-dir=/tmp/x",
      "deepspeed_rank_env": {"WANDB_API_KEY": "k", "RANK": "3"}, "shared_dir_path": "/shared/my runs"},
     ["steps=100000000000 is more than 1000000000", "stall_timeout=600 is not shorter than timeout=300",
      "run_id='r\u00fcn-\u00e9t\u00e9': letters, digits", "model='llama tiny' is not a model name",
      "args sets --steps, which the plan sets itself. Fix: -e steps=<value> instead", "args sets --checkpoint-dir",
      "deepspeed_rank_env: WANDB_API_KEY looks like a secret", "deepspeed_rank_env: RANK is set by the run itself",
      "shared_dir_path='/shared/my runs' must be an absolute path"]),
    ("plan-values-3",
     {"resume": "true", "entrypoint": "/shared/user/train_mlp.py", "exclude": "worker2,worker2"},
     ["resume=true is the bundled trainer's, and entrypoint=/shared/user/train_mlp.py is your own script",
      "exclude lists worker2 twice"]),
    ("trainer-options",
     {"args": "--micro-batch 0 --lr nan --seq-len 100000 --print-every 0 --warmup -3"},
     ["--micro-batch 0 must be at least 1", "--lr nan is not a learning rate",
      "--seq-len 100000 is longer than llama-tiny can attend to (512 positions)", "--print-every 0 must be at least 1",
      "--warmup -3 must be at least 0"]),
]


@pytest.mark.parametrize("group", GROUPS, ids=[g[0] for g in GROUPS])
def test_more_bad_values_each_named_with_its_fix(provisioned, run_playbook, tmp_path, group):
    name, values, expected = group
    values = dict(values)
    values.setdefault("run_id", f"e2e-bad-{name}-{int(time.time())}")
    extra = tmp_path / "vars.json"
    extra.write_text(json.dumps(values))
    res = run_playbook("train.yml", "-e", f"@{extra}", name=f"bad-{name}")
    assert res.rc != 0, res.tail()
    flat = " ".join(res.out.split())
    missing = [f for f in expected if f not in flat]
    assert not missing, f"{missing} not in the output:\n{res.tail(30)}"
    assert flat.count("Fix:") >= len(expected)
    assert "Start the run's agent" not in res.out
    assert podman("exec", node_name("coord"), "sh", "-c", "ls /shared/runs | grep -c '^e2e-bad-%s' || true" % name
                  ).stdout.strip() in ("", "0")


def test_more_ranks_than_gpus_fails_naming_the_host(provisioned, run_playbook, tmp_path):
    fake_gpu("worker1", "a30-2")
    inventory = inventory_with(tmp_path, "worker1", "deepspeed_slots: 4\n          deepspeed_accelerator: cuda")
    try:
        res = run_playbook("train.yml", "-e", f"run_id=e2e-bad-slots-{int(time.time())}", inventory=inventory,
                           name="bad-slots-beyond-gpus")
    finally:
        remove_fake_gpu("worker1")
    assert res.rc != 0
    flat = " ".join(res.out.split())
    assert "host worker1: deepspeed_slots=4, but it has 2 GPU(s)" in flat and "Fix: deepspeed_slots <= 2" in flat, \
        res.tail(30)
    assert "Start the run's agent" not in res.out
