"""Grow-back (module_utils/run/grow.py, issue 47): what a shrunken attempt looks out for, when its watch looks,
who answered, the stop's words the recovery reads back, and the nodes of the attempt that grows back."""
from ansible_collections.multinode.deepspeed.plugins.module_utils.run import grow, recovery

FULL = ["worker1", "worker2"]


def test_a_shrunken_attempt_looks_out_for_the_nodes_it_lacks_while_a_restart_is_left():
    # Attempt 1 ended; attempt 2 runs on worker1 alone, and attempt 3 is still in the budget (restarts=2).
    assert grow.candidates(FULL, ["worker1"], set(), True, [], [], 1, 2) == {
        "nodes": ["worker2"], "spares": [], "width": 2}
    # No restart left for a third attempt: attempt 2 is the last, so it does not look.
    assert grow.candidates(FULL, ["worker1"], set(), True, [], [], 1, 1) is None
    # At full width there is nothing to grow to.
    assert grow.candidates(FULL, FULL, set(), True, [], [], 1, 5) is None
    # A quarantined node is never looked for; a backend that drains a lost node (Slurm) does not take it back.
    assert grow.candidates(FULL, ["worker1"], {"worker2"}, True, [], [], 1, 3) is None
    assert grow.candidates(FULL, ["worker1"], set(), False, [], [], 1, 3) is None


def test_a_spare_another_run_holds_is_looked_out_for_and_a_free_one_is_not():
    # A spare free now and not taken failed its check; one another run holds may become free.
    out = grow.candidates(FULL, ["worker1"], set(), False, ["spare1", "spare2"], ["spare2"], 1, 3)
    assert out == {"nodes": [], "spares": ["spare2"], "width": 2}


def test_the_watch_looks_every_few_seconds():
    assert grow.due(None, 100.0) and not grow.due(100.0, 103.0) and grow.due(100.0, 105.0)
    assert grow.due(100.0, 101.5, every=1)


def test_only_what_answers_and_is_free_grows_the_run_and_no_more_than_it_lacks():
    spec = {"nodes": ["worker2"], "spares": ["spare1", "spare2"], "missing": 1}
    reach = {"worker2": {"ok": False, "error": "No route to host"}, "spare1": {"ok": True}, "spare2": {"ok": True}}
    # spare1 answers but another run still holds it; spare2 answers and is free.
    assert grow.answered(spec, reach, ["spare1"]) == ["spare2"]
    reach["worker2"] = {"ok": True, "error": None}
    # The run's own node first, and only as many as the run lacks.
    assert grow.answered(spec, reach, []) == ["worker2"]
    assert grow.answered(dict(spec, missing=None), reach, []) == ["worker2", "spare1", "spare2"]
    assert grow.answered(spec, {}, []) == []


def test_the_stops_words_name_the_nodes_and_the_checkpoint_and_are_read_back():
    why = grow.reason(["worker2"], 2, True, 180, 1.2)
    assert why == ("grow back: worker2 answers again; the run was checkpointed at step 180 and grows back to 2 "
                   "nodes")
    assert grow.named(why) == ["worker2"]
    late = grow.reason(["worker2", "worker3"], 3, False, None, 61)
    assert late.startswith("grow back: worker2, worker3 answer again; no checkpoint came within 61s")
    assert grow.named(late) == ["worker2", "worker3"]
    assert grow.named("worker2 lost at step 14") is None and grow.named(None) is None


def test_the_grown_attempt_keeps_its_nodes_and_the_runs_order():
    assert grow.grown(["worker1"], ["worker2"], FULL, 2) == ["worker1", "worker2"]
    assert grow.grown(["worker2"], ["worker1"], FULL, 2) == ["worker1", "worker2"]
    # A spare comes after the run's own nodes; never more than the width, never one of the attempt's nodes dropped.
    assert grow.grown(["worker1"], ["spare1", "worker2"], FULL, 2) == ["worker1", "spare1"]
    assert grow.grown(["spare1"], ["worker1", "worker2"], FULL, 2) == ["worker1", "spare1"]
    assert grow.grown(["worker1"], [], FULL, 2) == ["worker1"]


def test_the_last_step_any_rank_recorded():
    ranks = {"0": {"event": "step", "step": 41}, "1": {"event": "step", "step": 43}, "2": {"event": "start"}}
    assert grow.last_step(ranks) == 43 and grow.last_step({}) == 0 and grow.last_step(None) == 0


SHRUNK = {"status": "failed", "hosts": {"worker1": [0]}, "last_step": 190, "entrypoint": "multinode_ds.train",
          "nodes": {"worker1": {"state": "aborted"}, "coord": {"state": "aborted"}},
          "watch": {"status": "failed", "reason": "grow back: worker2 answers again; the run was checkpointed at "
                                                  "step 180 and grows back to 2 nodes"},
          "abort": {"reason": "grow back: worker2 answers again", "time": 1030.0}, "problems": []}


def test_a_grow_back_is_retried_checked_and_never_a_fault_of_the_node():
    end = recovery.ending(SHRUNK)
    assert end["kind"] == recovery.GROW and end["nodes"] == ["worker2"] and end["signature"] is None
    assert end["why"].startswith("grow back: worker2 answers again")
    first = dict(kind=recovery.LOST, nodes=["worker2"], step=60, signature=None, why="worker2 lost", attempt=1)
    retry, why = recovery.judge([first, dict(end, attempt=2)], 2)
    assert retry and why == "grow: retried (attempt 3 of at most 3)"
    # The restart budget counts it as an attempt.
    assert recovery.judge([first, dict(end, attempt=2)], 1)[0] is False
    # The node is checked as a node back is (a quick look: it answered a moment ago), never drained or quarantined.
    assert recovery.nodes_to_check(end, reuse_lost=False) == ["worker2"]
    assert recovery.nodes_to_drain(end, reuse_lost=False) == []
    assert recovery.to_quarantine([first, dict(end, attempt=2)]) == {}
    assert recovery.wait_seconds(["worker2"], [], 120, kind=recovery.GROW) == recovery.QUICK_LOOK


def test_a_node_new_to_the_run_is_back_only_with_the_runs_stack():
    checks = [{"item": "worker2", "ansible_facts": {"multinode_node": {"stack_fingerprint": "aaa"}}},
              {"item": "spare1", "ansible_facts": {"multinode_node": {"stack_fingerprint": "bbb"}}}]
    back, notes = recovery.came_back(checks, {"worker1": "aaa"}, "aaa")
    assert back == ["worker2"] and notes == ["spare1 came back with another stack (fingerprint bbb, was aaa): "
                                             "not used again"]


def test_a_run_with_little_left_finishes_at_its_width():
    # 900 steps of 40 ms left: 36 s, worth a restart; 400 of them: 16 s, not.
    assert grow.worth_it(100, 1000, 0.04) and not grow.worth_it(600, 1000, 0.04)
    # Before the pace is known, or without a total, the watch looks.
    assert grow.worth_it(5, 1000, None) and grow.worth_it(5, None, 0.04)
