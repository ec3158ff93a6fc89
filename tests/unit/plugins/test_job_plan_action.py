"""The job_plan action: settings from the play's variables, workers from hostvars, errors as failures."""
from unittest.mock import MagicMock

from ansible_collections.multinode.deepspeed.plugins.action.job_plan import ActionModule, worker_facts
from ansible_collections.multinode.deepspeed.plugins.module_utils.common import records
from ansible_collections.multinode.deepspeed.plugins.module_utils.run import recovery
from tests.unit.plugins.action_task import action_plugin

CPU = {"ansible_host": "10.89.0.11", "deepspeed_slots": 1, "multinode_accelerators": {"count": 0},
       "ansible_facts": {"memtotal_mb": 8192, "default_ipv4": {"interface": "eth0"}},
       "multinode_node_env": {"NCCL_IB_DISABLE": "1"}}


def action(args):
    plugin = action_plugin(ActionModule, "multinode.deepspeed.job_plan", args)
    plugin._shared_loader_obj = MagicMock()
    return plugin


def task_vars(**extra):
    hostvars = {"coord": {"ansible_host": "10.89.0.10"}, "worker1": dict(CPU),
                "worker2": dict(CPU, ansible_host="10.89.0.12")}
    out = {"groups": {"coordinator": ["coord"], "workers": ["worker1", "worker2"]}, "hostvars": hostvars}
    out.update(extra)
    return out


def test_worker_facts_slots_from_gpus_or_the_inventory():
    assert worker_facts(CPU)["slots"] == 1 and worker_facts(CPU)["interface"] == "eth0"
    gpu = {"multinode_accelerators": {"count": 8}, "ansible_host": "10.0.0.5"}
    assert worker_facts(gpu)["slots"] == 8 and worker_facts(gpu)["gpus"] == 8
    assert worker_facts({"ansible_host": "10.0.0.6"})["slots"] is None


def test_plans_from_the_play_variables():
    res = action({}).run(task_vars=task_vars(steps="5", backend="ssh-free", run_id="r1", resume="false",
                                             shared_dir_path="/shared", hf_token="hf_XyZ123"))
    assert not res.get("failed"), res.get("msg")
    job = res["job"]
    assert (job["run_id"], job["steps"], job["backend"], job["run_dir"]) == ("r1", 5, "ssh-free", "/shared/runs/r1")
    assert job["launch"]["launchers"] == ["worker1", "worker2"] and "--resume" not in job["program"]
    assert job["env"]["NCCL_IB_DISABLE"] == "1" and "HF_TOKEN_PATH" in job["env"]
    assert "hf_XyZ123" not in repr(job)


def test_settings_win_and_errors_fail_the_task():
    res = action({"settings": {"run_id": "r2", "hosts": ["worker2"]}}).run(task_vars=task_vars(run_id="r1"))
    assert res["job"]["run_id"] == "r2" and res["job"]["rank_hosts"] == ["worker2"]
    res = action({}).run(task_vars=task_vars(steps="0", backend="mpi"))
    assert res["failed"] is True
    assert res["msg"].startswith("The job cannot start: steps=0 must be a whole number >= 1")
    assert "backend=mpi is not a launch backend" in res["msg"]


def test_the_run_accounts_uid_on_the_coordinator_reaches_the_kubernetes_pods():
    tv = task_vars(backend="kubernetes", k8s_image="img:1", run_id="r3")
    tv["hostvars"]["coord"]["multinode_node"] = {"uid": 2000}
    res = action({}).run(task_vars=tv)
    assert not res.get("failed"), res.get("msg")
    assert res["job"]["backend_options"]["run_as_user"] == 2000
    tv["hostvars"]["coord"]["multinode_node"] = {"uid": 0}
    assert action({}).run(task_vars=tv)["job"]["backend_options"]["run_as_user"] is None


def coordinator_read(tv, shared):
    """The coordinator's node_facts answer with the records of the shared directory ``shared`` (as train.yml reads
    them)."""
    tv["hostvars"]["coord"]["multinode_node"] = {"records": records.read_all(str(shared))}
    return tv


def test_quarantined_workers_take_no_ranks_and_are_named_until_let_out(tmp_path):
    shared = tmp_path / "shared"
    path = shared / "runs" / ".records" / "quarantine.json"
    recovery.save_quarantine(str(path), {"worker2": {"since": 0, "reason": "lost twice", "run_id": "r0"}})
    res = action({}).run(task_vars=coordinator_read(task_vars(run_id="r1"), shared))
    assert res["job"]["rank_hosts"] == ["worker1"]
    assert res["warnings"] == ["worker2 is quarantined since 1970-01-01 00:00 UTC (lost twice in run r0); "
                               "-e unquarantine=worker2 to use it again"]
    assert res["records"] == {"quarantine_file": str(path), "spares_file": str(path.parent / "spares.json")}
    # Let out for this plan; the plan writes nothing (checks.yml lets it out on the coordinator).
    before = path.read_text()
    res = action({}).run(task_vars=coordinator_read(task_vars(run_id="r2", unquarantine="worker2"), shared))
    assert res["job"]["rank_hosts"] == ["worker1", "worker2"] and not res.get("warnings")
    assert res["job"]["unquarantine"] == ["worker2"] and path.read_text() == before
    path.write_text("[]")
    res = action({}).run(task_vars=coordinator_read(task_vars(run_id="r3"), shared))
    assert res["failed"] and "%s is not a quarantine file (quarantine_file)" % path in res["msg"]
    assert "Fix: repair it" in res["msg"] and path.read_text() == "[]"


