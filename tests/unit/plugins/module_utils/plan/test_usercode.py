"""The user's workdir, DeepSpeed config and trackers, read on the controller (plan/usercode.py) and planned into the
job (plan/job.py user_code): where the workdir goes, the entrypoint in it, the config file the ranks read with the
monitor sections, DeepSpeed's check, the ranks' environment; and each bad input refused with its fix."""
import datetime
import json
import subprocess

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan import usercode
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import JobError, plan

NOW = datetime.datetime(2026, 11, 26, 6, 0, 0)
WORKERS = {"worker1": {"slots": 1, "gpus": 0, "address": "10.89.0.11", "memtotal_mb": 4096, "interface": "eth0"},
           "worker2": {"slots": 1, "gpus": 0, "address": "10.89.0.12", "memtotal_mb": 4096, "interface": "eth0"}}
SEED = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
        "fp16": {"enabled": True}}


@pytest.fixture(name="project")
def project_fixture(tmp_path):
    """A user's project: a script importing a helper, data, a .gitignored large file, a ds_config."""
    root = tmp_path / "proj"
    (root / "data").mkdir(parents=True)
    (root / "train.py").write_text("import helper\n")
    (root / "helper.py").write_text("X = 1\n")
    (root / "data" / "tokens.txt").write_text("a b c\n")
    (root / "big.bin").write_bytes(b"\0" * 4096)
    (root / ".gitignore").write_text("big.bin\n")
    (root / "ds_config.json").write_text(json.dumps(SEED))
    for argv in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", "-C", str(root)] + argv, check=True)
    return root


def planned(settings, project):
    inputs, problems = usercode.gather(settings, str(project.parent), str(project.parent / "runs"))
    assert problems == []
    return plan(dict(settings, user_inputs=inputs, args=inputs["args"]), dict(WORKERS), ["coord"], NOW, backends), inputs


def test_a_workdir_ships_git_view_and_the_entrypoint_runs_in_it(project):
    job, inputs = planned({"workdir": "proj", "entrypoint": "train.py"}, project)
    wd = inputs["workdir"]
    assert sorted(wd["files"]) == [".gitignore", "data/tokens.txt", "ds_config.json", "helper.py", "train.py"]
    assert wd["git"]["commit"] and wd["git"]["dirty"] is False
    dest = "/srv/multinode-deepspeed/workspaces/%s" % wd["id"]
    assert job["workdir"]["dest"] == dest and job["workdir"]["marker"] == dest + ".json"
    assert job["entrypoint"] == dest + "/train.py" and job["program"] == [dest + "/train.py"]
    assert job["env"]["MULTINODE_DS_WORKDIR"] == dest and job["env"]["PYTHONDONTWRITEBYTECODE"] == "1"
    assert job["ds_config"] is None and job["ds_check"] is None and job["dry_run"] is None
    # The ranks' work/ links each top entry; the pull leaves those links out (and the checkpoints, as for any run).
    assert job["workdir"]["top"] == [".gitignore", "data", "ds_config.json", "helper.py", "train.py"]
    assert job["pull_opts"][:2] == ["--exclude=checkpoints/", "--exclude=attempts/"]
    assert job["pull_opts"][-5:] == ["--exclude=/work/.gitignore", "--exclude=/work/data",
                                     "--exclude=/work/ds_config.json", "--exclude=/work/helper.py",
                                     "--exclude=/work/train.py"]


def test_the_same_content_gives_the_same_place_a_change_a_new_one(project):
    first, _inputs = planned({"workdir": "proj", "entrypoint": "train.py"}, project)
    again, _again = planned({"workdir": str(project), "entrypoint": "train.py"}, project)
    (project / "helper.py").write_text("X = 2\n")
    changed, inputs = planned({"workdir": "proj", "entrypoint": "train.py"}, project)
    assert first["workdir"]["dest"] == again["workdir"]["dest"] != changed["workdir"]["dest"]
    assert inputs["workdir"]["git"]["dirty"] is True


def test_a_ds_config_in_args_is_found_relative_to_the_workdir_and_passed_from_the_run_directory(project):
    job, inputs = planned({"workdir": "proj", "entrypoint": "train.py",
                           "args": "--epochs 2 --deepspeed_config ds_config.json"}, project)
    assert inputs["ds_config_source"] == str(project / "ds_config.json") and inputs["ds_config"] == SEED
    assert job["program"] == [job["entrypoint"], "--epochs", "2", "--deepspeed_config",
                              job["run_dir"] + "/ds_config.json"]
    assert json.loads(job["ds_config"]["text"]) == SEED
    assert job["ds_check"][-7:] == ["--config", "-", "--world-size", "2", "--accelerator", "cpu", "--json"]


def test_tracking_fills_the_monitor_sections_without_overwriting_the_users(project):
    (project / "ds_config.json").write_text(json.dumps({"train_micro_batch_size_per_gpu": 1,
                                                        "tensorboard": {"job_name": "mine"}}))
    job, _inputs = planned({"workdir": "proj", "entrypoint": "train.py", "ds_config": "proj/ds_config.json",
                            "tracking": "tensorboard,csv,wandb"}, project)
    config = json.loads(job["ds_config"]["text"])
    assert config["tensorboard"] == {"enabled": True, "job_name": "mine",
                                     "output_path": job["run_dir"] + "/tensorboard/"}
    assert config["csv_monitor"]["output_path"] == job["run_dir"] + "/csv/" and job["ds_config"]["kept"] == [
        "tensorboard.job_name"]
    # wandb offline without a key in secret_env; its files in the run directory.
    assert job["env"]["WANDB_MODE"] == "offline" and job["env"]["WANDB_DIR"] == job["run_dir"]
    assert job["tracking"] == ["tensorboard", "csv", "wandb"] and job["mlflow"] is None


