"""The slurm backend (launch/backends/slurm/): its plan, the batch script it writes (batch.py) and its drains
(drain.py)."""
import datetime
import json
import shlex

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends.slurm import batch, drain
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import JobError, plan

NOW = datetime.datetime(2026, 11, 23, 17, 0, 5)
PY = "/opt/multinode-deepspeed/venv/bin/python"


def worker(addr, slots=1, gpus=0, name=None):
    return {"slots": slots, "gpus": gpus, "accelerator": None, "address": addr, "memtotal_mb": 8192,
            "interface": "eth0", "env": {}, "answered": None, "scheduler_name": name}


def workers(slots=(1, 1), gpus=0):
    return {"worker1": worker("10.89.0.11", slots[0], gpus and slots[0]),
            "worker2": worker("10.89.0.12", slots[1], gpus and slots[1])}


def slurm_job(settings=None, **kw):
    s = {"backend": "slurm", "run_id": "r1", "timeout": "3600"}
    s.update(settings or {})
    return plan(s, workers(**kw), ["coord"], NOW, backends)


def sbatch_options(script):
    return [line.split(" ", 1)[1] for line in script.splitlines() if line.startswith("#SBATCH ")]


def srun_argv(script):
    line = [x for x in script.splitlines() if x.startswith("exec srun ")][0]
    return shlex.split(line)[2:]


def test_slurm_is_a_registered_backend_with_its_own_settings():
    assert "slurm" in backends.REGISTRY
    assert {"slurm_partition", "slurm_submit", "slurm_account"} <= set(backends.setting_names())


def test_only_the_coordinator_runs_an_agent_and_no_ssh_is_needed():
    job = slurm_job()
    launch = job["launch"]
    # The coordinator's agent submits; the workers' agents beat and sweep the run's processes on an abort.
    assert launch["launchers"] == ["coord"] and launch["agents"] == ["coord", "worker1", "worker2"]
    assert launch["ssh_pairs"] == [] and launch["ssh_targets"] == {}
    assert launch["stop"] == "scancel" and launch["steps"] == {"preflight": "slurm/preflight", "recover": "slurm/recover", "release": "slurm/release"}
    assert launch["argv"]["coord"] == [PY, "-m", "multinode_ds.slurm", "job", "--run-dir",
                                       "/srv/multinode-deepspeed/runs/r1", "--host", "coord"]
    assert launch["agent_argv"]["coord"][-9:] == ["--", PY, "-m", "multinode_ds.slurm", "job", "--run-dir",
                                                  "/srv/multinode-deepspeed/runs/r1", "--host", "coord"]
    assert "--" not in launch["agent_argv"]["worker1"]
    # The workers' agents leave the ranks to scancel for 15 s before they sweep.
    worker = launch["agent_argv"]["worker1"]
    assert worker[worker.index("--sweep-after") + 1] == "15"
    assert launch["start"] is True and "sbatch" in launch["handoff"]


def test_the_batch_script_asks_for_the_plans_nodes_tasks_time_and_exclusive_nodes():
    job = slurm_job({"timeout": "5400", "slurm_partition": "batch"})
    script = job["launch"]["files"][batch.BATCH_SCRIPT]
    opts = sbatch_options(script)
    assert opts == ["--job-name=mnds-r1", "--nodes=2", "--nodelist=worker1,worker2", "--ntasks=2",
                    "--partition=batch", "--ntasks-per-node=1", "--time=1:30:00", "--exclusive", "--no-requeue",
                    "--chdir=/srv/multinode-deepspeed/runs/r1",
                    "--output=/srv/multinode-deepspeed/runs/r1/slurm/batch-%j.out"]
    assert script.startswith("#!/bin/bash\n")


def test_srun_kills_every_rank_on_a_bad_exit_and_starts_the_plans_program():
    job = slurm_job()
    argv = srun_argv(job["launch"]["files"][batch.BATCH_SCRIPT])
    assert argv[:5] == ["--kill-on-bad-exit=1", "--distribution=arbitrary", "--ntasks=2", "--cpu-bind=none",
                        "--output=/srv/multinode-deepspeed/runs/r1/logs/slurm_rank%t.log"]
    rank = argv[5:]
    assert rank[:8] == [PY, "-m", "multinode_ds.slurm_rank", "--run-dir", "/srv/multinode-deepspeed/runs/r1",
                        "--master-addr", "10.89.0.11", "--master-port"]
    assert rank[8:] == ["29500"]  # the program comes from program.json (multinode_ds.rank)


def test_the_tasks_file_follows_the_plans_rank_order():
    job = slurm_job(slots=(2, 3))
    assert job["launch"]["files"][batch.TASKS_FILE] == "worker1\nworker1\nworker2\nworker2\nworker2\n"
    opts = sbatch_options(job["launch"]["files"][batch.BATCH_SCRIPT])
    assert "--ntasks=5" in opts and not any(o.startswith("--ntasks-per-node") for o in opts)


