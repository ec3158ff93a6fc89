"""The job plan's parts (module_utils/plan/job.py), each on its own: what each decides, and the problem it adds."""
import datetime

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan import job as J

NOW = datetime.datetime(2026, 11, 23, 17, 0, 5, 42000)


def worker(slots=1, gpus=0, accel=None, addr=None, mem=4096, iface="eth0", answered=None):
    return {"slots": slots, "gpus": gpus, "accelerator": accel, "address": addr, "memtotal_mb": mem,
            "interface": iface, "env": {}, "answered": answered}


def test_directories_default_and_refuse_paths_that_reach_a_shell():
    problems = []
    job = J.directories({"venv": "/x/venv"}, problems)
    assert problems == [] and job["venv"] == "/x/venv" and job["home"] == J.DEFAULTS["home"]
    assert list(job) == ["model", "shared_dir", "home", "venv", "torch_extensions_dir", "etc_dir"]
    J.directories({"home": "/a/../b", "model": "a/b"}, problems)
    assert len(problems) == 2 and problems[0].startswith("stack_home='/a/../b' must be an absolute path")
    assert problems[1].startswith("model='a/b' is not a model name")


def test_run_settings_read_the_numbers_and_switches():
    job, problems = {}, []
    J.run_settings(job, {"steps": "7", "timeout": "120", "resume": "yes", "stall_timeout": "60"}, problems)
    assert problems == [] and job == {"steps": 7, "master_port": 29500, "timeout": 120, "save_interval": 0,
                                      "resume": True, "stall_timeout": 60, "stall_floor": 10, "stall_ceiling": 1800,
                                      "warm_start": True,
                                      "straggler": {"threshold": 0.7, "steps": 10, "action": "warn"}}
    J.run_settings({}, {"preflight": "force"}, problems)
    assert problems == []
    cold = {}
    J.run_settings(cold, {"warm_start": "false"}, problems)
    assert problems == [] and cold["warm_start"] is False
    J.run_settings({}, {"preflight": "maybe", "master_port": 22, "warm_start": "sometimes"}, problems)
    assert [p.split(" ")[0] for p in problems] == ["master_port=22", "preflight=maybe", "warm_start=sometimes"]


def test_straggler_settings_are_checked_with_their_fix():
    problems = []
    assert J.straggler_settings({"straggler_threshold": "0.5", "straggler_steps": "30", "on_straggler": "Replace"},
                                problems) == {"threshold": 0.5, "steps": 30, "action": "replace"}
    assert problems == []
    J.straggler_settings({"straggler_threshold": "1.5", "straggler_steps": "0", "on_straggler": "kill"}, problems)
    assert [p.split(" ")[0] for p in problems] == ["straggler_threshold=1.5", "straggler_steps=0", "on_straggler=kill"]
    assert "Fix: -e straggler_threshold=0.7" in problems[0] and "Fix: -e on_straggler=warn" in problems[2]
    problems = []
    J.straggler_settings({"straggler_threshold": "slow"}, problems)
    assert problems[0].startswith("straggler_threshold=slow must be a number between 0 and 1")


def test_on_straggler_replace_needs_restarts():
    problems = []
    J.recovery_settings({"straggler": {"action": "replace"}}, {"restarts": "0"}, problems)
    assert problems == ["on_straggler=replace moves the run off a slow node in its next attempt, and restarts=0 "
                        "allows none. Fix: -e restarts=1 (or more), or -e on_straggler=warn"]
    problems = []
    J.recovery_settings({"straggler": {"action": "replace"}}, {"restarts": "1"}, problems)
    J.recovery_settings({"straggler": {"action": "warn"}}, {}, problems)
    assert problems == []


def test_stall_timeout_is_unset_or_shorter_than_the_timeout():
    problems = []
    assert J.stall_timeout({}, 100, problems) is None and J.stall_timeout({"stall_timeout": ""}, 100, problems) is None
    assert J.stall_timeout({"stall_timeout": 50}, 100, problems) == 50 and problems == []
    assert J.stall_timeout({"stall_timeout": 100}, 100, problems) == 100
    assert problems[0].startswith("stall_timeout=100 is not shorter than timeout=100")
    assert J.stall_timeout({"stall_timeout": 5}, 100, problems) is None and "stall_timeout=5" in problems[1]


def test_launch_backend_is_the_named_one_with_its_options():
    problems = []
    backend, options = J.launch_backend({"backend": "slurm", "slurm_partition": "debug"}, backends, problems)
    assert backend.NAME == "slurm" and options["partition"] == "debug" and problems == []
    backend, options = J.launch_backend({}, backends, problems)
    assert backend.NAME == backends.DEFAULT and options == {}
    assert J.launch_backend({"backend": "nope"}, backends, problems) == (None, {})
    assert problems[0].startswith("backend=nope is not a launch backend")


def test_run_id_for_is_the_users_or_a_new_one_that_sorts_by_time():
    problems = []
    assert J.run_id_for({"run_id": "mine"}, "llama-tiny", NOW, problems) == "mine"
    assert J.run_id_for({"run_nonce": "ab12"}, "llama-tiny", NOW, problems) == "20261123-170005-042ab12-llama-tiny"
    assert J.run_id_for({}, "../m", NOW, problems) == "20261123-170005-042-run" and problems == []
    assert J.run_id_for({"run_id": "a/b"}, "m", NOW, problems) == "a/b" and problems[0].startswith("run_id='a/b'")


def test_user_program_is_an_absolute_script_and_split_args():
    problems = []
    assert J.user_program({}, problems) == ("", [])
    assert J.user_program({"entrypoint": "/s/t.py", "args": "--a 'b c'"}, problems) == ("/s/t.py", ["--a", "b c"])
    assert problems == []
    assert J.user_program({"entrypoint": "t.py", "args": "'x"}, problems) == ("t.py", [])
    assert problems[0].startswith("entrypoint='t.py' must be") and problems[1].startswith("args=\"'x\" cannot be split")


