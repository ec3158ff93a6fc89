"""run_prepare: the run's checks (new run id, the user's script, the trainer's dry run), then its directory."""
import json
import os
import shutil
import sys
import time

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import prepare
from ansible_collections.multinode.deepspeed.plugins.modules import run_prepare

ENV = {"PYTHONUNBUFFERED": "1", "DS_ACCELERATOR": "cpu", "MULTINODE_DS_RUN_ID": "r1", "A_FIRST": "x=y",
       "HOSTILE": "a b; $(touch /tmp/x)"}
HOSTFILE = "worker1 slots=1\nworker2 slots=1\n"


def make_job(tmp_path, **kw):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    job = {"run_id": "r1", "run_dir": str(tmp_path / "shared" / "runs" / "r1"), "shared_dir": str(tmp_path / "shared"),
           "coordinators": ["coord"], "metrics": False, "entrypoint": str(script), "accelerator": "cpu",
           "dry_run": None, "hostfile": HOSTFILE, "env": dict(ENV), "program": [str(script), "--x", "a b;c"]}
    job.update(kw)
    return job


def test_write_creates_the_run_directory(tmp_path, run_module):
    job = make_job(tmp_path)
    res = run_module(run_prepare, {"job": job})
    run_dir = tmp_path / "shared" / "runs" / "r1"
    assert res.get("failed") is not True, res
    assert res["changed"] is True and res["run_dir"] == str(run_dir) and "dry_run" not in res
    for sub in ("logs", "control", "nodes"):
        assert (run_dir / sub).is_dir()
    assert (run_dir / "hostfile").read_text() == HOSTFILE
    # DeepSpeed's pdsh runner pastes .deepspeed_env into a remote shell: only the values it can pass as they are.
    env_lines = (run_dir / ".deepspeed_env").read_text().splitlines()
    assert env_lines == ["A_FIRST=x=y", "DS_ACCELERATOR=cpu", "MULTINODE_DS_RUN_ID=r1", "PYTHONUNBUFFERED=1"]
    # The whole environment, verbatim, for multinode_ds.rank; both files are the owner's only.
    assert "HOSTILE=a b; $(touch /tmp/x)" in (run_dir / "rank.env").read_text().splitlines()
    assert oct(os.stat(run_dir / "rank.env").st_mode & 0o777) == "0o600"
    assert oct(os.stat(run_dir / ".deepspeed_env").st_mode & 0o777) == "0o600"
    assert json.loads((run_dir / "program.json").read_text()) == job["program"]
    lease = float((run_dir / "control" / "lease").read_text())
    assert lease > 1.7e9
    names = ("hostfile", ".deepspeed_env", "rank.env", "program.json", "control/lease")
    assert sorted(res["written"]) == sorted(str(run_dir / n) for n in names)
    assert not list(run_dir.rglob("*.tmp"))


def test_a_directory_a_failed_preflight_left_is_reused(tmp_path, run_module):
    job = make_job(tmp_path)
    os.makedirs(os.path.join(job["run_dir"], "preflight"))
    res = run_module(run_prepare, {"job": job})
    assert res["changed"] is True and os.path.isfile(os.path.join(job["run_dir"], "hostfile"))
    assert os.path.isdir(os.path.join(job["run_dir"], "preflight"))


def test_an_existing_hostfile_fails(tmp_path, run_module):
    job = make_job(tmp_path)
    os.makedirs(job["run_dir"])
    with open(os.path.join(job["run_dir"], "hostfile"), "w") as fh:
        fh.write("old slots=1\n")
    res = run_module(run_prepare, {"job": job})
    assert res["failed"] is True
    assert "run_id=r1" in res["msg"] and "Fix:" in res["msg"] and "coord" in res["msg"]
    # Nothing of the old run is touched.
    with open(os.path.join(job["run_dir"], "hostfile")) as fh:
        assert fh.read() == "old slots=1\n"
    assert not os.path.exists(os.path.join(job["run_dir"], ".deepspeed_env"))


def test_a_missing_entrypoint_fails_naming_it(tmp_path, run_module):
    missing = str(tmp_path / "nowhere" / "my_train.py")
    job = make_job(tmp_path, entrypoint=missing)
    res = run_module(run_prepare, {"job": job})
    assert res["failed"] is True
    assert ("entrypoint=%s does not exist" % missing) in res["msg"] and "Fix:" in res["msg"]
    assert not os.path.exists(job["run_dir"])


