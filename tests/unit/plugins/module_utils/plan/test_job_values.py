"""Values that cannot escape (issue 15, items 6 and 7): every -e value that becomes a path, an argv element or an
environment line is checked or kept out of every shell; secrets reach the ranks by a node-local file only."""
import datetime
import json

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import JobError, plan
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.node import launcher_env

NOW = datetime.datetime(2026, 11, 23, 17, 0, 5)
WORKERS = {"worker1": {"slots": 1, "gpus": 0, "address": "10.89.0.11", "memtotal_mb": 4096, "interface": "eth0",
                       "env": {}},
           "worker2": {"slots": 1, "gpus": 0, "address": "10.89.0.12", "memtotal_mb": 4096, "interface": "eth0",
                       "env": {}}}
INJECTIONS = ["$(touch /tmp/pwned)", "`touch /tmp/pwned`", "x; touch /tmp/pwned", "x && touch /tmp/pwned",
              "x | touch /tmp/pwned", "'\"; touch /tmp/pwned; echo \"'", "x\ntouch /tmp/pwned"]


def refused(settings, needle):
    with pytest.raises(JobError) as err:
        plan(settings, WORKERS, ["coord"], NOW, backends)
    assert needle in str(err.value) and "Fix:" in str(err.value), str(err.value)


@pytest.mark.parametrize("run_id", ["../../etc", "../x", "a/b", "/abs", ".hidden", "-rf", "a b", "x;id", "$(id)",
                                    "x" * 129, "é", ""])
def test_run_ids_that_leave_the_runs_directory_or_reach_a_shell_are_refused(run_id):
    if run_id == "":
        assert plan({"run_id": run_id}, WORKERS, ["coord"], NOW, backends)["run_id"].endswith("llama-tiny")  # "" = a new id
        return
    refused({"run_id": run_id}, "run_id=")


@pytest.mark.parametrize("model", ["../../etc", "a/b", "x;id", "$(id)", " llama"])
def test_model_names_that_would_leave_the_checkpoints_directory_are_refused(model):
    refused({"model": model}, "is not a model name")


@pytest.mark.parametrize("var,key", [("shared_dir", "shared_dir_path"), ("venv", "stack_venv_dir"),
                                     ("home", "stack_home"), ("torch_extensions_dir", "stack_torch_extensions_dir")])
@pytest.mark.parametrize("path", ["relative/dir", "/srv/../etc", "/srv/a b", "/srv/x;id", "/srv/$(id)", "/srv/a%j"])
def test_cluster_directories_must_be_plain_absolute_paths(var, key, path):
    refused({var: path}, "%s=%r must be an absolute path" % (key, path))


@pytest.mark.parametrize("backend", sorted(backends.REGISTRY))
@pytest.mark.parametrize("value", INJECTIONS[:-1])
def test_user_values_go_to_the_program_file_never_to_a_launchers_command_line(backend, value):
    job = plan({"backend": backend, "args": "--note %s" % json.dumps(value), "dataset": value, "model_path": value,
                "k8s_image": "mnds-node:local"}, WORKERS, ["coord"], NOW, backends)
    assert job["program"][-2:] == ["--note", value]
    assert "--dataset" in job["program"] and "--model-path" in job["program"]
    launch = job["launch"]
    every_argv = [a for argv in launch["argv"].values() for a in argv]
    every_argv += [a for argv in launch["agent_argv"].values() for a in argv]
    every_argv += ["".join(launch.get("files", {}).values())]
    assert not any(value in a or "touch" in a for a in every_argv), (backend, value)


@pytest.mark.parametrize("value", INJECTIONS[:-1])
def test_environment_values_with_shell_syntax_stay_out_of_deepspeed_env(value):
    job = plan({"deepspeed_rank_env": {"MY_SETTING": value, "PLAIN": "a,b:c/d=e"}}, WORKERS, ["coord"], NOW, backends)
    assert job["env"]["MY_SETTING"] == value  # rank.env: verbatim
    shell = launcher_env(job["env"])
    assert "MY_SETTING" not in shell and shell["PLAIN"] == "a,b:c/d=e"
    assert shell["MULTINODE_DS_RUN_ID"] == job["run_id"]


