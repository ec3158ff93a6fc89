"""run_summary's action plugin: the summary written in the controller's own process (no module is started), with
the module's argument spec (defaults, types, a missing option refused)."""
import json
from unittest.mock import MagicMock

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.multinode.deepspeed.plugins.action import run_summary
from tests.unit.plugins.action_task import action_plugin


def plugin(args, check_mode=False):
    connection = MagicMock()
    module = action_plugin(run_summary.ActionModule, "multinode.deepspeed.run_summary", args, check_mode, connection)
    module._execute_module = MagicMock(side_effect=AssertionError("no module is started"))
    return module, connection


def write_run(run_dir):
    (run_dir / "metrics").mkdir()
    for rank, host in ((0, "worker1"), (1, "worker2")):
        recs = [{"event": "start", "rank": rank, "host": host, "local_rank": 0, "world_size": 2}]
        recs += [{"event": "step", "step": s, "loss": 5.0 - s, "step_time": 0.1, "rank": rank, "host": host}
                 for s in (1, 2)]
        recs.append({"event": "done", "rank": rank})
        (run_dir / "metrics" / f"rank{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))


def test_the_summary_is_written_on_the_controller_without_a_module(tmp_path):
    write_run(tmp_path)
    module, connection = plugin({"run_dir": str(tmp_path), "run_id": "r1", "world_size": "2", "launcher_rc": 0,
                                 "plots": False, "extra": {"model": "llama-tiny"}})
    result = module.run(task_vars={})
    assert not result.get("failed"), result
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert result["summary"] == on_disk and result["changed"] is True
    assert on_disk["status"] == "success" and on_disk["world_size"] == 2 and on_disk["model"] == "llama-tiny"
    assert result["message"].startswith("Run r1: world size 2 on worker1 ranks [0], worker2 ranks [1]")
    assert not connection.exec_command.called and not connection.put_file.called
    # The same run summarized again: nothing changed.
    assert module.run(task_vars={})["changed"] is False


def test_check_mode_writes_nothing(tmp_path):
    write_run(tmp_path)
    module, _connection = plugin({"run_dir": str(tmp_path), "run_id": "r1", "launcher_rc": 0, "plots": False},
                                 check_mode=True)
    result = module.run(task_vars={})
    assert result["summary"]["status"] == "success"
    assert not (tmp_path / "summary.json").exists() and not (tmp_path / "report.md").exists()


def test_a_missing_option_is_refused_by_the_modules_spec(tmp_path):
    module, _connection = plugin({"run_dir": str(tmp_path)})
    with pytest.raises(AnsibleActionFail, match="run_id"):
        module.run(task_vars={})
    assert not (tmp_path / "summary.json").exists()