def test_write_false_writes_nothing(tmp_path, run_module):
    job = make_job(tmp_path)
    res = run_module(run_prepare, {"job": job, "write": False})
    assert res["changed"] is False and res["written"] == [] and res["run_dir"] == job["run_dir"]
    assert not os.path.exists(job["run_dir"])


def test_check_mode_writes_nothing(tmp_path, run_module):
    job = make_job(tmp_path)
    res = run_module(run_prepare, {"job": job, "_ansible_check_mode": True})
    assert res["changed"] is False and not os.path.exists(job["run_dir"])


def test_check_false_skips_the_checks(tmp_path, run_module):
    # A missing script and a dry run that would fail: neither is looked at.
    job = make_job(tmp_path, entrypoint=str(tmp_path / "missing.py"))
    res = run_module(run_prepare, {"job": job, "check": False})
    assert res.get("failed") is not True, res
    assert res["changed"] is True and os.path.isfile(os.path.join(job["run_dir"], "hostfile"))
    job = make_job(tmp_path, run_dir=str(tmp_path / "r2"), metrics=True,
                   dry_run=[sys.executable, "-c", "import sys; sys.exit(2)"])
    res = run_module(run_prepare, {"job": job, "check": False})
    assert res.get("failed") is not True and "dry_run" not in res


def test_the_trainer_refusing_the_run_fails(tmp_path, run_module):
    script = ("import sys\n"
              "print('reading the registry', file=sys.stderr)\n"
              "print('multinode_ds: too big. Fix: x', file=sys.stderr)\n"
              "print('', file=sys.stderr)\n"
              "sys.exit(2)\n")
    job = make_job(tmp_path, metrics=True, entrypoint="", dry_run=[sys.executable, "-c", script])
    res = run_module(run_prepare, {"job": job})
    assert res["failed"] is True
    assert "refuses this run" in res["msg"] and "too big. Fix: x" in res["msg"]
    assert "multinode_ds: too big" not in res["msg"] and "coord" in res["msg"]
    assert not os.path.exists(job["run_dir"])


def test_the_trainer_failing_silently_gives_its_exit_code(tmp_path, run_module):
    job = make_job(tmp_path, metrics=True, dry_run=[sys.executable, "-c", "import sys; sys.exit(3)"])
    res = run_module(run_prepare, {"job": job})
    assert res["failed"] is True and "exit code 3" in res["msg"]


def test_the_trainers_plan_is_returned(tmp_path, run_module):
    plan = {"model": "llama-tiny", "n_params": 1234, "world_size": 2, "zero_stage": 1,
            "estimated_gib_per_rank": 0.01, "memory_gib_per_rank": 4.0}
    script = ("import json, os, sys\n"
              "print('loading')\n"
              "print(json.dumps(dict(%r, accel=os.environ.get('DS_ACCELERATOR'))))\n" % (plan,))
    job = make_job(tmp_path, metrics=True, accelerator="cuda", dry_run=[sys.executable, "-c", script])
    res = run_module(run_prepare, {"job": job, "write": False})
    assert res.get("failed") is not True, res
    # The dry run sees the job's accelerator.
    assert res["dry_run"] == dict(plan, accel="cuda")
    assert not os.path.exists(job["run_dir"])


def test_the_trainer_printing_no_json_gives_an_empty_plan(tmp_path, run_module):
    job = make_job(tmp_path, metrics=True, dry_run=[sys.executable, "-c", "print('not json')"])
    res = run_module(run_prepare, {"job": job, "write": False})
    assert res["dry_run"] == {}


def lock_job(tmp_path, run_id):
    return make_job(tmp_path, run_id=run_id, run_dir=str(tmp_path / "shared" / "runs" / run_id),
                    checkpoint_dir=str(tmp_path / "shared" / "checkpoints" / "llama-tiny"),
                    checkpoint_lock=str(tmp_path / "shared" / "checkpoints" / "llama-tiny.lock"))


