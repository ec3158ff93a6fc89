"""What reaches DeepSpeed's command line is checked in the plan (issue 26): a node's address, the run's own
.deepspeed_env, a checkpoint directory per model and weights, and the start and queue allowances."""
import datetime

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import (
    JobError, address_problems, checkpoint_dir, plan, start_timeouts)
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.node import launcher_env

NOW = datetime.datetime(2026, 11, 25, 7, 0, 0)


def worker(addr):
    return {"slots": 1, "gpus": 0, "accelerator": None, "address": addr, "memtotal_mb": 4096, "interface": "eth0",
            "env": {"NCCL_SOCKET_IFNAME": "=eth0"}}


@pytest.mark.parametrize("addr", ["10.0.0.1$(touch /tmp/p)", "10.0.0.1 --x", "a;b", "`id`", "-oProxyCommand=x",
                                  "host_name", "a..b", "x" * 64 + ".org"])
def test_an_address_that_is_not_one_is_refused_naming_the_host(addr):
    workers = {"worker1": worker(addr), "worker2": worker("10.0.0.2")}
    with pytest.raises(JobError) as err:
        plan({}, workers, ["coord"], NOW, backends)
    assert "host worker1: ansible_host=" in str(err.value) and "Fix: set ansible_host for worker1" in str(err.value)


@pytest.mark.parametrize("addr", ["10.0.0.1", "fd00::11", "gpu1", "gpu-1.rack2.example.org", "node1.", None])
def test_ip_addresses_and_host_names_pass(addr):
    assert address_problems({"w": worker(addr)}, ["w"]) == []
    job = plan({}, {"worker1": worker(addr), "worker2": worker("10.0.0.2")}, ["coord"], NOW, backends)
    assert job["master_addr"] == (addr or "worker1")


def test_only_rank_hosts_addresses_are_judged():
    assert address_problems({"w": worker("a b"), "x": worker("10.0.0.1")}, ["x"]) == []


def test_the_launcher_reads_the_runs_own_env_file_not_the_home_one():
    job = plan({"run_id": "r1"}, {"worker1": worker("10.0.0.1")}, ["coord"], NOW, backends)
    assert job["env"]["DS_ENV_FILE"] == job["run_dir"] + "/.deepspeed_env"
    # An absolute name: DeepSpeed joins it to ~ and '.', and os.path.join keeps the absolute one both times.
    assert launcher_env(job["env"])["DS_ENV_FILE"].startswith("/")


def test_checkpoints_of_different_weights_never_share_a_directory():
    base = {"model": "llama", "shared_dir": "/s"}
    assert checkpoint_dir(base) == "/s/checkpoints/llama"
    a, b = checkpoint_dir(dict(base, model_path="/w/a")), checkpoint_dir(dict(base, model_path="/w/b"))
    assert a != b and a.startswith("/s/checkpoints/llama-") and a == checkpoint_dir(dict(base, model_path="/w/a"))
    job = plan({"model_path": "/w/a", "model": "llama"}, {"worker1": worker("10.0.0.1")}, ["coord"], NOW, backends)
    assert job["checkpoint_dir"] == "/srv/multinode-deepspeed/checkpoints/" + a.rsplit("/", 1)[1]
    assert job["checkpoint_lock"] == job["checkpoint_dir"] + ".lock"


def test_start_and_queue_allowances():
    problems = []
    assert start_timeouts({}, 3600, problems) == (300, None) and problems == []
    assert start_timeouts({"startup_timeout": "900", "queue_timeout": "7200"}, 3600, problems) == (900, 7200)
    assert problems == []
    # The default (300 s) fits any timeout: -e timeout=20 alone is a valid run.
    assert start_timeouts({}, 20, problems) == (300, None) and problems == []
    start_timeouts({"startup_timeout": "3600"}, 3600, problems)
    start_timeouts({"startup_timeout": "5", "queue_timeout": "soon"}, 3600, problems)
    assert [p.split(" ")[0] for p in problems] == ["startup_timeout=3600", "startup_timeout=5", "queue_timeout=soon"]
    assert all("Fix: -e" in p for p in problems)


def test_the_plan_carries_the_allowances():
    job = plan({"startup_timeout": 120, "queue_timeout": 600}, {"worker1": worker("10.0.0.1")}, ["coord"], NOW, backends)
    assert (job["startup_timeout"], job["queue_timeout"]) == (120, 600)
    with pytest.raises(JobError, match="queue_timeout=0 must be a whole number >= 10"):
        plan({"queue_timeout": 0}, {"worker1": worker("10.0.0.1")}, ["coord"], NOW, backends)
