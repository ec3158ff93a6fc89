"""The node_facts action: the read runs on the node without Ansible's module wrapper, and the module runs where that
cannot be done as the module would, or gave no result."""
from unittest.mock import MagicMock

from ansible_collections.multinode.deepspeed.plugins.plugin_utils import node_python
from ansible_collections.multinode.deepspeed.plugins.action.node_facts import ActionModule
from tests.unit.plugins.action_task import action_plugin, bare_python_node, node_connection
from tests.unit.plugins.module_utils.provision.test_node import DISTS, make_venv

MODULE_RESULT = {"changed": False, "ansible_facts": {"multinode_node": {"from": "module"}}}


def action(args, pipelining=True, async_val=0, **node_kwargs):
    plugin = action_plugin(ActionModule, "multinode.deepspeed.node_facts", args, connection=node_connection(pipelining))
    plugin._task.async_val = async_val
    plugin._task.delegate_to = None
    plugin._task.environment = []
    plugin.cmds = []
    plugin._low_level_execute_command = bare_python_node(plugin.cmds, **node_kwargs)
    plugin._execute_module = MagicMock(return_value=dict(MODULE_RESULT))
    return plugin


def vars_with(interpreter="/usr/bin/python3", facts=None):
    out = {"inventory_hostname": "worker1", "ansible_facts": dict(facts or {})}
    if interpreter is not None:
        out["ansible_python_interpreter"] = interpreter
    return out


def fixture_args(tmp_path):
    venv, lib = make_venv(tmp_path, DISTS)
    return {"venv": venv, "trainer_dir": lib, "nvidia_smi": str(tmp_path / "none"), "port": "", "user": "root"}


def test_reads_the_node_without_the_module_wrapper(tmp_path):
    plugin = action(fixture_args(tmp_path))
    res = plugin.run(task_vars=vars_with())
    assert not plugin._execute_module.called
    assert plugin.cmds == [("/usr/bin/python3", True)]  # the inventory's interpreter, become applied as for a module
    node = res["ansible_facts"]["multinode_node"]
    assert node["versions"]["deepspeed"] == "0.19.8" and node["uid"] == 0 and res["changed"] is False
    assert "discovered_interpreter_python" not in res["ansible_facts"]


def test_the_module_runs_when_the_node_gives_no_result(tmp_path):
    for rc, stdout in ((1, ""), (0, "not json"), (0, "[1, 2]")):
        plugin = action(fixture_args(tmp_path / str(rc) / str(len(stdout))), rc=rc, stdout=stdout)
        res = plugin.run(task_vars=vars_with())
        assert len(plugin.cmds) == 1 and plugin._execute_module.call_count == 1
        assert res["ansible_facts"] == MODULE_RESULT["ansible_facts"]


def test_the_module_runs_where_the_read_would_differ_from_it(tmp_path):
    args = fixture_args(tmp_path)
    cases = [({}, {"pipelining": False}), ({}, {"async_val": 30}), ({"venv": "~/venv"}, {}),
             ({"paths": ["$HOME/deepspeed_env"]}, {}), ({"record": "~/record.json"}, {}),
             ({"paths": "not-a-list-but-~"}, {})]
    for extra, how in cases:
        plugin = action(dict(args, **extra), **how)
        res = plugin.run(task_vars=vars_with())
        assert plugin.cmds == [] and plugin._execute_module.call_count == 1, (extra, how)
        assert res["ansible_facts"] == MODULE_RESULT["ansible_facts"]


def test_a_port_number_is_taken_as_the_module_takes_it(tmp_path):
    """type=str converts an int (the module's conversion too): no fallback needed for port: 29500."""
    plugin = action(dict(fixture_args(tmp_path), port=29500))
    res = plugin.run(task_vars=vars_with())
    assert not plugin._execute_module.called and res["ansible_facts"]["multinode_node"]["port"] == 29500


def test_interpreter_discovery_as_for_a_module(tmp_path, monkeypatch):
    found = []

    def discover(action, interpreter_name, discovery_mode, task_vars):
        found.append((interpreter_name, discovery_mode))
        return "/usr/bin/python3.11"
    monkeypatch.setattr(node_python, "discover_interpreter", discover)
    plugin = action(fixture_args(tmp_path))
    res = plugin.run(task_vars=vars_with(interpreter="auto_silent"))
    assert found == [("python", "auto_silent")] and plugin.cmds[0][0] == "/usr/bin/python3.11"
    assert res["ansible_facts"]["discovered_interpreter_python"] == "/usr/bin/python3.11"
    # Discovered before (an earlier module in the play): no second discovery, no fact returned again.
    plugin = action(fixture_args(tmp_path / "again"))
    res = plugin.run(task_vars=vars_with(interpreter="auto", facts={"discovered_interpreter_python": "/opt/py"}))
    assert len(found) == 1 and plugin.cmds[0][0] == "/opt/py"
    assert "discovered_interpreter_python" not in res["ansible_facts"]


def test_check_mode_reads_the_same_way(tmp_path):
    """node_facts only reads: check mode changes nothing in how it runs."""
    plugin = action(fixture_args(tmp_path))
    plugin._task.check_mode = True
    res = plugin.run(task_vars=vars_with())
    assert not plugin._execute_module.called and res["ansible_facts"]["multinode_node"]["uid"] == 0