def test_a_second_run_on_the_same_checkpoints_fails_naming_the_first(tmp_path, run_module):
    first = lock_job(tmp_path, "run-a")
    assert run_module(run_prepare, {"job": first})["changed"] is True
    assert '"run_id": "run-a"' in open(first["checkpoint_lock"]).read()
    res = run_module(run_prepare, {"job": lock_job(tmp_path, "run-b")})
    assert res["failed"] is True
    assert res["msg"].startswith("checkpoint directory %s is in use by run run-a" % first["checkpoint_dir"])
    assert "Fix: wait for run-a to end or stop it" in res["msg"]
    assert not os.path.exists(os.path.join(str(tmp_path / "shared" / "runs" / "run-b"), "hostfile"))


def test_a_lock_whose_run_ended_or_went_silent_is_taken_over(tmp_path, run_module):
    first = lock_job(tmp_path, "run-a")
    run_module(run_prepare, {"job": first})
    lease = os.path.join(first["run_dir"], "control", "lease")
    # Older than the agents' lease timeout (the watch's retry window and a margin): its controller is gone.
    from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import lock as _lock
    old = os.path.getmtime(lease) - _lock.LEASE_ALIVE - 5
    os.utime(lease, (old, old))
    second = lock_job(tmp_path, "run-b")
    assert run_module(run_prepare, {"job": second})["changed"] is True
    assert '"run_id": "run-b"' in open(second["checkpoint_lock"]).read()
    open(os.path.join(second["run_dir"], "control", "DONE"), "w").close()
    assert run_module(run_prepare, {"job": lock_job(tmp_path, "run-c")})["changed"] is True
    # An aborted run (Ctrl-C) no longer holds it either, even while its lease is fresh.
    open(os.path.join(tmp_path / "shared" / "runs" / "run-c", "control", "ABORT"), "w").close()
    assert run_module(run_prepare, {"job": lock_job(tmp_path, "run-d")})["changed"] is True


def test_a_play_that_loses_the_lock_gives_its_claim_back(tmp_path, run_module):
    """Two plays that both passed the check: the one that finds the lock taken when it writes fails naming the
    holder, and leaves no claim on its run directory (the same run id can be tried again)."""
    first = lock_job(tmp_path, "run-a")
    assert run_module(run_prepare, {"job": first})["changed"] is True
    second = dict(lock_job(tmp_path, "run-b"), run_token="tok-b")
    res = run_module(run_prepare, {"job": second, "check": False})
    assert res["failed"] is True and "is in use by run run-a" in res["msg"]
    assert not os.path.exists(os.path.join(second["run_dir"], "control", "claim"))
    open(os.path.join(first["run_dir"], "control", "DONE"), "w").close()
    assert run_module(run_prepare, {"job": dict(second, run_token="tok-b2")})["changed"] is True


def agent_of(job, script, node="coord"):
    return {"node": node, "argv": [sys.executable, "-c", script], "chdir": job["run_dir"],
            "log": os.path.join(job["run_dir"], "nodes", node + ".agent.log"), "environment": {"MARK": "m1"}}


def stop(pid):
    import signal  # pylint: disable=import-outside-toplevel
    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except OSError:
        pass


def test_the_agent_starts_in_the_written_directory_in_the_same_call(tmp_path, run_module):
    """The coordinator's agent starts once the directory is written: it finds its hostfile and its log's folder."""
    job = make_job(tmp_path)
    script = ("import os, time; print(os.path.isfile('hostfile'), os.environ['MARK'], flush=True); "
              "time.sleep(30)")
    res = run_module(run_prepare, {"job": job, "agent": agent_of(job, script)})
    assert res.get("failed") is not True, res
    try:
        assert res["agent_node"] == "coord" and res["changed"] is True
        os.kill(res["agent_pid"], 0)
        log = os.path.join(job["run_dir"], "nodes", "coord.agent.log")
        deadline = time.time() + 10
        while time.time() < deadline and not open(log).read().strip():
            time.sleep(0.05)
        assert open(log).read().split() == ["True", "m1"]
    finally:
        stop(res["agent_pid"])


def test_no_agent_without_a_directory_or_while_the_workdir_is_not_there(tmp_path, run_module):
    job = make_job(tmp_path)
    script = "import time; time.sleep(30)"
    res = run_module(run_prepare, {"job": job, "write": False, "agent": agent_of(job, script)})
    assert "agent_pid" not in res and not os.path.exists(job["run_dir"])
    marker = tmp_path / "shared" / "workspaces" / "w1.json"
    os.makedirs(marker.parent)
    wd = dict(make_job(tmp_path, run_id="r2", run_dir=str(tmp_path / "shared" / "runs" / "r2")),
              workdir={"dest": str(tmp_path / "shared" / "workspaces" / "w1"), "marker": str(marker),
                       "root": str(tmp_path)})
    res = run_module(run_prepare, {"job": wd, "agent": agent_of(wd, script)})
    assert res.get("failed") is not True, res
    assert res["workspace_present"] is False and "agent_pid" not in res
    assert os.path.isfile(os.path.join(wd["run_dir"], "hostfile"))  # written: the play copies, then starts it


