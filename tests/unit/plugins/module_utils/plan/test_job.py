"""The job plan and the launch backends: one plan, every value checked, backends as plug-ins."""
import datetime
import re
import shlex

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import DEFAULTS, JobError, host_list, plan
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.node import parse_env

NOW = datetime.datetime(2026, 11, 23, 17, 0, 5)
NCCL_ENV = {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "=eth0"}


def worker(addr, slots=1, gpus=0, accel=None, mem=4096, iface="eth0", env=None):
    return {"slots": slots, "gpus": gpus, "accelerator": accel, "address": addr, "memtotal_mb": mem,
            "interface": iface, "env": env if env is not None else dict(NCCL_ENV)}


WORKERS = {"worker1": worker("10.89.0.11"), "worker2": worker("10.89.0.12")}


def test_default_job_on_two_cpu_workers():
    job = plan({}, WORKERS, ["coord"], NOW, backends)
    assert job["run_id"] == "20261123-170005-000-llama-tiny"
    assert job["run_dir"] == "/srv/multinode-deepspeed/runs/20261123-170005-000-llama-tiny"
    # Two runs in the same second: the milliseconds and the job_plan action's random nonce tell them apart.
    same_second = plan({"run_nonce": "a1f3"}, WORKERS, ["coord"], NOW.replace(microsecond=250000), backends)
    assert same_second["run_id"] == "20261123-170005-250a1f3-llama-tiny"
    assert job["checkpoint_dir"] == "/srv/multinode-deepspeed/checkpoints/llama-tiny"
    assert job["hostfile"] == "worker1 slots=1\nworker2 slots=1\n"
    master = (job["world_size"], job["master"], job["master_addr"], job["master_port"])
    assert master == (2, "worker1", "10.89.0.11", 29500)
    assert job["accelerator"] == "cpu" and job["backend"] == "pdsh" and job["metrics"] is True
    assert job["first_ranks"] == {"worker1": 0, "worker2": 1} and job["rank_memory_gib"] == 4.0
    env = job["env"]
    assert env["DS_ACCELERATOR"] == "cpu" and env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_SOCKET_IFNAME"] == "=eth0" and env["PATH"].startswith("/opt/multinode-deepspeed/venv/bin:")
    assert job["program"][:4] == ["--module", "multinode_ds.train", "--model", "llama-tiny"]
    assert "--resume" not in job["program"]


def test_pdsh_backend_launches_from_the_coordinator():
    job = plan({"args": "--lr 0.001 --print-every '5'"}, WORKERS, ["coord"], NOW, backends)
    launch = job["launch"]
    assert launch["launchers"] == ["coord"] and launch["agents"] == ["coord", "worker1", "worker2"]
    argv = launch["argv"]["coord"]
    assert argv[:-1] == ["pdsh", "-S", "-R", "ssh", "-f", "1024", "-w", "worker1,worker2"]
    remote = shlex.split(argv[-1])
    # DeepSpeed's per-node launcher, forked from the node's warm process (multinode_ds.node_launcher).
    assert remote[remote.index("exec") + 1:][:4] == [
        "/opt/multinode-deepspeed/venv/bin/python", "-u", "-m", "multinode_ds.node_launcher"]
    assert "--master_addr=10.89.0.11" in remote and "--node_rank=%n" in remote
    # Each rank becomes the program from program.json: the user's arguments never reach pdsh's remote shell.
    run_dir = job["run_dir"]
    assert remote[-4:] == ["--module", "multinode_ds.rank", "--run-dir", run_dir]
    assert job["program"][-4:] == ["--lr", "0.001", "--print-every", "5"]
    assert not any("0.001" in a for a in argv)
    # The coordinator logs into every node; a rank node into none (issue 26: no key where no login starts).
    assert ["coord", "worker2"] in launch["ssh_pairs"] and ["worker1", "worker1"] not in launch["ssh_pairs"]
    assert launch["ranks_over_ssh"] is True


def test_ssh_free_backend_starts_every_rank_node():
    job = plan({"backend": "ssh-free", "entrypoint": "/shared/user/train.py"}, WORKERS, ["coord"], NOW, backends)
    launch = job["launch"]
    assert launch["launchers"] == ["worker1", "worker2"] and launch["agents"] == ["worker1", "worker2"]
    argv = launch["argv"]["worker2"]
    assert argv[1:4] == ["-u", "-m", "multinode_ds.node_launcher"] and argv[argv.index("--node_rank") + 1] == "1"
    assert argv[-4:] == ["--module", "multinode_ds.rank", "--run-dir", job["run_dir"]]
    assert launch["ssh_pairs"] == [] and launch["ranks_over_ssh"] is False
    # Cold ranks, a cold launcher: DeepSpeed's own, as deepspeed --no_ssh starts it.
    cold = plan({"backend": "ssh-free", "warm_start": "false"}, WORKERS, ["coord"], NOW, backends)
    assert cold["launch"]["argv"]["worker2"][1:4] == ["-u", "-m", "deepspeed.launcher.launch"]
    assert job["metrics"] is False and job["program"] == ["/shared/user/train.py"]


def test_an_unknown_backend_lists_the_known_ones():
    with pytest.raises(JobError) as err:
        plan({"backend": "mpi"}, WORKERS, ["coord"], NOW, backends)
    assert "backend=mpi is not a launch backend. Fix: -e backend=kubernetes or -e backend=pdsh or -e backend=slurm or -e backend=ssh-free" in str(err.value)
    assert set(backends.REGISTRY) == {"pdsh", "ssh-free", "slurm", "kubernetes"}