@pytest.mark.parametrize("env,needle", [
    ({"A\nB": "x"}, "is not a variable name"),
    ({"X": "two\nlines"}, "must be one line of text"),
    ({"X": "nul\0byte"}, "must be one line of text"),
    ({"X": {"nested": 1}}, "must be one line of text"),
    ({"RANK": "0"}, "RANK is set by the run itself"),
    ({"MULTINODE_DS_RUN_ID": "other"}, "MULTINODE_DS_RUN_ID is set by the run itself"),
    ({"WANDB_API_KEY": "k"}, "WANDB_API_KEY looks like a secret"),
    ({"AWS_SECRET_ACCESS_KEY": "k"}, "pass it in secret_env"),
])
def test_bad_rank_environment(env, needle):
    refused({"deepspeed_rank_env": env}, needle)


def test_rank_environment_must_be_a_mapping():
    refused({"deepspeed_rank_env": "NCCL_DEBUG=INFO"}, "deepspeed_rank_env must be a mapping")


def test_secret_env_becomes_a_node_local_file_and_only_its_names_are_in_the_plan():
    job = plan({"secret_env": {"WANDB_API_KEY": "k-123", "DB_PASSWORD": "p w; $(x)"}, "run_id": "r1"},
               WORKERS, ["coord"], NOW, backends)
    assert job["secret_file"] == "/opt/multinode-deepspeed/secrets/runs/r1.json"
    assert job["secret_keys"] == ["DB_PASSWORD", "WANDB_API_KEY"]
    assert job["env"]["MULTINODE_DS_SECRET_ENV"] == job["secret_file"]
    text = json.dumps(job)
    assert "k-123" not in text and "p w" not in text


def test_no_secret_env_no_secret_file():
    job = plan({}, WORKERS, ["coord"], NOW, backends)
    assert job["secret_file"] is None and "MULTINODE_DS_SECRET_ENV" not in job["env"]


@pytest.mark.parametrize("secrets,needle", [
    ("WANDB_API_KEY=k", "secret_env must be a mapping"),
    ({"1X": "k"}, "secret_env: '1X' is not a variable name"),
    ({"X": "a\nb"}, "secret_env: X must be one line"),
    ({"LOCAL_RANK": "1"}, "secret_env: LOCAL_RANK is set by the run itself"),
])
def test_bad_secret_env(secrets, needle):
    refused({"secret_env": secrets}, needle)


@pytest.mark.parametrize("settings,needle", [
    ({"steps": "100000000000"}, "steps=100000000000 is more than 1000000000, surely a typo"),
    ({"timeout": "99999999"}, "timeout=99999999 is more than 2592000"),
    ({"steps": "-5"}, "steps=-5 must be a whole number >= 1"),
    ({"steps": "10.5"}, "steps=10.5 must be a whole number >= 1"),
    ({"timeout": "1h"}, "timeout=1h must be a whole number >= 10"),
    ({"timeout": "300", "stall_timeout": "600"}, "stall_timeout=600 is not shorter than timeout=300"),
    ({"resume": "maybe"}, "resume=maybe is not a yes/no value. Fix: -e resume=true or -e resume=false"),
    ({"preflight": "sometimes"}, "preflight=sometimes is not a yes/no value. Fix: -e preflight=true or -e "
                                 "preflight=false or -e preflight=force"),
    ({"hosts": "worker1,worker1"}, "hosts lists worker1 twice. Fix: name each host once (-e hosts=worker1)"),
    ({"resume": "true", "entrypoint": "/shared/mine.py"}, "resume=true is the bundled trainer's"),
    ({"args": "--steps 5"}, "args sets --steps, which the plan sets itself. Fix: -e steps=<value> instead"),
    ({"args": "--checkpoint-dir=/tmp/x"}, "args sets --checkpoint-dir"),
    ({"args": "--local_rank 3"}, "Fix: leave --local_rank out of args"),
    # Issue 44, point 4: an abbreviation is what argparse read as the planned option (the trainer now refuses it too).
    ({"args": "--checkpoint-d=/tmp/x"}, "args sets --checkpoint-d (an abbreviation of --checkpoint-dir), which the "
                                        "plan sets itself. Fix: -e model=<value> instead"),
    ({"args": "--run-d /tmp/x"}, "args sets --run-d (an abbreviation of --run-dir)"),
    ({"args": "--step 5"}, "args sets --step (an abbreviation of --steps)"),
    ({"run_id": "my run"}, "run_id='my run': letters, digits"),
    ({"run_id": "r\u00fcn"}, "run_id='r\u00fcn': letters, digits"),
    ({"model": "llama tiny"}, "model='llama tiny' is not a model name"),
])
def test_more_bad_inputs_fail_the_plan_with_a_fix(settings, needle):
    refused(settings, needle)


