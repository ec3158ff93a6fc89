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


def test_plots_drawn_in_the_background_appear_after_the_module_answered(tmp_path, capsys):
    import time
    (tmp_path / "metrics").mkdir()
    recs = [{"event": "start", "rank": 0, "host": "worker1", "local_rank": 0, "world_size": 1}]
    recs += [{"event": "step", "step": s, "loss": 5.0 - s, "step_time": 0.1, "tokens_per_sec": 10.0, "rank": 0,
              "host": "worker1"} for s in (1, 2, 3)]
    (tmp_path / "metrics" / "rank0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    with patch_module_args({"run_dir": str(tmp_path), "run_id": "r1", "world_size": 1, "launcher_rc": 0,
                            "plots_in_background": True}):
        with pytest.raises(SystemExit):
            run_summary.main()
    res = json.loads(capsys.readouterr().out)
    names = ["loss.png", "throughput.png", "step_time.png"]
    assert [p.rsplit("/", 1)[1] for p in res["plots"]] == names
    assert "![loss](plots/loss.png)" in (tmp_path / "report.md").read_text()
    deadline = time.time() + 30
    while time.time() < deadline and not all((tmp_path / "plots" / n).exists() for n in names):
        time.sleep(0.2)
    time.sleep(0.5)  # the last one written whole
    assert all((tmp_path / "plots" / n).read_bytes()[:4] == b"\x89PNG" for n in names)


def test_a_lost_node_is_named_first_and_its_peers_failure_is_a_consequence(tmp_path, capsys):
    (tmp_path / "metrics").mkdir()
    (tmp_path / "logs").mkdir()
    (tmp_path / "nodes").mkdir()
    (tmp_path / "control").mkdir()
    (tmp_path / "hostfile").write_text("worker1 slots=1\nworker2 slots=1\n")
    for rank, host in ((0, "worker1"), (1, "worker2")):
        recs = [{"event": "start", "rank": rank, "host": host, "local_rank": 0, "world_size": 2},
                {"event": "step", "step": 1, "loss": 5.0, "step_time": 0.1, "rank": rank, "host": host}]
        (tmp_path / "metrics" / f"rank{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
    (tmp_path / "nodes" / "worker1.launcher.log").write_text(
        "[2026-11-23 17:00:05,123] [ERROR] [launch.py:341:sigkill_handler] ['python', '-u', '-m', "
        "'multinode_ds.train', '--local_rank=0'] exits with return code = 1\n")
    (tmp_path / "logs" / "20261123_rank0.log").write_text(
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error [10.89.0.12]:43209: "
        "Connection reset by peer\n")
    (tmp_path / "control" / "ABORT").write_text(json.dumps(
        {"reason": "node worker2 stopped answering (no heartbeat for 21s)", "host": "controller", "lost": ["worker2"]}))
    with patch_module_args({"run_dir": str(tmp_path), "run_id": "r1", "world_size": 2, "launcher_rc": 1,
                            "coordinator": "coord", "plots": False,
                            "addresses": {"worker1": "10.89.0.11", "worker2": "10.89.0.12"}}):
        with pytest.raises(SystemExit):
            run_summary.main()
    res = json.loads(capsys.readouterr().out)
    summary = res["summary"]
    assert summary["lost"] == ["worker2"]
    assert summary["problems"][:2] == [
        "worker2 was lost: node worker2 stopped answering (no heartbeat for 21s)",
        "rank 0 on worker1 failed because its peer went away (exit code 1)"]
    lines = res["message"].splitlines()
    assert lines[1:3] == ["Lost first: worker2", "Then failed: rank 0 on worker1, exit code 1"]
    assert "Read error [10.89.0.12 (worker2)]:43209: Connection reset by peer" in res["message"]
