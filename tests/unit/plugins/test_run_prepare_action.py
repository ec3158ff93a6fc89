"""The run_prepare action: the run's checks and directory made on the coordinator in a Python start of their own
(no module wrapper), with the module's result and failures; the module runs in check mode or without pipelining."""
import json
import os
import sys
import time

from ansible_collections.multinode.deepspeed.plugins.action.run_prepare import ActionModule
from tests.unit.plugins.action_task import direct_action
from tests.unit.plugins.modules.test_run_prepare_module import HOSTFILE, make_job


def action(args, pipelining=True, check_mode=False):
    return direct_action(ActionModule, "multinode.deepspeed.run_prepare", args, pipelining, check_mode)


VARS = {"ansible_python_interpreter": "/usr/bin/python3", "inventory_hostname": "coord"}


def test_writes_the_run_directory_and_starts_the_agent(tmp_path):
    job = make_job(tmp_path)
    log = tmp_path / "agent.log"
    agent = {"node": "coord", "argv": [sys.executable, "-c", "import time; print('up'); time.sleep(0.3)"],
             "log": str(log), "chdir": str(tmp_path), "environment": {}}
    plugin = action({"job": job, "agent": agent})
    before = time.time()
    res = plugin.run(task_vars=VARS)
    # The run's start, on the controller's clock, as the call began (the summary counts from it).
    assert before <= res["started"] <= time.time()
    assert not plugin._execute_module.called and plugin.piped == [("/usr/bin/python3", True)]
    run_dir = tmp_path / "shared" / "runs" / "r1"
    assert res["changed"] is True and (run_dir / "hostfile").read_text() == HOSTFILE
    assert json.loads((run_dir / "program.json").read_text()) == job["program"]
    assert oct(os.stat(run_dir / "rank.env").st_mode & 0o777) == "0o600"
    # The agent is detached: the call came back while it still ran, and it wrote its log.
    assert res["agent_node"] == "coord" and res["agent_pid"] > 0


def test_a_failed_check_is_the_modules_failure(tmp_path):
    job = make_job(tmp_path)
    plugin = action({"job": job})
    assert plugin.run(task_vars=VARS)["changed"] is True
    again = action({"job": job}).run(task_vars=VARS)
    assert again["failed"] is True and again["msg"].startswith("run_id=r1 exists already")
    missing = action({"job": make_job(tmp_path, run_id="r2", run_dir=str(tmp_path / "r2"),
                                      entrypoint=str(tmp_path / "nope.py"))}).run(task_vars=VARS)
    assert missing["failed"] is True and "entrypoint=%s does not exist" % (tmp_path / "nope.py") in missing["msg"]


def test_an_agent_that_exits_at_once_fails_with_its_exit_code(tmp_path):
    agent = {"node": "coord", "argv": [sys.executable, "-c", "import sys; sys.exit(7)"], "log": str(tmp_path / "a.log"),
             "settle": 1.0}
    res = action({"job": make_job(tmp_path), "agent": agent}).run(task_vars=VARS)
    assert res["failed"] is True and res["rc"] == 7 and "(coord's agent)" in res["msg"]


def test_the_module_runs_in_check_mode_or_without_pipelining(tmp_path):
    for how in ({"pipelining": False}, {"check_mode": True}):
        plugin = action({"job": make_job(tmp_path)}, **how)
        res = plugin.run(task_vars=VARS)
        assert plugin.piped == [] and res["from"] == "module" and isinstance(res["started"], float)
    assert not (tmp_path / "shared" / "runs" / "r1").exists()