def test_a_bad_model_name_is_the_only_problem_named():
    with pytest.raises(JobError) as err:
        plan({"model": "llama tiny"}, WORKERS, ["coord"], NOW, backends)
    assert "run_id" not in str(err.value)


def test_arguments_of_a_users_script_are_its_own():
    job = plan({"entrypoint": "/shared/mine.py", "args": "--steps 5 --resume"}, WORKERS, ["coord"], NOW, backends)
    assert job["program"] == ["/shared/mine.py", "--steps", "5", "--resume"]


def test_more_ranks_than_gpus_on_a_gpu_worker():
    workers = dict(WORKERS, worker1=dict(WORKERS["worker1"], gpus=2, slots=4))
    refused_on = pytest.raises(JobError, match="host worker1: deepspeed_slots=4, but it has 2 GPU")
    with refused_on:
        plan({}, workers, ["coord"], NOW, backends)
    cpu_ranks = dict(WORKERS, worker1=dict(WORKERS["worker1"], gpus=2, slots=4, accelerator="cpu"))
    assert plan({}, cpu_ranks, ["coord"], NOW, backends)["slots"]["worker1"] == 4


@pytest.mark.parametrize("word,value", [("yes", True), ("False", False), ("1", True), ("off", False)])
def test_resume_reads_ansible_booleans(word, value):
    job = plan({"resume": word}, WORKERS, ["coord"], NOW, backends)
    assert ("--resume" in job["program"]) is value


def test_a_trainer_option_that_begins_a_planned_one_is_no_abbreviation_of_it():
    """--data is the trainer's own option (a corpus), not --dataset abbreviated: the plan takes it (the e2e
    bad-input test's missing-data case then names the missing path on the node)."""
    job = plan({"args": "--data /shared/corpus --seed 7"}, WORKERS, ["coord"], NOW, backends)
    assert job["program"][-4:] == ["--data", "/shared/corpus", "--seed", "7"]


@pytest.mark.parametrize("backend", sorted(backends.REGISTRY))
def test_ranks_start_warm_where_the_backend_lets_them_unless_warm_start_is_false(backend):
    settings = {"backend": backend, "k8s_image": "mnds-node:local"}
    job = plan(settings, WORKERS, ["coord"], NOW, backends)
    # Slurm's ranks stay in their job step (its cgroup, accounting, kill); a pod is new every run.
    assert job["warm"] is (backend in ("pdsh", "ssh-free"))
    assert job["env"].get("MULTINODE_DS_WARM") == ("1" if job["warm"] else None)
    cold = plan(dict(settings, warm_start="false"), WORKERS, ["coord"], NOW, backends)
    assert cold["warm"] is False and "MULTINODE_DS_WARM" not in cold["env"]
    refused(dict(settings, warm_start="often"), "warm_start=often is not a yes/no value")