def test_the_bundled_trainer_gets_the_monitor_through_its_merged_config(tmp_path):
    inputs, problems = usercode.gather({"tracking": "tensorboard,mlflow"}, str(tmp_path), str(tmp_path / "runs"))
    assert problems == []
    job = plan({"user_inputs": inputs}, dict(WORKERS), ["coord"], NOW, backends)
    prog = job["program"]
    assert prog[prog.index("--ds-config") + 1] == job["run_dir"] + "/ds_config.user.json"
    assert list(json.loads(job["ds_config"]["text"])) == ["tensorboard"] and job["ds_check"] is None
    assert job["mlflow"] == {"uri": "file://%s/runs/mlruns" % tmp_path, "env": {"MLFLOW_ALLOW_FILE_STORE": "true"}}


def test_a_wandb_key_in_secret_env_leaves_wandb_online(tmp_path):
    inputs, _problems = usercode.gather({"tracking": "wandb"}, str(tmp_path), str(tmp_path / "runs"))
    job = plan({"user_inputs": inputs, "secret_env": {"WANDB_API_KEY": "wandb-secret-42"}}, dict(WORKERS), ["coord"],
               NOW, backends)
    assert "WANDB_MODE" not in job["env"] and "wandb-secret-42" not in json.dumps(job)


@pytest.mark.parametrize("settings, words", [
    ({"workdir": "nope", "entrypoint": "train.py"}, ["workdir=nope does not exist", "Fix: give an existing"]),
    ({"workdir": "proj/train.py", "entrypoint": "train.py"}, ["is a file, not a directory"]),
    ({"workdir": "proj", "entrypoint": "../x.py"}, ["entrypoint=../x.py is outside workdir"]),
    ({"workdir": "proj", "entrypoint": "big.bin"}, ["not shipped: .gitignore or workdir_exclude"]),
    ({"workdir": "proj", "entrypoint": "train.py", "workdir_max_mb": "0.00001"},
     ["over workdir_max_mb=1e-05", "the biggest entries are", "raise workdir_max_mb"]),
    ({"workdir": "proj", "entrypoint": "train.py", "workdir_max_mb": "lots"}, ["workdir_max_mb=lots is not a size"]),
    ({"workdir": "proj"}, ["without entrypoint", "Fix: -e entrypoint="]),
    ({"ds_config": "proj/train.py"}, ["ds_config=proj/train.py is not JSON", "Fix: correct the file"]),
    ({"ds_config": "proj/none.json"}, ["is not a file on the controller"]),
    ({"ds_config": "proj/list.json"}, ["holds a JSON list, not an object"]),
    ({"ds_config": "proj/twice.json"}, ["the key fp16 is given twice"]),
    ({"ds_config": "proj/ds_config.json", "args": "--deepspeed_config=proj/ds_config.json"},
     ["ds_config given twice", "Fix: keep one"]),
    ({"ds_config": "proj/secret.json"}, ["proj/secret.json: comet.api_key holds a secret", "secret_env"]),
    ({"tracking": "tensorboard,neptune"}, ["tracking=neptune is not one of", "Fix: -e tracking=tensorboard"]),
    ({"tracking": "mlflow", "mlflow_tracking_uri": "http//host:5000"}, ["mlflow_tracking_uri=http//host:5000", "without its ':'"]),
    ({"tracking": "mlflow", "mlflow_tracking_uri": "ftp://host/x"}, ["has the scheme ftp:"]),
    ({"mlflow_tracking_uri": "http://host:5000"}, ["tracking does not name mlflow"]),
])
def test_bad_inputs_are_refused_with_their_fix(project, settings, words):
    (project / "list.json").write_text("[1]")
    (project / "twice.json").write_text('{"fp16": {}, "fp16": {}}')
    (project / "secret.json").write_text('{"comet": {"enabled": true, "api_key": "k-123"}}')
    _inputs, problems = usercode.gather(settings, str(project.parent), str(project.parent / "runs"))
    text = "; ".join(problems)
    for word in words:
        assert word in text


def test_a_relative_entrypoint_without_a_workdir_names_the_workdir():
    with pytest.raises(JobError, match=r"entrypoint='train.py' must be an absolute path .* -e workdir="):
        plan({"entrypoint": "train.py"}, dict(WORKERS), ["coord"], NOW, backends)


def test_a_tracker_the_master_lacks_is_refused_naming_the_package(tmp_path):
    inputs, _problems = usercode.gather({"tracking": "tensorboard,wandb,csv"}, str(tmp_path), str(tmp_path / "runs"))
    workers = dict(WORKERS)
    workers["worker1"] = dict(workers["worker1"], trackers={"tensorboard": None, "wandb": None, "comet": None})
    with pytest.raises(JobError) as err:
        plan({"user_inputs": inputs}, workers, ["coord"], NOW, backends)
    assert "tracking=tensorboard needs the tensorboard package on worker1" in str(err.value)
    assert "Fix: run site.yml" in str(err.value)
    assert "tracking=wandb needs the wandb package on worker1" in str(err.value)
    assert "add wandb==<version> to stack_extra_packages" in str(err.value) and "csv" not in str(err.value)
    workers["worker1"]["trackers"] = {"tensorboard": "2.21.0", "wandb": "0.22.0", "comet": None}
    assert plan({"user_inputs": inputs}, workers, ["coord"], NOW, backends)["tracking"] == ["tensorboard", "wandb", "csv"]
