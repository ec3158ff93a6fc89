import json

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.multinode.deepspeed.plugins.modules import run_summary


def test_summary_json_written_from_metrics(tmp_path, capsys):
    (tmp_path / "metrics").mkdir()
    for rank, host in ((0, "worker1"), (1, "worker2")):
        lines = [{"event": "start", "rank": rank, "host": host, "local_rank": 0, "world_size": 2}]
        lines += [{"event": "step", "step": s, "loss": 5.0 - s, "step_time": 0.1, "tokens_per_sec": 10.0,
                   "rank": rank, "host": host} for s in (1, 2, 3)]
        lines += [{"event": "done", "rank": rank}]
        (tmp_path / "metrics" / f"rank{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "launcher.log").write_text("worker1: ok\n")
    with patch_module_args({"run_dir": str(tmp_path), "run_id": "r1", "world_size": 2, "launcher_rc": 0,
                            "wall_time": 3.5, "coordinator": "coord", "extra": {"model": "llama-tiny"}}):
        with pytest.raises(SystemExit):
            run_summary.main()
    res = json.loads(capsys.readouterr().out)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert res["summary"] == on_disk
    assert on_disk["status"] == "success" and on_disk["world_size"] == 2
    assert on_disk["hosts"] == {"worker1": [0], "worker2": [1]}
    assert (on_disk["first_loss"], on_disk["last_loss"]) == (4.0, 2.0)
    assert on_disk["model"] == "llama-tiny"
