import json
from pathlib import Path

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.run import recovery

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "attempts"


def _fixture(name):
    """A summary.json that a fault test of the local cluster wrote (tests/fixtures/attempts)."""
    return json.loads((FIXTURES / name).read_text())


@pytest.mark.parametrize("name, kind, nodes", [
    ("lost.json", recovery.LOST, ["worker2"]),       # worker2 stopped at step 10 (test_faults.py)
    ("killed.json", recovery.KILLED, ["worker2"]),   # rank 1 SIGKILLed (test_launch.py)
    ("cut.json", recovery.LOST, ["worker2"]),        # worker2's network cut: the run stalled, worker2 named
    ("disk-full.json", recovery.DISK, []),           # the shared disk filled (test_hardening_runs.py)
    ("timeout.json", recovery.TIMEOUT, None),        # the run's timeout (test_slurm_cluster.py)
    # worker2 stopped and started 20 s later: its agent never ended, a peer's rank failed first (test_restarts.py)
    ("rebooted.json", recovery.LOST, ["worker2"]),
])
def test_endings_of_real_failures(name, kind, nodes):
    end = recovery.ending(_fixture(name))
    assert end["kind"] == kind, end
    if nodes is not None:
        assert end["nodes"] == nodes
    assert end["why"]


def test_a_killed_rank_is_retried_and_its_signature_names_rank_step_and_signal():
    end = recovery.ending(_fixture("killed.json"))
    assert end["signature"] == [1, 35, "killed by SIGKILL"]
    assert end["why"] == "rank 1 on worker2 killed by SIGKILL at step 35"
    assert recovery.judge([end], restarts=2) == (True, "killed: retried (attempt 2 of at most 3)")
    # The OOM killer choosing the same rank at the same step again is the same failure.
    assert recovery.judge([end, dict(end)], restarts=2)[0] is False


def test_a_lost_node_is_named_with_the_watchs_reason():
    end = recovery.ending(_fixture("lost.json"))
    assert end["why"].startswith("worker2 lost at step 25 (") and end["signature"] is None


def test_success_and_the_endings_never_retried():
    assert recovery.judge([{"kind": recovery.SUCCESS}], 3) == (False, "finished")
    for kind in (recovery.INTERRUPTED, recovery.TIMEOUT, recovery.DISK, recovery.QUEUE, recovery.UNKNOWN):
        retry, why = recovery.judge([{"kind": kind, "step": 50}], 3)
        assert not retry and "not retried" in why


def test_a_failure_before_the_first_step_of_the_first_attempt_is_not_retried():
    retry, why = recovery.judge([{"kind": recovery.ERROR, "step": None}], 3)
    assert not retry and "before its first step" in why
    # A later attempt that fails before its first step (its checkpoint load, say) may be retried.
    first = {"kind": recovery.LOST, "step": 30, "signature": None}
    assert recovery.judge([first, {"kind": recovery.KILLED, "step": None, "signature": [1, None, "x"]}], 3)[0]


def test_the_same_failure_twice_is_not_retried_but_a_different_one_is():
    a = {"kind": recovery.ERROR, "step": 20, "signature": [1, 20, "ValueError: boom"]}
    retry, why = recovery.judge([a, dict(a)], 5)
    assert not retry and why.startswith("the same failure twice (rank 1 at step 20: ValueError: boom)")
    b = dict(a, signature=[1, 40, "ValueError: boom"])
    assert recovery.judge([a, b], 5)[0]


def test_the_budget_bounds_the_attempts():
    lost = {"kind": recovery.LOST, "step": 10}
    assert recovery.judge([lost], 0) == (False, "the restart budget is spent (restarts=0)")
    assert recovery.judge([lost, lost], 1)[0] is False
    assert recovery.judge([lost, lost], 2)[0] is True


def test_a_failure_without_a_known_cause_is_unknown():
    end = recovery.ending({"status": "failed", "problems": []})
    assert end["kind"] == recovery.UNKNOWN


def test_the_same_node_is_used_again_when_it_came_back():
    out = recovery.next_nodes(["w1", "w2"], ["w2"], ["w2"], ["w3"], {})
    assert out == {"nodes": ["w1", "w2"], "replaced": {}, "dropped": []}


def test_a_spare_takes_the_place_of_a_node_that_did_not_come_back():
    out = recovery.next_nodes(["w1", "w2"], ["w2"], [], ["w3", "w4"], {})
    assert out == {"nodes": ["w1", "w3"], "replaced": {"w2": "w3"}, "dropped": []}


def test_quarantined_spares_and_spares_in_use_are_skipped():
    out = recovery.next_nodes(["w1", "w3"], ["w1"], [], ["w3", "w4", "w5"], {"w4": {}})
    assert out["nodes"] == ["w5", "w3"]


def test_a_quarantined_node_is_not_used_again_even_when_back():
    out = recovery.next_nodes(["w1", "w2"], ["w2"], ["w2"], ["w3"], {"w2": {}})
    assert out["nodes"] == ["w1", "w3"]