def test_two_controllers_see_the_quarantine_the_coordinator_read(tmp_path, monkeypatch):
    """Two controllers (two homes, two working directories) plan on one cluster: both keep the node the coordinator's
    record quarantines out, whatever either controller holds - the record is the coordinator's, not theirs."""
    shared = tmp_path / "shared"
    recovery.save_quarantine(str(shared / "runs" / ".records" / "quarantine.json"),
                             {"worker2": {"since": 0, "reason": "lost twice", "run_id": "r0"}})
    for name in ("laptop-a", "laptop-b"):
        home = tmp_path / name
        (home / ".cache" / "multinode-deepspeed").mkdir(parents=True)
        # What a controller kept of its own before the records moved to the coordinator: nothing quarantined.
        (home / ".cache" / "multinode-deepspeed" / "quarantine.json").write_text('{"nodes": {}}')
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.chdir(home)
        res = action({}).run(task_vars=coordinator_read(task_vars(run_id="r-" + name), shared))
        assert not res.get("failed"), res.get("msg")
        assert res["job"]["rank_hosts"] == ["worker1"], name
        assert res["warnings"][0].startswith("worker2 is quarantined since"), name


def test_a_records_path_that_is_not_absolute_is_refused_naming_the_variable(tmp_path):
    res = action({}).run(task_vars=task_vars(run_id="r1", quarantine_file="~/q.json"))
    assert res["failed"] is True
    assert res["msg"] == ("The job cannot start: quarantine_file=~/q.json is not an absolute path. Fix: the path of "
                          "the file on the coordinator, from / (or leave quarantine_file out: "
                          "<shared_dir_path>/runs/.records/quarantine.json).")
    res = action({}).run(task_vars=task_vars(run_id="r2", shared_dir_path="/shared", spares_file="/x/s.json"))
    assert res["records"] == {"quarantine_file": "/shared/runs/.records/quarantine.json", "spares_file": "/x/s.json"}


def test_an_unquarantine_of_no_known_node_is_refused(tmp_path):
    shared = tmp_path / "shared"
    path = shared / "runs" / ".records" / "quarantine.json"
    recovery.save_quarantine(str(path), {"worker2": {"since": 0, "reason": "lost twice", "run_id": "r0"}})
    tv = coordinator_read(task_vars(run_id="r1", unquarantine="worker2,nosuchhost"), shared)
    res = action({}).run(task_vars=tv)
    assert res["failed"] is True
    assert res["msg"] == ("The job cannot start: unquarantine=worker2,nosuchhost names nosuchhost, which is no worker "
                          "or spare of the inventory and not quarantined. Fix: name inventory nodes (the quarantined "
                          "nodes are worker2).")
    # A spare of the inventory is a node too; with nothing quarantined, the fix says so.
    recovery.save_quarantine(str(path), {})
    tv = coordinator_read(task_vars(run_id="r2", unquarantine="spare1"), shared)
    tv["groups"]["spares"] = ["spare1"]
    assert not action({}).run(task_vars=tv).get("failed")
    res = action({}).run(task_vars=coordinator_read(task_vars(run_id="r3", unquarantine="wrker1"), shared))
    assert "Fix: name inventory nodes (no node is quarantined: leave unquarantine out)" in res["msg"]


def test_min_nodes_above_the_rank_nodes_is_refused(tmp_path):
    res = action({}).run(task_vars=task_vars(run_id="r1", min_nodes="5", restarts="2",
                                             quarantine_file=str(tmp_path / "q.json")))
    assert res["failed"] is True
    assert ("min_nodes=5 is more than the job's 2 rank node(s) (worker1, worker2), so no attempt could ever have as "
            "many. Fix: -e min_nodes=<2 or fewer>") in res["msg"]
    res = action({}).run(task_vars=task_vars(run_id="r2", min_nodes="2", restarts="2",
                                             quarantine_file=str(tmp_path / "q.json")))
    assert not res.get("failed") and res["job"]["min_nodes"] == 2


def test_the_secrets_a_workdir_leaves_out_are_named_once_per_run(tmp_path, monkeypatch):
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("print(1)\n")
    (proj / ".env").write_text("K=v\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    res = action({}).run(task_vars=task_vars(run_id="r1", workdir="proj", entrypoint="train.py",
                                             quarantine_file=str(tmp_path / "q.json")))
    assert not res.get("failed"), res.get("msg")
    assert res["job"]["workdir"]["secrets_left_out"] == [".env"]
    assert res["warnings"] == ["workdir: 1 file(s) left out because their names say they hold secrets: .env. The "
                               "ranks get secrets from secret_env (node-local, mode 0600); to ship such a file "
                               "anyway: -e workdir_include_secrets=<pattern>"]
    files = (tmp_path / "home" / ".cache" / "multinode-deepspeed" / "workspaces" / (
        res["job"]["workdir"]["hash"] + ".files")).read_text()
    assert files == "./train.py\n"
    again = action({"settings": {"user_inputs": res["user_inputs"], "attempt": 2}}).run(
        task_vars=task_vars(run_id="r1", restarts="1", quarantine_file=str(tmp_path / "q.json")))
    assert not again.get("failed"), again.get("msg")
    assert not again.get("warnings")
    res = action({}).run(task_vars=task_vars(run_id="r3", workdir="proj", entrypoint="train.py",
                                             workdir_include_secrets=".env", quarantine_file=str(tmp_path / "q.json")))
    assert not res.get("warnings") and res["job"]["workdir"]["count"] == 2
