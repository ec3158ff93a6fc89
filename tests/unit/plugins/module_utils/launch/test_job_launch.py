"""What the plan now carries for preflight and launch: the all-reduce test's argv per rank node, the bundled
trainer's dry run, every agent's argv and the SSH targets per node (module_utils/plan/job.py and backends/)."""
import json
import datetime

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import JobError, plan
from ansible_collections.multinode.deepspeed.plugins.module_utils.common.lease import lease_timeout

NOW = datetime.datetime(2026, 11, 23, 17, 0, 5)
VENV = "/opt/multinode-deepspeed/venv"
PY = VENV + "/bin/python"


def worker(addr, slots=1, gpus=0, accel=None, mem=4096, answered=None):
    return {"slots": slots, "gpus": gpus, "accelerator": accel, "address": addr, "memtotal_mb": mem,
            "interface": "eth0", "env": {"NCCL_SOCKET_IFNAME": "=eth0"}, "answered": answered}


def cpu_workers(**kw):
    return {"worker1": worker("10.89.0.11", **kw), "worker2": worker("10.89.0.12", **kw)}


def gpu_workers():
    return {"worker1": worker("10.89.0.11", slots=2, gpus=2), "worker2": worker("10.89.0.12", slots=4, gpus=4)}


def value_of(argv, opt):
    return argv[argv.index(opt) + 1]


# --------------------------------------------------------------------------- allreduce

def test_allreduce_argv_for_cpu_ranks():
    job = plan({}, cpu_workers(), ["coord"], NOW, backends)
    assert set(job["allreduce"]) == {"worker1", "worker2"}
    assert job["allreduce"]["worker2"] == [
        PY, "-m", "multinode_ds.allreduce_perf", "--master-addr", "10.89.0.11", "--master-port", "29500",
        "--world-size", "2", "--first-rank", "1", "--nproc", "1", "--backend", "gloo", "--node", "worker2"]
    assert value_of(job["allreduce"]["worker1"], "--first-rank") == "0"


def test_allreduce_argv_for_gpu_ranks_follows_the_layout():
    job = plan({"master_port": "29611", "venv": "/venvs/ds"}, gpu_workers(), ["coord"], NOW, backends)
    assert job["accelerator"] == "cuda" and job["world_size"] == 6
    for host, first, nproc in (("worker1", "0", "2"), ("worker2", "2", "4")):
        argv = job["allreduce"][host]
        assert argv[:3] == ["/venvs/ds/bin/python", "-m", "multinode_ds.allreduce_perf"]
        assert value_of(argv, "--first-rank") == first and value_of(argv, "--nproc") == nproc
        assert value_of(argv, "--backend") == "nccl" and value_of(argv, "--node") == host
        assert value_of(argv, "--world-size") == "6" and value_of(argv, "--master-port") == "29611"
        assert value_of(argv, "--master-addr") == "10.89.0.11"


def test_allreduce_argv_only_for_the_included_hosts():
    workers = dict(cpu_workers(), worker3=worker("10.89.0.13"))
    job = plan({"exclude": "worker1"}, workers, ["coord"], NOW, backends)
    assert sorted(job["allreduce"]) == ["worker2", "worker3"]
    assert value_of(job["allreduce"]["worker3"], "--master-addr") == "10.89.0.12"
    assert value_of(job["allreduce"]["worker3"], "--first-rank") == "1"


# --------------------------------------------------------------------------- dry run

def test_dry_run_is_none_for_a_user_entrypoint():
    job = plan({"entrypoint": "/shared/user/train.py"}, cpu_workers(), ["coord"], NOW, backends)
    assert job["metrics"] is False and job["dry_run"] is None


def test_dry_run_of_the_bundled_trainer():
    job = plan({"steps": 7, "args": "--print-every 2",
                "user_inputs": {"ds_config": {"zero_optimization": {"stage": 1}}, "ds_config_source": "/ctl/ds.json"}},
               cpu_workers(mem=8192), ["coord"], NOW, backends)
    argv = job["dry_run"]
    assert argv[:6] == [PY, "-m", "multinode_ds.train", "--dry-run", "--world-size", "2"]
    assert float(value_of(argv, "--memory-gib")) == 8.0
    # The rest is the trainer's own arguments, without "--module multinode_ds.train".
    assert argv[argv.index("--memory-gib") + 2:] == job["program"][2:]
    assert "--module" not in argv and value_of(argv, "--steps") == "7"
    # The user's config (read on the controller) is written into the run directory; the trainer merges it.
    assert value_of(argv, "--ds-config") == job["run_dir"] + "/ds_config.user.json" and argv[-2:] == ["--print-every", "2"]
    assert json.loads(job["ds_config"]["text"]) == {"zero_optimization": {"stage": 1}}
    assert job["ds_config"]["source"] == "/ctl/ds.json"
    # Issue 44, point 9: DeepSpeed's own checks run before launch for the bundled trainer too, on the config it
    # merges (the user's, in the run directory).
    assert job["ds_check"][:3] == [PY, "-m", "multinode_ds.ds_check"]


def test_dry_run_memory_is_the_smallest_node_over_the_most_slots():
    workers = {"worker1": worker("10.89.0.11", slots=2, mem=16384), "worker2": worker("10.89.0.12", slots=1,
                                                                                      mem=8192)}
    job = plan({}, workers, ["coord"], NOW, backends)
    assert job["world_size"] == 3 and value_of(job["dry_run"], "--world-size") == "3"
    assert float(value_of(job["dry_run"], "--memory-gib")) == 4.0