def test_fewer_nodes_only_down_to_min_nodes():
    out = recovery.next_nodes(["w1", "w2"], ["w2"], [], [], {})
    assert "no spare is free: 1 node(s) left, 2 needed" in out["error"] and "-e min_nodes=1" in out["error"]
    assert recovery.next_nodes(["w1", "w2"], ["w2"], [], [], {}, min_nodes=1) == {
        "nodes": ["w1"], "replaced": {}, "dropped": ["w2"]}
    assert "error" in recovery.next_nodes(["w1"], ["w1"], [], [], {}, min_nodes=0)


def test_a_node_that_failed_twice_is_quarantined_with_its_reason(tmp_path):
    attempts = [{"kind": "lost", "nodes": ["w2"]}, {"kind": "lost", "nodes": ["w1"]},
                {"kind": "lost", "nodes": ["w2"]}]
    assert recovery.to_quarantine(attempts) == {"w2": "lost twice"}
    assert recovery.to_quarantine([{"kind": "lost", "nodes": ["w2"]}, {"kind": "stalled", "nodes": ["w2"]}]) == {
        "w2": "lost, then stalled"}
    # A script's exception or a rank killed twice is not the node's fault.
    assert recovery.to_quarantine([{"kind": "error", "nodes": ["w2"]}, {"kind": "killed", "nodes": ["w2"]},
                                   {"kind": "error", "nodes": ["w2"]}]) == {}
    path = tmp_path / "q" / "quarantine.json"
    assert recovery.load_quarantine(str(path)) == {}
    nodes = recovery.quarantine({}, {"w2": "lost twice"}, "run-1", now=0)
    recovery.save_quarantine(str(path), nodes)
    assert recovery.load_quarantine(str(path)) == {"w2": {"since": 0, "reason": "lost twice", "run_id": "run-1"}}
    assert recovery.quarantine_lines(nodes, ["w1", "w2"]) == [
        "w2 is quarantined since 1970-01-01 00:00 UTC (lost twice in run run-1); -e unquarantine=w2 to use it again"]
    assert recovery.quarantine(nodes, {}, "run-2", release=["w2"]) == {}


def test_a_file_that_is_not_a_quarantine_file_is_an_error(tmp_path):
    path = tmp_path / "q.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="is not a quarantine file"):
        recovery.load_quarantine(str(path))


def test_counted_steps_and_goodput():
    attempts = [{"start_step": 0, "last_step": 57, "step_time": 1.0},
                {"start_step": 50, "last_step": 150, "step_time": 1.0}]
    assert recovery.counted_steps(attempts) == [50, 100]
    assert recovery.goodput(attempts, 200.0) == 0.75
    assert recovery.goodput(attempts, 0) is None
    # A script that did not resume starts again from 0: nothing of the first attempt counted.
    assert recovery.counted_steps([{"start_step": 0, "last_step": 30}, {"start_step": 0, "last_step": 90}]) == [0, 90]


def test_a_users_script_has_no_known_step_so_its_first_failure_is_retried_once():
    summary = {"status": "failed", "entrypoint": "/shared/user/train.py", "problems": ["rank 1 failed"],
               "failure": {"rank": 1, "host": "w2", "exit_code": 1, "signal": None, "line": "exits with 1",
                           "last_lines": "Traceback\nValueError: step 3"}}
    first = recovery.ending(summary)
    assert first["kind"] == recovery.ERROR and first["metrics"] is False
    assert recovery.judge([first], 2)[0] is True
    retry, why = recovery.judge([first, recovery.ending(summary)], 2)
    assert not retry and "the same failure twice (rank 1: ValueError: step 3)" in why


def test_the_runs_timeout_covers_every_attempt():
    assert recovery.timeout_left(3600, 1000.0, 1600.0) == 3000
    assert recovery.timeout_left(600, 1000.0, 1595.0) is None


@pytest.mark.parametrize("name, kind, nodes", [
    # scontrol set worker2 DOWN mid-run: Slurm ended the job NODE_FAIL (test_slurm_cluster.py)
    ("slurm-node-down.json", recovery.LOST, ["worker2"]),
    # rank 1 SIGKILLed under srun --kill-on-bad-exit (test_slurm_cluster.py)
    ("slurm-killed.json", recovery.KILLED, ["worker2"]),
])
def test_endings_of_real_slurm_failures(name, kind, nodes):
    end = recovery.ending(_fixture(name))
    assert (end["kind"], end["nodes"]) == (kind, nodes), end
    assert recovery.judge([end], restarts=1)[0] is True


def test_slurm_drains_a_lost_node_and_checks_a_killed_ranks_node_again():
    lost = recovery.ending(_fixture("slurm-node-down.json"))
    assert recovery.nodes_to_check(lost, reuse_lost=False) == [] and recovery.nodes_to_drain(lost, False) == ["worker2"]
    # pdsh and ssh-free wait for a lost node and use it again; nothing is drained.
    assert recovery.nodes_to_check(lost) == ["worker2"] and recovery.nodes_to_drain(lost) == []
    killed = recovery.ending(_fixture("slurm-killed.json"))
    assert recovery.nodes_to_check(killed, False) == ["worker2"] and recovery.nodes_to_drain(killed, False) == []