def test_host_choice_names_each_host_once():
    problems = []
    assert J.host_choice({"hosts": "w1, w2", "exclude": ["w3"]}, problems) == (["w1", "w2"], ["w3"])
    assert problems == []
    J.host_choice({"hosts": "w1,w2,w1"}, problems)
    assert problems == ["hosts lists w1 twice. Fix: name each host once (-e hosts=w1,w2)"]


def test_args_against_plan_refuses_what_the_plan_sets():
    problems = []
    J.args_against_plan(False, "", ["--lr", "1"], problems)
    J.args_against_plan(False, "/s.py", ["--steps", "3"], problems)  # the user's own script: its own options
    assert problems == []
    J.args_against_plan(True, "/s.py", [], problems)
    J.args_against_plan(False, "", ["--steps=3", "--dry-run"], problems)
    assert problems[0].startswith("resume=true is the bundled trainer's")
    assert problems[1] == "args sets --steps, which the plan sets itself. Fix: -e steps=<value> instead"
    assert problems[2] == "args sets --dry-run, which the plan sets itself. Fix: leave --dry-run out of args"


def test_slots_within_gpus_for_cuda_hosts_only():
    problems = []
    J.slots_within_gpus({"w1": worker(slots=2, gpus=2), "w2": worker(slots=4, gpus=2, accel="cpu"),
                         "w3": worker(slots=None, gpus=2)}, problems)
    assert problems == []
    J.slots_within_gpus({"w1": worker(slots="3", gpus=2)}, problems)
    assert problems[0].startswith("host w1: deepspeed_slots=3, but it has 2 GPU(s)")


def test_rank_layout_takes_the_workers_with_slots():
    problems = []
    layout = J.rank_layout({"w1": worker(slots=2), "w2": worker(slots=None), "w3": worker(slots=1)}, [], [], problems)
    assert problems == [] and [h["name"] for h in layout["hosts"]] == ["w1", "w3"] and layout["world_size"] == 3
    assert J.rank_layout({"w1": worker(), "w3": worker()}, [], ["w1"], problems)["master"] == "w3"
    assert J.rank_layout({"w1": worker(slots=None)}, [], [], problems) is None
    assert problems[0].startswith("no worker has GPUs (nvidia-smi found none on w1)")
    assert J.rank_layout({"w1": worker()}, ["w9"], [], problems) is None and len(problems) == 2


def test_check_answered_stops_a_job_on_a_silent_host():
    J.check_answered({"w1": worker(answered=True), "w2": worker(answered=None)}, ["w1", "w2"])
    with pytest.raises(J.JobError, match="^w2 did not answer .* -e exclude=w2$"):
        J.check_answered({"w1": worker(answered=True), "w2": worker(answered=False)}, ["w1", "w2"])


def test_placement_puts_the_run_on_the_layout():
    workers = {"w1": worker(slots=2, gpus=2, addr="10.0.0.1"), "w2": worker(slots=1)}
    layout = J.rank_layout(workers, [], [], [])
    where = J.placement({"shared_dir": "/s", "run_id": "r1", "model": "m"}, layout, workers, ["c"])
    assert where["run_dir"] == "/s/runs/r1" and where["checkpoint_dir"] == "/s/checkpoints/m"
    assert where["rank_hosts"] == ["w1", "w2"] and where["slots"] == {"w1": 2, "w2": 1}
    assert where["first_ranks"] == {"w1": 0, "w2": 2} and where["world_size"] == 3
    assert (where["master"], where["master_addr"], where["accelerator"]) == ("w1", "10.0.0.1", "cuda")
    assert where["addresses"] == {"w1": "10.0.0.1", "w2": "w2"} and where["coordinators"] == ["c"]


def test_common_interface_only_when_every_rank_host_agrees():
    workers = {"w1": worker(iface="eth0"), "w2": worker(iface="eth0"), "w3": worker(iface="ib0"),
               "w4": worker(iface=None)}
    assert J.common_interface(workers, ["w1", "w2", "w4"]) == "eth0"
    assert J.common_interface(workers, ["w1", "w3"]) is None and J.common_interface(workers, ["w4"]) is None


def test_rank_memory_is_the_smallest_host_over_the_most_ranks():
    workers = {"w1": worker(mem=8192), "w2": worker(mem=4096), "w3": worker(mem=None)}
    assert J.rank_memory_gib(workers, ["w1", "w2"], {"w1": 2, "w2": 1}) == 2.0
    assert J.rank_memory_gib(workers, ["w1", "w3"], {"w1": 1, "w3": 1}) is None


def test_a_shrunken_attempts_plan_says_what_its_watch_looks_out_for():
    workers = {"worker1": {"address": "10.0.0.1"}, "worker2": {"address": "10.0.0.2"}, "spare1": {}}
    spec = {"nodes": ["worker2", "gone"], "spares": ["spare1"], "width": 2}
    assert J.grow_watch(spec, workers, ["worker1"]) == {
        "nodes": ["worker2"], "spares": ["spare1"], "width": 2, "missing": 1,
        "addresses": {"worker2": "10.0.0.2", "spare1": "spare1"}}
    # Nothing to grow to, nothing to look for, or nothing given: no grow-back.
    assert J.grow_watch(spec, workers, ["worker1", "spare1"]) is None
    assert J.grow_watch({"nodes": ["gone"], "spares": [], "width": 2}, workers, ["worker1"]) is None
    assert J.grow_watch(None, workers, ["worker1"]) is None and J.grow_watch("", workers, ["worker1"]) is None
