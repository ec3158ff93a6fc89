"""Stall detection and its blame (module_utils/run/watch.py): no rank finishes a step, whom to name."""
import datetime

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import JobError, plan
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.watch import blame_stall, stall_limit, stalled


def step(rank, n, t, host, step_time=0.2):
    return {"event": "step", "rank": rank, "step": n, "time": t, "host": host, "step_time": step_time}


def test_the_limit_is_ten_step_times_within_a_floor_and_a_ceiling():
    ranks = {"0": step(0, 5, 100, "w1", 0.2), "1": step(1, 5, 100, "w2", 0.3)}
    assert stall_limit(ranks) == 10.0
    slow = {"0": step(0, 5, 100, "w1", 12.0), "1": step(1, 5, 100, "w2", 12.0)}
    assert stall_limit(slow) == 120.0
    assert stall_limit(ranks, floor=45) == 45.0 and stall_limit(slow, ceiling=60) == 60.0
    assert stall_limit(ranks, stall_timeout=30) == 30.0


def test_a_hung_collective_stalls_every_rank_at_the_same_step():
    status = {"ranks": {"0": step(0, 26, 1000.0, "worker1"), "1": step(1, 26, 1000.5, "worker2")}}
    assert stalled(status, now=1010.0, started_at=900.0) is None
    got = stalled(status, now=1011.5, started_at=900.0)
    assert got["reason"] == "the run stalled: no rank finished a step (steps take 0.20s) for 11s (limit 10s); the " \
                            "last step of every rank is 26"
    assert got["behind"] == {"worker1": [0], "worker2": [1]} and got["frozen"] == {}


def test_ranks_behind_are_named():
    status = {"ranks": {"0": step(0, 30, 1000.0, "worker1"), "1": step(1, 29, 990.0, "worker2")}}
    got = stalled(status, now=1100.0, started_at=900.0)
    assert got["behind"] == {"worker2": [1]} and "ranks 1 on worker2 are behind, at step 29" in got["reason"]


def test_before_the_first_step_the_startup_allowance_counts():
    status = {"ranks": {"0": {"event": "start", "rank": 0, "time": 905.0}}}
    assert stalled(status, now=1150.0, started_at=900.0) is None
    got = stalled(status, now=1201.0, started_at=900.0)
    assert "no rank finished its first step for 301s (limit 300s)" in got["reason"]


def test_a_users_script_is_judged_by_its_logs():
    status = {"ranks": {}, "logs_mtime": 1000.0}
    assert stalled(status, now=1100.0, started_at=900.0) is None
    assert "no rank wrote to its log for 151s (limit 150s)" in stalled(status, now=1151.0, started_at=900.0)["reason"]


def test_a_node_the_coordinator_cannot_reach_is_named_first():
    stall = {"reason": "the run stalled: no rank finished a step for 50s (limit 45s)", "behind": {"worker1": [0]}}
    reason = blame_stall(stall, {"worker1": {"ok": True, "error": None},
                                 "worker2": {"ok": False, "error": "timed out"}})
    assert reason.startswith("worker2: worker2 does not answer on the cluster network (timed out), so the run "
                             "stalled (the run stalled: no rank")


def test_every_node_answers_so_a_collective_hung():
    stall = {"reason": "the run stalled: x", "behind": {"worker1": [0], "worker2": [1]}}
    assert "every node answers, so a collective hung" in blame_stall(stall, {"worker1": {"ok": True}})


@pytest.mark.parametrize("value", ["5", "soon", "-1"])
def test_stall_timeout_is_checked(value):
    workers = {"w1": {"slots": 1, "address": "10.0.0.1", "env": {}},
               "w2": {"slots": 1, "address": "10.0.0.2", "env": {}}}
    with pytest.raises(JobError) as err:
        plan({"stall_timeout": value}, workers, ["coord"], datetime.datetime(2026, 11, 23), backends)
    assert "stall_timeout=%s must be a whole number >= 10" % value in str(err.value)
    assert plan({"stall_timeout": "60"}, workers, ["coord"], datetime.datetime(2026, 11, 23), backends)["stall_timeout"] == 60