def test_gpus_per_node_for_cuda_ranks():
    job = slurm_job(slots=(4, 4), gpus=4)
    assert "--gres=gpu:4" in sbatch_options(job["launch"]["files"][batch.BATCH_SCRIPT])
    with pytest.raises(JobError) as err:
        slurm_job(slots=(2, 4), gpus=1)
    assert "the ranks per node differ (worker1=2, worker2=4)" in str(err.value) and "Fix:" in str(err.value)


def test_slurms_own_node_names_when_they_differ_from_the_inventory():
    ws = workers()
    ws["worker2"]["scheduler_name"] = "gpu-node-07"
    job = plan({"backend": "slurm", "run_id": "r1"}, ws, ["coord"], NOW, backends)
    assert job["scheduler_names"] == {"worker1": "worker1", "worker2": "gpu-node-07"}
    assert job["launch"]["files"][batch.TASKS_FILE] == "worker1\ngpu-node-07\n"
    assert json.loads(job["launch"]["files"][batch.NAMES_FILE]) == {"gpu-node-07": "worker2", "worker1": "worker1"}
    assert "--nodelist=worker1,gpu-node-07" in sbatch_options(job["launch"]["files"][batch.BATCH_SCRIPT])


def test_user_script_and_args_never_reach_the_batch_script():
    job = slurm_job({"entrypoint": "/srv/multinode-deepspeed/my train.py", "args": "--name 'a b;rm -rf /'"})
    script = job["launch"]["files"][batch.BATCH_SCRIPT]
    assert "rm -rf" not in script and "my train.py" not in script
    assert job["program"] == ["/srv/multinode-deepspeed/my train.py", "--name", "a b;rm -rf /"]


def test_submit_false_is_a_handoff():
    job = slurm_job({"slurm_submit": "false"})
    assert job["launch"]["start"] is False
    assert "sbatch /srv/multinode-deepspeed/runs/r1/slurm/job.sbatch" in job["launch"]["handoff"]


@pytest.mark.parametrize("settings,needle", [
    ({"slurm_partition": "gpu;reboot"}, "slurm_partition='gpu;reboot' is not a Slurm name"),
    ({"slurm_account": "a b"}, "slurm_account='a b'"),
    ({"slurm_sbatch_args": ["-p x"]}, "slurm_sbatch_args: '-p x' is not a long sbatch option"),
    ({"slurm_sbatch_args": "--output=/tmp/x"}, "slurm_sbatch_args: --output is set from the job plan"),
    ({"slurm_sbatch_args": ["--requeue"]}, "slurm_sbatch_args: --requeue is set from the job plan"),
    ({"slurm_sbatch_args": "--comment='a"}, "cannot be split"),
    ({"shared_dir": "/srv/a%jb"}, "shared_dir_path='/srv/a%jb' must be an absolute path"),
])
def test_bad_slurm_settings_fail_the_plan_naming_the_variable(settings, needle):
    with pytest.raises(JobError) as err:
        slurm_job(settings)
    assert needle in str(err.value) and "Fix:" in str(err.value)


def test_other_backends_write_no_extra_files_and_start():
    job = plan({"run_id": "r1"}, workers(), ["coord"], NOW, backends)
    assert job["launch"]["files"] == {} and job["launch"]["start"] is True and job["launch"]["steps"] == {}


def test_another_partition_is_another_preflight():
    from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.evaluate import reuse_key
    assert reuse_key(slurm_job(), {}) != reuse_key(slurm_job({"slurm_partition": "a100"}), {})
    assert reuse_key(slurm_job(), {}) == reuse_key(slurm_job({"run_id": "r2"}), {})


def test_more_sbatch_options_go_into_the_script():
    job = slurm_job({"slurm_sbatch_args": "--qos=high --comment='nightly run'"})
    opts = sbatch_options(job["launch"]["files"][batch.BATCH_SCRIPT])
    assert opts[-2:] == ["--qos=high", "'--comment=nightly run'"]


def test_a_slurm_node_name_that_is_not_one_fails_the_plan():
    ws = workers()
    ws["worker2"]["scheduler_name"] = "gpu\n07"
    with pytest.raises(JobError) as err:
        plan({"backend": "slurm", "run_id": "r1"}, ws, ["coord"], NOW, backends)
    assert "worker2: slurm_node_name='gpu\\n07' is not a Slurm node name" in str(err.value)


def test_a_lost_node_is_drained_with_a_one_line_reason_and_only_its_drain_is_given_back():
    job = {"scheduler_names": {"worker1": "worker1", "worker2": "node-b"},
           "unquarantine_names": {"worker2": "node-b", "worker3": "worker3"}}
    argv = drain.drain_argvs(job, ["worker2"], "lost in run r1 (attempt 1)\n$(reboot)")
    assert argv == [["scontrol", "update", "NodeName=node-b", "State=DRAIN",
                     "Reason=multinode-deepspeed: lost in run r1 (attempt 1) (reboot)"]]
    assert drain.drain_argvs(job, [], "x") == []
    lines = ["node-b|multinode-deepspeed: lost in run r1 (attempt 1)", "worker3|disk replaced by ops",
             "worker1|multinode-deepspeed: lost in run r0"]
    assert drain.resume_argvs(job, lines) == [["scontrol", "update", "NodeName=node-b", "State=RESUME"]]