@pytest.mark.parametrize("mem", [None, 0])
def test_dry_run_without_a_workers_memory_has_no_memory_bound(mem):
    workers = {"worker1": worker("10.89.0.11"), "worker2": worker("10.89.0.12", mem=mem)}
    job = plan({}, workers, ["coord"], NOW, backends)
    assert job["rank_memory_gib"] is None
    assert job["dry_run"][:6] == [PY, "-m", "multinode_ds.train", "--dry-run", "--world-size", "2"]
    assert "--memory-gib" not in job["dry_run"] and job["dry_run"][6:] == job["program"][2:]


# --------------------------------------------------------------------------- launch: agents and SSH

def test_pdsh_agent_argv_for_the_launcher_and_the_watchers():
    job = plan({"timeout": 900}, cpu_workers(), ["coord"], NOW, backends)
    launch = job["launch"]
    assert sorted(launch["agent_argv"]) == sorted(launch["agents"]) == ["coord", "worker1", "worker2"]
    head = [PY, "-m", "multinode_ds.agent", "--run-dir", job["run_dir"]]
    coord = launch["agent_argv"]["coord"]
    assert coord[:5] == head and value_of(coord, "--host") == "coord" and value_of(coord, "--max-time") == "900"
    assert coord[coord.index("--") + 1:] == launch["argv"]["coord"]
    # pdsh itself is the launcher (no runner whose SIGTERM handler pkills every run's launchers): the first signal
    # is the default SIGTERM.
    assert coord[coord.index("--") + 1] == "pdsh" and "--stop-signal" not in coord
    for host in ("worker1", "worker2"):
        argv = launch["agent_argv"][host]
        assert "--" not in argv
        # A rank node's agent keeps the node's warm process for its ranks; the coordinator's, which runs none, not.
        assert argv == head + ["--run-id", job["run_id"], "--host", host, "--max-time", "900", "--lease-timeout",
                               "%g" % lease_timeout(), "--leftover-grace", "5", "--warm"]
    assert "--warm" not in coord


def test_ssh_free_agent_argv_all_launch():
    job = plan({"backend": "ssh-free"}, cpu_workers(), ["coord"], NOW, backends)
    launch = job["launch"]
    assert sorted(launch["agent_argv"]) == ["worker1", "worker2"]
    for host in ("worker1", "worker2"):
        argv = launch["agent_argv"][host]
        assert argv.count("--") == 1
        assert argv[argv.index("--") + 1:] == launch["argv"][host]
        assert argv[argv.index("--") + 1:][1:4] == ["-u", "-m", "multinode_ds.node_launcher"]  # warm ranks
        assert "--stop-signal" not in argv[:argv.index("--")]
    assert value_of(launch["agent_argv"]["worker2"], "--node_rank") == "1"


def test_pdsh_ssh_targets():
    job = plan({}, cpu_workers(), ["coord"], NOW, backends)
    # Only the coordinator logs in (issue 26): a rank node holds no key and reaches no node over SSH.
    assert job["launch"]["ssh_targets"] == {"coord": ["coord", "worker1", "worker2"]}


def test_pdsh_ssh_targets_with_the_coordinator_a_worker_too():
    job = plan({}, cpu_workers(), ["worker1"], NOW, backends)
    assert job["launch"]["ssh_targets"] == {"worker1": ["worker1", "worker2"]}
    assert job["launch"]["agents"] == ["worker1", "worker2"]


def test_ssh_free_has_no_ssh_targets():
    job = plan({"backend": "ssh-free"}, cpu_workers(), ["coord"], NOW, backends)
    assert job["launch"]["ssh_targets"] == {} and job["launch"]["ssh_pairs"] == []


def test_ssh_targets_of_the_backend_directly():
    job = {"coordinators": ["c1"], "rank_hosts": ["a", "b"]}
    assert backends.get("pdsh").ranks.ssh_targets(job) == {"c1": ["c1", "a", "b"]}
    assert backends.get("ssh-free").ranks.ssh_targets(job) == {}


# --------------------------------------------------------------------------- a worker that did not answer

def test_a_silent_rank_host_stops_the_plan():
    workers = {"worker1": worker("10.89.0.11", answered=True), "worker2": worker("10.89.0.12", answered=False)}
    with pytest.raises(JobError) as err:
        plan({}, workers, ["coord"], NOW, backends)
    msg = str(err.value)
    assert msg.startswith("worker2 did not answer")
    assert "-e exclude=worker2" in msg and "worker1" in msg


def test_several_silent_hosts_are_all_named():
    workers = {"worker1": worker("10.89.0.11", answered=False), "worker2": worker("10.89.0.12", answered=False)}
    with pytest.raises(JobError) as err:
        plan({}, workers, ["coord"], NOW, backends)
    assert "-e exclude=worker1,worker2" in str(err.value)


def test_a_silent_host_left_out_of_the_job_is_fine():
    workers = dict(cpu_workers(answered=True), worker3=worker("10.89.0.13", answered=False))
    job = plan({"exclude": "worker3"}, workers, ["coord"], NOW, backends)
    assert job["rank_hosts"] == ["worker1", "worker2"]
    # answered None (not asked) is not a silent node.
    assert plan({}, cpu_workers(), ["coord"], NOW, backends)["rank_hosts"] == ["worker1", "worker2"]