def test_an_agent_that_exits_at_once_fails_the_call_naming_the_node(tmp_path, run_module):
    job = make_job(tmp_path)
    script = "import sys; sys.stderr.write('no launcher\\n'); sys.exit(4)"
    agent = dict(agent_of(job, script), settle=5)
    res = run_module(run_prepare, {"job": job, "agent": agent})
    assert res["failed"] is True and res["rc"] == 4
    assert "exited at once with code 4" in res["msg"] and "no launcher" in res["msg"] and "coord's agent" in res["msg"]


def shipped_job(tmp_path, run_id="r3"):
    """A job with a workdir marked whole on the shared directory (as workspace_mark leaves it: sealed, marked)."""
    from ansible_collections.multinode.deepspeed.plugins.module_utils.plan import workdir
    project = tmp_path / "proj"
    (project / "data").mkdir(parents=True)
    (project / "data" / "points.txt").write_text("1 2\n")
    (project / "train.py").write_text("print('x')\n")
    plan = workdir.plan(str(project), "train.py", [], None, "/")
    dest = tmp_path / "shared" / "workspaces" / plan["id"]
    shutil.copytree(project, dest)
    workdir.seal(str(dest))
    marker = str(dest) + ".json"
    with open(marker, "w") as fh:
        fh.write("{}\n")
    shipped = dict(plan, dest=str(dest), marker=marker)
    return dict(make_job(tmp_path, run_id=run_id, run_dir=str(tmp_path / "shared" / "runs" / run_id)), workdir=shipped)


def test_the_ranks_work_directory_links_each_top_entry_of_the_workspace(tmp_path, run_module):
    job = shipped_job(tmp_path)
    res = run_module(run_prepare, {"job": job})
    assert res.get("failed") is not True, res
    assert res["workspace_present"] is True and "warnings" not in res
    work = os.path.join(job["run_dir"], "work")
    assert work in res["written"] and sorted(os.listdir(work)) == ["data", "train.py"]
    for name in ("data", "train.py"):
        assert os.readlink(os.path.join(work, name)) == os.path.join(job["workdir"]["dest"], name)
    assert open(os.path.join(work, "data", "points.txt")).read() == "1 2\n"


def test_a_marked_workspace_that_changed_is_said_removed_and_copied_again(tmp_path, run_module):
    job = shipped_job(tmp_path)
    dest = job["workdir"]["dest"]
    os.chmod(os.path.join(dest, "data"), 0o700)  # what a rank would have to do to write there
    with open(os.path.join(dest, "data", "out.log"), "w") as fh:
        fh.write("a rank wrote here\n")
    # What the action plugin returns (the module hands the same lines to module.warn).
    res = prepare.prepare({"job": job, "write": False, "check": True, "agent": None})
    assert res["workspace_present"] is False and os.path.isfile(job["workdir"]["marker"])  # the check changes nothing
    warnings = res["warnings"]
    assert len(warnings) == 1 and warnings[0].startswith(
        "workspace %s was marked whole and has changed since (the copy in %s is not the content the plan hashed"
        % (job["workdir"]["id"], dest))
    assert "It is removed and copied again" in warnings[0]
    res = run_module(run_prepare, {"job": job, "check": False})
    assert res.get("failed") is not True, res
    # The write, before the copy: no marker, no tree (the file written there would stay beside a new copy).
    assert not os.path.exists(job["workdir"]["marker"]) and not os.path.exists(dest)
    assert os.path.islink(os.path.join(job["run_dir"], "work", "data"))


def test_an_unchanged_marked_workspace_is_kept_by_the_write(tmp_path, run_module):
    job = shipped_job(tmp_path, run_id="r4")
    res = run_module(run_prepare, {"job": job, "check": False})
    assert res.get("failed") is not True, res
    assert os.path.isfile(job["workdir"]["marker"]) and os.listdir(job["workdir"]["dest"])
