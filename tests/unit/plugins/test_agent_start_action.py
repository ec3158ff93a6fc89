"""The agent_start action: the agent started detached from a Python start of its own on the node (no module wrapper),
with the module's result and failures; the module runs in check mode or without pipelining."""
import sys
import time

from ansible_collections.multinode.deepspeed.plugins.action.agent_start import ActionModule
from tests.unit.plugins.action_task import direct_action

VARS = {"ansible_python_interpreter": "/usr/bin/python3", "inventory_hostname": "worker1"}


def action(args, pipelining=True, check_mode=False):
    return direct_action(ActionModule, "multinode.deepspeed.agent_start", args, pipelining, check_mode)


def test_starts_the_agent_detached(tmp_path):
    log = tmp_path / "agent.log"
    argv = [sys.executable, "-c", "import os, time; print(os.environ['MARK'], os.getcwd()); time.sleep(1)"]
    started = time.time()
    plugin = action({"argv": argv, "log": str(log), "chdir": str(tmp_path), "environment": {"MARK": "m1"}})
    res = plugin.run(task_vars=VARS)
    assert not plugin._execute_module.called and plugin.piped == [("/usr/bin/python3", True)]
    assert res["changed"] is True and res["pid"] > 0 and time.time() - started < 1.0  # back before the agent ended
    for dummy in range(50):
        if log.exists() and log.read_text():
            break
        time.sleep(0.05)
    assert log.read_text().split() == ["m1", str(tmp_path)]


def test_an_agent_that_cannot_start_fails_naming_why(tmp_path):
    res = action({"argv": [sys.executable, "-c", "import sys; sys.exit(5)"], "log": str(tmp_path / "a.log"),
                  "settle": 1.0}).run(task_vars=VARS)
    assert res["failed"] is True and res["rc"] == 5
    res = action({"argv": [str(tmp_path / "missing")], "log": str(tmp_path / "b.log")}).run(task_vars=VARS)
    assert res["failed"] is True and "missing" in res["msg"]


def test_the_module_runs_in_check_mode_or_without_pipelining(tmp_path):
    for how in ({"pipelining": False}, {"check_mode": True}):
        plugin = action({"argv": ["true"], "log": str(tmp_path / "a.log")}, **how)
        assert plugin.run(task_vars=VARS)["from"] == "module" and plugin.piped == []