def test_a_node_compiling_an_op_is_not_stalled_and_the_progress_line_says_so():
    """Issue 44, point 8: a rank that loads an op nobody built compiles it first, silently, for minutes; its node's
    agent sees the build (its heartbeat's ``building``), and the watch shows it instead of stopping the run."""
    from ansible_collections.multinode.deepspeed.plugins.module_utils.run.watch import compiling, progress_line
    quiet = {"ranks": {}, "logs_mtime": 900.0, "nodes": {"worker1": {"state": "running", "time": 1299.0}}}
    assert stalled(quiet, now=1300.0, started_at=850.0)["reason"].startswith("the run stalled: no rank wrote")
    building = {"ranks": {}, "logs_mtime": 900.0,
                "nodes": {"worker1": {"state": "running", "time": 1299.0, "building": [{"op": "cpu_adam", "age": 95}]},
                          "worker2": {"state": "running", "time": 1299.0, "building": []}}}
    assert compiling(building) == {"worker1": ["cpu_adam"]}
    assert stalled(building, now=1300.0, started_at=850.0) is None
    assert "compiling cpu_adam on worker1" in progress_line(building, 1300.0)
    assert compiling({"nodes": {"w": {"building": ["odd", {"age": 1}]}}}) == {}


@pytest.mark.parametrize("settings, message", [
    ({"stall_floor": "0"}, "stall_floor=0 must be a whole number >= 1. Fix: -e stall_floor=<seconds>"),
    ({"stall_ceiling": "soon"}, "stall_ceiling=soon must be a whole number >= 1. Fix: -e stall_ceiling=<seconds>"),
    ({"stall_floor": "60", "stall_ceiling": "30"},
     "stall_floor=60 is more than stall_ceiling=30. Fix: -e stall_floor=<at most 30>, or a larger -e stall_ceiling"),
])
def test_the_hang_limits_bounds_are_checked(settings, message):
    workers = {"w1": {"slots": 1, "address": "10.0.0.1", "env": {}},
               "w2": {"slots": 1, "address": "10.0.0.2", "env": {}}}
    with pytest.raises(JobError) as err:
        plan(settings, workers, ["coord"], datetime.datetime(2026, 11, 23), backends)
    assert message in str(err.value)
    job = plan({"stall_floor": "5", "stall_ceiling": "600"}, workers, ["coord"], datetime.datetime(2026, 11, 23),
               backends)
    assert (job["stall_floor"], job["stall_ceiling"]) == (5, 600)


def test_ranks_past_their_work_are_not_a_stall_while_they_exit():
    # Recorded: 16 ranks on the 2-core local cluster wrote their done records at 44.76, then took more than 13 s to
    # exit (the last barrier, the process group's end); the watch had called that a hung collective.
    ranks = dict((str(r), step(r, 5, 1795963544.4, "worker%d" % (r + 1), 0.36)) for r in range(16))
    status = {"ranks": ranks, "done_ranks": list(range(16))}
    assert stalled(status, now=1795963557.8, started_at=1795963530.0) is None
    got = stalled(status, now=1795963544.4 + 301, started_at=1795963530.0)
    assert got["reason"] == "the run stalled: every rank wrote its done record, but the ranks did not exit for " \
                            "301s (limit 300s)" and got["behind"] == {}


def test_only_the_ranks_not_done_are_behind():
    status = {"ranks": {"0": step(0, 30, 1000.0, "worker1"), "1": step(1, 29, 990.0, "worker2"),
                        "2": step(2, 30, 1000.0, "worker3")}, "done_ranks": [0, 2]}
    assert stalled(status, now=999.0, started_at=900.0) is None
    got = stalled(status, now=1001.0, started_at=900.0)
    # Ranks 0 and 2 finished: rank 1's silence since 990 is the run's, and only it is named.
    assert got["behind"] == {"worker2": [1]}
    assert got["reason"].endswith("for 11s (limit 10s); the last step of every rank not done is 29"), got["reason"]