def test_every_bad_value_at_once():
    with pytest.raises(JobError) as err:
        plan({"steps": 0, "master_port": "80", "timeout": "soon", "save_interval": -1, "run_id": "../x",
              "entrypoint": "train.py", "args": "--name 'unbalanced"}, WORKERS, ["coord"], NOW, backends)
    msg = str(err.value)
    for part in ("steps=0 must be a whole number >= 1", "master_port=80 must be a whole number in 1024-65535",
                 "timeout=soon", "save_interval=-1", "run_id='../x'", "entrypoint='train.py' must be an absolute",
                 "args=\"--name 'unbalanced\" cannot be split"):
        assert part in msg, (part, msg)


def test_run_ids_that_could_escape_are_refused():
    for bad in ("a/b", "..", ".hidden", "-rf", "x y", "x\ny", "a" * 129, "x;rm -rf ~"):
        with pytest.raises(JobError, match="run_id="):
            plan({"run_id": bad}, WORKERS, ["coord"], NOW, backends)
    assert plan({"run_id": "exp_1.2-b"}, WORKERS, ["coord"], NOW, backends)["run_id"] == "exp_1.2-b"


def test_include_exclude_and_slots():
    workers = dict(WORKERS, worker3=worker("10.89.0.13", slots=None), gpu1=worker("10.0.0.5", slots=8, gpus=8))
    job = plan({"hosts": "worker2, gpu1"}, workers, ["coord"], NOW, backends)
    assert job["rank_hosts"] == ["worker2", "gpu1"] and job["world_size"] == 9
    assert host_list(["a", " b ", ""]) == ["a", "b"]
    with pytest.raises(JobError, match="host nope is named in include/exclude"):
        plan({"exclude": "nope"}, WORKERS, ["coord"], NOW, backends)
    with pytest.raises(JobError, match="no rank hosts are left"):
        plan({"exclude": "worker1,worker2"}, WORKERS, ["coord"], NOW, backends)
    with pytest.raises(JobError, match="no worker has GPUs"):
        plan({}, {"w": worker("10.0.0.1", slots=None)}, ["coord"], NOW, backends)


def test_accelerator_from_the_master():
    gpu = dict((n, worker(a, slots=4, gpus=4)) for n, a in (("g1", "10.0.0.1"), ("g2", "10.0.0.2")))
    assert plan({}, gpu, ["coord"], NOW, backends)["accelerator"] == "cuda"
    gpu["g1"]["accelerator"] = "cpu"
    assert plan({}, gpu, ["coord"], NOW, backends)["accelerator"] == "cpu"


def test_rank_env_precedence_and_validation():
    job = plan({"deepspeed_rank_env": {"NCCL_SOCKET_IFNAME": "=ib0", "WANDB_MODE": "offline"},
                "hf_token_set": True}, WORKERS, ["coord"], NOW, backends)
    assert job["env"]["NCCL_SOCKET_IFNAME"] == "=ib0" and job["env"]["WANDB_MODE"] == "offline"
    assert job["env"]["HF_TOKEN_PATH"] == "/opt/multinode-deepspeed/secrets/hf_token"
    for bad in ({"1BAD": "x"}, {"A B": "x"}, {"OK": "two\nlines"}, {"OK": None}):
        with pytest.raises(JobError, match="deepspeed_rank_env"):
            plan({"deepspeed_rank_env": bad}, WORKERS, ["coord"], NOW, backends)


def test_two_interfaces_leave_gloo_to_choose():
    workers = {"worker1": worker("10.89.0.11", iface="eth0"), "worker2": worker("10.89.0.12", iface="ens5")}
    assert "GLOO_SOCKET_IFNAME" not in plan({}, workers, ["coord"], NOW, backends)["env"]


def test_bundled_trainer_options():
    job = plan({"resume": True, "save_interval": "10", "model_path": "/m",
                "user_inputs": {"ds_config": {"gradient_clipping": 1.0}, "ds_config_source": "/home/u/ds.json"},
                "dataset": "wikitext", "model": "llama", "steps": "5"}, WORKERS, ["coord"], NOW, backends)
    prog = job["program"]
    assert prog[prog.index("--steps") + 1] == "5" and prog[prog.index("--save-interval") + 1] == "10"
    assert "--resume" in prog and prog[prog.index("--ds-config") + 1] == job["run_dir"] + "/ds_config.user.json"
    assert prog[prog.index("--dataset") + 1] == "wikitext"
    # With model_path, the checkpoint directory is the model's name and the path's (issue 26, point 6).
    assert re.fullmatch(r".*/checkpoints/llama-[0-9a-f]{12}", job["checkpoint_dir"])
    assert prog[prog.index("--checkpoint-dir") + 1] == job["checkpoint_dir"] == job["checkpoint_lock"][:-5]


def test_defaults_are_the_roles_paths():
    assert DEFAULTS["venv"] == DEFAULTS["home"] + "/venv"
    job = plan({"shared_dir": "/shared", "venv": "/srv/venv"}, WORKERS, ["coord"], NOW, backends)
    assert job["run_dir"].startswith("/shared/runs/") and " exec /srv/venv/bin/python -u " in \
        job["launch"]["argv"]["coord"][-1]


def test_parse_env_keeps_only_assignments():
    text = "NCCL_IB_DISABLE=1\n\n# a comment\nNCCL_SOCKET_IFNAME==eth0\nnot a line\n1X=2\nCUDA_HOME=/usr/local/cuda\n"
    assert parse_env(text) == {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "=eth0", "CUDA_HOME": "/usr/local/cuda"}
    assert parse_env(None) == {}
