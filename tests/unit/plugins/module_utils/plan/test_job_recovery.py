"""The plan of a run with restarts: its settings checked, each attempt's own directory, the trainer resuming."""
import datetime

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import JobError, accumulation, plan

NOW = datetime.datetime(2026, 11, 25, 9, 0, 0)


def worker(addr):
    return {"slots": 1, "gpus": 0, "accelerator": None, "address": addr, "memtotal_mb": 4096, "interface": "eth0",
            "env": {}}


WORKERS = {"worker1": worker("10.89.0.11"), "worker2": worker("10.89.0.12")}


def test_a_run_without_restarts_keeps_one_directory():
    job = plan({"run_id": "r1"}, WORKERS, ["coord"], NOW, backends)
    assert (job["restarts"], job["recover_wait"], job["attempt"], job["min_nodes"]) == (0, 120, 1, None)
    assert job["run_dir"] == "/srv/multinode-deepspeed/runs/r1" and job["attempt_path"] == ""
    assert job["env"]["MULTINODE_DS_ATTEMPT"] == "1"


def test_min_nodes_up_to_the_rank_nodes_and_a_later_attempt_on_fewer():
    assert plan({"run_id": "r1", "restarts": "1", "min_nodes": "2"}, WORKERS, ["coord"], NOW, backends)["min_nodes"] == 2
    # A later attempt runs where the recovery placed it (run_recovery judges min_nodes there), unchecked here.
    later = plan({"run_id": "r1", "restarts": "1", "attempt": "2", "min_nodes": "2", "hosts": "worker1"}, WORKERS,
                 ["coord"], NOW, backends)
    assert later["rank_hosts"] == ["worker1"]


def test_each_attempt_has_its_directory_and_a_later_one_resumes_if_it_can():
    first = plan({"run_id": "r1", "restarts": "2"}, WORKERS, ["coord"], NOW, backends)
    assert first["run_dir"] == "/srv/multinode-deepspeed/runs/r1/attempts/1" and first["attempt_path"] == "attempts/1"
    assert "--resume-if-any" not in first["program"] and "--resume" not in first["program"]
    second = plan({"run_id": "r1", "restarts": 2, "attempt": 2, "hosts": "worker1"}, WORKERS, ["coord"], NOW, backends)
    assert second["run_dir"].endswith("/runs/r1/attempts/2") and second["rank_hosts"] == ["worker1"]
    assert second["program"][second["program"].index("--run-dir") + 1] == second["run_dir"]
    assert "--resume-if-any" in second["program"] and second["env"]["MULTINODE_DS_ATTEMPT"] == "2"
    # -e resume=true is the user's: the first checkpoint must exist, every attempt loads it.
    resumed = plan({"run_id": "r1", "restarts": 2, "attempt": 2, "resume": True}, WORKERS, ["coord"], NOW, backends)
    assert "--resume" in resumed["program"] and "--resume-if-any" not in resumed["program"]


@pytest.mark.parametrize("settings, text", [
    ({"restarts": "-1"}, "restarts=-1 must be a whole number in 0-100. Fix: -e restarts=<attempts after the first>"),
    ({"restarts": "101"}, "restarts=101 must be a whole number in 0-100"),
    ({"recover_wait": "forever"}, "recover_wait=forever must be a whole number in 0-3600. Fix: -e recover_wait=<seconds>"),
    ({"min_nodes": "0"}, "min_nodes=0 must be a whole number in 1-10000. Fix: -e min_nodes=<nodes>"),
    ({"restarts": "1", "attempt": "3"}, "attempt=3 is past restarts=1"),
    ({"restarts": "1", "min_nodes": "3"}, "min_nodes=3 is more than the job's 2 rank node(s) (worker1, worker2)"),
    ({"min_nodes": "2", "hosts": "worker2"}, "min_nodes=2 is more than the job's 1 rank node(s) (worker2), so no "
                                             "attempt could ever have as many. Fix: -e min_nodes=<1 or fewer>"),
])
def test_bad_recovery_settings_are_named_with_their_fix(settings, text):
    with pytest.raises(JobError, match=None) as err:
        plan(dict(settings, run_id="r1"), WORKERS, ["coord"], NOW, backends)
    assert text in str(err.value)


