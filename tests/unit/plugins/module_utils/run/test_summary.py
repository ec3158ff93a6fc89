import json

from ansible_collections.multinode.deepspeed.plugins.module_utils.run.summary import read_jsonl, summarize


def _rank(rank, host, losses, done=True, world=2):
    recs = [{"event": "start", "rank": rank, "host": host, "local_rank": 0, "world_size": world}]
    for i, loss in enumerate(losses, 1):
        recs.append({"event": "step", "step": i, "loss": loss, "step_time": 0.5, "tokens_per_sec": 100.0 * i,
                     "rank": rank, "host": host})
    if done:
        recs.append({"event": "done", "rank": rank})
    return recs


def test_successful_run():
    s = summarize("r1", {0: _rank(0, "w1", [5.0, 4.0, 3.0]), 1: _rank(1, "w2", [5.0, 4.0, 3.0])},
                  expected_world_size=2, launcher_rc=0, wall_time=12.5, coordinator="coord")
    assert s["status"] == "success", s["problems"]
    assert s["world_size"] == 2
    assert s["hosts"] == {"w1": [0], "w2": [1]}
    assert (s["first_loss"], s["last_loss"], s["steps"]) == (5.0, 3.0, 3)
    assert s["loss_fell"] is True
    assert s["mean_tokens_per_sec"] == 200.0
    json.dumps(s)


def test_rc_zero_but_rank_missing_is_a_failure():
    s = summarize("r1", {0: _rank(0, "w1", [5.0, 4.0])}, expected_world_size=2, launcher_rc=0)
    assert s["status"] == "failed"
    assert "no metrics from ranks 1" in s["problems"]


def test_unfinished_rank_and_rc():
    s = summarize("r1", {0: _rank(0, "w1", [5.0]), 1: _rank(1, "w2", [5.0], done=False)},
                  expected_world_size=2, launcher_rc=247)
    assert "rank 1 on w2 did not finish" in s["problems"]
    assert "the launcher exited with 247" in s["problems"]


def test_hostfile_fallback_detected():
    s = summarize("r1", {0: _rank(0, "coord", [5.0, 4.0], world=1)}, expected_world_size=2, launcher_rc=0,
                  coordinator="coord",
                  launcher_log="[WARNING] [runner.py:232:fetch_hostfile] Unable to find hostfile, will proceed "
                               "with training with local resources only.")
    assert any("fell back to the local node" in p for p in s["problems"])
    assert any("the coordinator coord ran ranks [0]" in p for p in s["problems"])
    assert "world size 1, expected 2 from the hostfile" in s["problems"]


def test_torn_last_line_is_skipped():
    text = '{"event": "step", "step": 1}\n{"event": "st'
    assert read_jsonl(text) == [{"event": "step", "step": 1}]


def test_hosts_are_the_inventory_names_from_the_hostfile():
    # The machines are called worker1/worker2; the inventory (and so the hostfile) says gpu-a1/gpu-a2.
    s = summarize("r1", {0: _rank(0, "worker1", [5.0, 4.0]), 1: _rank(1, "worker2", [5.0, 4.0])},
                  expected_world_size=2, launcher_rc=0, coordinator="coord", rank_hosts={0: "gpu-a1", 1: "gpu-a2"})
    assert s["status"] == "success", s["problems"]
    assert s["hosts"] == {"gpu-a1": [0], "gpu-a2": [1]}
    assert s["ranks"]["1"]["host"] == "gpu-a2"
    # A rank the hostfile does not place keeps the host it recorded.
    s = summarize("r1", {0: _rank(0, "gpu-a1", [5.0]), 1: _rank(1, "gpu-a2", [5.0])}, launcher_rc=0,
                  rank_hosts={0: "gpu-a1"})
    assert s["hosts"] == {"gpu-a1": [0], "gpu-a2": [1]}


def test_a_rank_that_ran_on_the_coordinator_is_caught_whatever_the_hostfile_says():
    s = summarize("r1", {0: _rank(0, "coord", [5.0, 4.0], world=1)}, launcher_rc=0, coordinator="coord",
                  rank_hosts={0: "worker1"})
    assert s["status"] == "failed" and "the coordinator coord ran ranks [0]" in s["problems"]


def test_a_one_worker_fallback_to_the_coordinator_is_caught_by_its_machine_name():
    # DeepSpeed fell back to the local node on a one-worker job: the rank read the one-line hostfile and
    # called itself "gpu-a1", but its start record names the machine it ran on, the coordinator's.
    recs = _rank(0, "gpu-a1", [5.0, 4.0], world=1)
    recs[0]["machine"] = "headnode"
    s = summarize("r1", {0: recs}, expected_world_size=1, launcher_rc=0, coordinator="coord",
                  rank_hosts={0: "gpu-a1"}, coordinator_machine="headnode")
    assert s["status"] == "failed" and "the coordinator coord ran ranks [0]" in s["problems"]
    recs[0]["machine"] = "worker1"
    s = summarize("r1", {0: recs}, expected_world_size=1, launcher_rc=0, coordinator="coord",
                  rank_hosts={0: "gpu-a1"}, coordinator_machine="headnode")
    assert s["status"] == "success", s["problems"]


def test_a_resumed_run_records_where_it_started():
    from ansible_collections.multinode.deepspeed.plugins.module_utils.run.summary import summarize as summ
    recs = {0: [{"event": "start", "rank": 0, "world_size": 1, "host": "w1", "start_step": 5, "resumed_from": "step5",
                 "skipped_checkpoints": [{"tag": "step10", "why": "torn"}]},
                {"event": "step", "step": 6, "loss": 1.0, "step_time": 0.1, "host": "w1"},
                {"event": "done", "rank": 0}]}
    s = summ("r", recs, expected_world_size=1, launcher_rc=0)
    assert s["resume"] == {"from_tag": "step5", "start_step": 5, "skipped": [{"tag": "step10", "why": "torn"}]}
    assert summ("r", {0: recs[0][1:]}, expected_world_size=1, launcher_rc=0)["resume"] is None