def test_scheduler_lost_reads_only_a_schedulers_verdict():
    assert recovery.scheduler_lost("node worker2 is DOWN* in Slurm (Not responding)") == ["worker2"]
    assert recovery.scheduler_lost("Slurm job 8 ended NODE_FAIL: node w-3 failed") == ["w-3"]
    assert recovery.scheduler_lost("Slurm job 8 ended NODE_FAIL: a node of worker[1-2] failed") == []
    assert recovery.scheduler_lost("rank 1 on worker2 exited with 1") == []


def _read(node, fingerprint=None, failed=False):
    if failed:
        return {"item": node, "unreachable": True, "msg": "ssh: connect timed out"}
    return {"item": node, "ansible_facts": {"multinode_node": {"stack_fingerprint": fingerprint}}}


def test_a_spare_takes_a_place_only_when_it_answers_with_the_runs_stack():
    ready, notes = recovery.spares_ready([_read("s1", failed=True), _read("s2", "bbb"), _read("s3", "aaa")], "aaa")
    assert ready == ["s3"]
    assert notes[0] == "spare s1 is not used: it did not answer (ssh: connect timed out)"
    assert "spare s2 is not used: its stack (fingerprint bbb) is not the run's (aaa). Fix: site.yml --limit s2" \
        == notes[1]
    fingerprints = {"w1": "aaa", "w2": "zzz"}
    assert recovery.run_fingerprint(["w1", "w2"], ["w1"], fingerprints) == "zzz"
    assert recovery.run_fingerprint(["w1"], ["w1"], fingerprints) == "aaa"
    assert recovery.run_fingerprint(["w9"], [], fingerprints) is None


def test_a_spare_held_by_one_run_is_not_free_to_another_until_it_ends_or_expires():
    held = recovery.hold_spares({}, ["s1"], "run-a", now=100.0, seconds=50)
    assert held["s1"] == {"run_id": "run-a", "since": 100.0, "until": 150.0}
    assert recovery.spares_held(held, "run-b", 120.0) == ["s1"]
    assert recovery.spares_held(held, "run-a", 120.0) == []          # its own run may keep it
    assert recovery.spares_held(held, "run-b", 151.0) == []          # past the run's timeout
    assert recovery.release_spares(held, "run-a") == {}
    # Holding again drops what expired; no timeout holds a day.
    again = recovery.hold_spares(held, ["s2"], "run-c", now=200.0, seconds=None)
    assert list(again) == ["s2"] and again["s2"]["until"] == 200.0 + recovery.HOLD_SECONDS


def test_two_plays_placing_at_once_never_take_the_same_spare(tmp_path):
    import threading
    path = str(tmp_path / "state" / "spares.json")
    taken = []

    def place(run_id):
        def take(held):
            free = [s for s in ("s1", "s2") if s not in recovery.spares_held(held, run_id, 10.0)]
            taken.append((run_id, free[0]))
            return recovery.hold_spares(held, free[:1], run_id, 10.0, 100), free[0]
        return recovery.update_spares(path, take)

    threads = [threading.Thread(target=place, args=("run-%d" % i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(s for _r, s in taken) == ["s1", "s2"]
    assert sorted(json.loads(open(path).read())["spares"]) == ["s1", "s2"]


def test_kubernetes_nodes_that_stopped_reporting_are_named_for_the_next_pods():
    # Both fake nodes stopped reporting before any rank started (test_kubernetes.py).
    end = recovery.ending(_fixture("k8s-nodes-lost.json"))
    assert end["kind"] == recovery.LOST and end["nodes"] == ["worker1", "worker2"]
    assert end["scheduler_nodes"] == ["gpu-a", "gpu-b"]
    # A node lost before the first step is not the run's fault: retried.
    assert recovery.judge([end], restarts=1)[0] is True
    assert recovery.ending(_fixture("killed.json"))["scheduler_nodes"] == []


def test_a_straggler_moved_off_is_retried_without_waiting_and_quarantined_at_once():
    """on_straggler=replace: the watch stopped the attempt naming the slow node (module_utils/run/stragglers.py)."""
    why = ("worker2 is a straggler: its ranks compute at 31% of the fastest rank's pace (score 0.31) since step 24")
    summary = {"status": "failed", "last_step": 40, "watch": {"status": "failed", "reason": why},
               "nodes": {"worker1": {"state": "aborted"}, "worker2": {"state": "aborted"}}}
    end = recovery.ending(summary)
    assert end["kind"] == recovery.STRAGGLER and end["nodes"] == ["worker2"] and end["why"] == why
    assert recovery.judge([end], restarts=1) == (True, "straggler: retried (attempt 2 of at most 2)")
    assert recovery.to_quarantine([end]) == {"worker2": why}
    assert recovery.nodes_to_check(end) == [] and recovery.nodes_to_drain(end) == []
    assert recovery.nodes_to_drain(end, reuse_lost=False) == ["worker2"]
    # Quarantined at once, not counted again as a second failure later.
    later = {"kind": recovery.LOST, "nodes": ["worker2"], "why": "worker2 lost"}
    assert recovery.to_quarantine([end, later]) == {"worker2": "straggler, then lost"}