def test_a_slurm_attempt_excludes_the_nodes_lost_earlier_in_the_run():
    named = dict(WORKERS, worker2=dict(worker("10.89.0.12"), scheduler_name="node-b"))
    job = plan({"run_id": "r1", "restarts": 2, "attempt": 2, "backend": "slurm", "hosts": "worker1",
                "avoid": ["worker2"]}, named, ["coord"], NOW, backends)
    script = job["launch"]["files"]["slurm/job.sbatch"]
    assert "#SBATCH --exclude=node-b\n" in script and "#SBATCH --nodelist=worker1\n" in script
    assert job["launch"]["reuse_lost"] is False and job["launch"]["steps"]["recover"] == "slurm/recover"
    first = plan({"run_id": "r1", "restarts": 2, "backend": "slurm"}, WORKERS, ["coord"], NOW, backends)
    assert "--exclude" not in first["launch"]["files"]["slurm/job.sbatch"]
    # pdsh waits for a lost node and uses it again.
    assert plan({"run_id": "r1", "restarts": 2}, WORKERS, ["coord"], NOW, backends)["launch"]["reuse_lost"] is True


def test_a_node_kept_out_cannot_take_ranks_and_a_bad_slurm_name_is_refused():
    with pytest.raises(JobError) as err:
        plan({"run_id": "r1", "restarts": 1, "avoid": "worker2"}, WORKERS, ["coord"], NOW, backends)
    assert "worker2 both takes ranks and is kept out of the run" in str(err.value)
    with pytest.raises(JobError) as err:
        plan({"run_id": "r1", "backend": "slurm", "unquarantine": "bad;name"}, WORKERS, ["coord"], NOW, backends)
    assert "bad;name: slurm_node_name='bad;name' is not a Slurm node name" in str(err.value)


def test_on_fewer_nodes_the_trainer_keeps_the_global_batch_by_accumulation():
    one = plan({"run_id": "r1", "restarts": 1, "attempt": 2, "hosts": "worker1", "global_world": "2"}, WORKERS,
               ["coord"], NOW, backends)
    assert one["batch"] == {"grad_accum": 2, "exact": True, "global_world": 2}
    assert one["program"][one["program"].index("--grad-accum") + 1] == "2"
    three = dict(WORKERS, worker3=worker("10.89.0.13"))
    two = plan({"run_id": "r1", "restarts": 1, "attempt": 2, "hosts": "worker1,worker2", "global_world": "3"},
               three, ["coord"], NOW, backends)
    assert two["batch"] == {"grad_accum": 1, "exact": False, "global_world": 3}
    same = plan({"run_id": "r1", "restarts": 1, "attempt": 2, "global_world": "2"}, WORKERS, ["coord"], NOW, backends)
    assert same["batch"] is None and "--grad-accum" not in same["program"]


def test_a_kubernetes_attempt_is_a_new_generation_of_objects_kept_off_the_lost_nodes():
    k8s_settings = {"run_id": "r1", "restarts": 1, "backend": "kubernetes", "k8s_image": "reg/img:1"}
    first = plan(k8s_settings, WORKERS, ["coord"], NOW, backends)
    assert first["launch"]["extra"]["name"] == "mnds-r1"
    assert all("affinity" not in o["spec"] for o in first["launch"]["extra"]["objects"][1:])
    second = plan(dict(k8s_settings, attempt=2, avoid_scheduler_nodes=["gpu-b"]), WORKERS, ["coord"], NOW, backends)
    extra = second["launch"]["extra"]
    assert extra["name"] == "mnds-r1-a2" and [o["metadata"]["name"] for o in extra["objects"]] == [
        "mnds-r1-a2", "mnds-r1-a2-0", "mnds-r1-a2-1"]
    assert second["launch"]["follow"]["name"] == "mnds-r1-a2"
    assert "mnds-r1-a2-0.mnds-r1-a2.default.svc.cluster.local" in second["launch"]["argv"]["worker1"]
    for pod in extra["objects"][1:]:
        assert pod["spec"]["affinity"] == {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "NotIn",
                                                    "values": ["gpu-b"]}]}]}}}
    with pytest.raises(JobError) as err:
        plan(dict(k8s_settings, attempt=2, avoid_scheduler_nodes=["Bad Node"]), WORKERS, ["coord"], NOW, backends)
    assert "'Bad Node' is not a Kubernetes node name" in str(err.value)


def test_accumulation_keeps_the_global_batch():
    assert accumulation(16, 4, 2) == (2, True)
    assert accumulation(16, 4, 1) == (4, True)
    assert accumulation(16, 4, 3) == (1, False)
