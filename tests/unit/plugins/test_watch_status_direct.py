"""The watch's status call runs run_status's function in a Python start of its own on the coordinator (no module
wrapper), with the module's arguments and result; the module runs where that cannot be done as it would."""
import json
from unittest.mock import MagicMock

from ansible_collections.multinode.deepspeed.plugins.action import watch
from test_watch_loop import plugin
from tests.unit.plugins.action_task import bare_python_node, node_connection


def direct(tmp_path, pipelining=True, check_mode=False):
    module = plugin(None, run_dir=str(tmp_path / "r1"))
    del module._status  # the real one
    module._task.check_mode = check_mode
    module._task.async_val = 0
    module._task.environment = []
    module._connection = node_connection(pipelining)
    module.piped = []
    module._low_level_execute_command = bare_python_node(module.piped)
    module._execute_module = MagicMock(return_value={"nodes": {}, "abort": None, "from": "module"})
    return module


def layout(tmp_path):
    run = tmp_path / "r1"
    (run / "nodes").mkdir(parents=True)
    (run / "metrics").mkdir()
    (run / "nodes" / "coord.json").write_text(json.dumps({"host": "coord", "state": "running", "time": 1.0}))
    (run / "metrics" / "rank0.jsonl").write_text(json.dumps({"event": "step", "step": 3, "rank": 0}) + "\n")
    return run


def test_the_status_call_runs_without_the_module_wrapper(tmp_path):
    run = layout(tmp_path)
    module = direct(tmp_path)
    res = module._status({"ansible_python_interpreter": "/usr/bin/python3"}, abort="rank 1 failed", cause="x")
    assert not module._execute_module.called and module.piped == [("/usr/bin/python3", True)]
    assert res["nodes"]["coord"]["state"] == "running" and res["ranks"]["0"]["step"] == 3
    # It did what the module does: the lease renewed, the abort record written.
    assert (run / "control" / "lease").exists() and res["changed"] is True
    assert json.loads((run / "control" / "ABORT").read_text())["reason"] == "rank 1 failed"
    assert res["abort"]["cause"] == "x"


def test_a_bad_finish_is_the_modules_failure(tmp_path):
    layout(tmp_path)
    module = direct(tmp_path)
    try:
        module._status({"ansible_python_interpreter": "/usr/bin/python3"}, finish={"nodes": "coord"})
    except watch.StatusFailed as exc:
        assert "finish needs nodes (a list)" in str(exc)
    else:
        raise AssertionError("a bad finish was taken")
    assert not module._execute_module.called


def test_the_module_runs_in_check_mode_or_without_pipelining(tmp_path):
    run = layout(tmp_path)
    for how in ({"pipelining": False}, {"check_mode": True}):
        module = direct(tmp_path, **how)
        res = module._status({"ansible_python_interpreter": "/usr/bin/python3"})
        assert module.piped == [] and res["from"] == "module" and module._execute_module.call_count == 1
    assert not (run / "control").exists()
