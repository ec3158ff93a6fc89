"""Issue 47, point 1: hangs found from what the run has shown (module_utils/run/pace.py and the watch's stall):
the limit is ten times the step time the run has shown, within its floor and ceiling; a checkpoint save under way
has its own allowance, learned from the saves before it; the rank process that does not run is named."""
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.pace import Pace
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.watch import (
    abort_for_stall, rank_progress, stalled)


def step(rank, n, t, host, step_time=0.02, **extra):
    return dict({"event": "step", "rank": rank, "step": n, "time": t, "host": host, "step_time": step_time}, **extra)


def test_the_pace_samples_each_step_once_and_takes_the_90th_percentile():
    pace = Pace(floor=1, ceiling=100)
    for n in range(1, 11):
        pace.see({"0": step(0, n, n, "w1", 0.1 * n)})
        pace.see({"0": step(0, n, n, "w1", 0.1 * n)})  # the same record at the next poll: not sampled again
    assert len(pace.samples) == 10 and abs(pace.step_time() - 1.0) < 1e-9
    assert abs(pace.step_limit() - 10.0) < 1e-9
    assert Pace(floor=1, ceiling=100).step_limit() == 1.0  # nothing seen yet: the floor
    slow = Pace(floor=10, ceiling=60).see({"0": step(0, 1, 1, "w1", 30.0)})
    assert slow.step_limit() == 60.0
    odd = Pace().see({"0": step(0, 1, 1, "w1", "fast"), "1": "not a record", "2": step(2, 1, 1, "w2", -1)})
    assert odd.step_time() is None


def test_a_rank_frozen_in_a_run_of_20ms_steps_is_named_within_the_floor():
    """A rank stopped with SIGSTOP: the other ranks wait in the next collective, no rank finishes a step; the run
    is called hung after the floor (10 s), not after a fixed allowance, and the stopped rank is named."""
    pace = Pace()
    for n in range(1, 200):
        pace.see({"0": step(0, n, 1000 + n * 0.02, "worker1"), "1": step(1, n, 1000 + n * 0.02, "worker2")})
    last = {"0": step(0, 199, 1003.98, "worker1"), "1": step(1, 199, 1003.98, "worker2")}
    nodes = {"worker1": {"state": "running", "time": 1014.0, "frozen": []},
             "worker2": {"state": "running", "time": 1014.0,
                         "frozen": [{"pid": 4242, "rank": 1, "state": "T", "for": 9.0}]}}
    status = {"ranks": last, "nodes": nodes}
    assert stalled(status, now=1013.9, started_at=900.0, pace=pace) is None
    got = stalled(status, now=1014.5, started_at=900.0, pace=pace)
    assert got["limit"] == 10.0 and got["frozen"] == {"worker2": nodes["worker2"]["frozen"]}
    verdict, reason, action = abort_for_stall(got, {"worker1": {"ok": True}, "worker2": {"ok": True}})
    assert reason.startswith("rank 1 on worker2 (pid 4242) is stopped (SIGSTOP, or a debugger), for 9s, so the "
                             "run hung (the run stalled: no rank finished a step (steps take 0.02s) for 11s")
    assert action == ("abort", reason, [])


def test_a_checkpoint_save_of_30s_is_not_a_hang_and_a_save_that_never_ends_is():
    pace = Pace()
    ranks = {"0": step(0, 50, 1000.0, "worker1", saving=1000.1), "1": step(1, 50, 1000.0, "worker2", saving=1000.1)}
    status = {"ranks": ranks}
    # The first save: no save seen yet, so the startup allowance (300 s).
    assert stalled(status, now=1030.1, started_at=900.0, pace=pace) is None
    assert stalled(status, now=1290.0, started_at=900.0, pace=pace) is None
    got = stalled(status, now=1301.0, started_at=900.0, pace=pace)
    assert got["reason"].startswith("the run stalled: no rank finished a step or its checkpoint save for 301s "
                                    "(limit 300s)")
    # After saves of 150 s, a save may take three times that.
    pace.see({"0": step(0, 60, 2000.0, "worker1", save_seconds=150.0)})
    assert stalled(status, now=1440.0, started_at=900.0, pace=pace) is None
    assert stalled(status, now=1451.0, started_at=900.0, pace=pace)["limit"] == 450.0
    # A fixed stall_timeout still leaves a save its allowance.
    assert stalled(status, now=1100.0, started_at=900.0, stall_timeout=20, pace=Pace()) is None


def test_the_watch_sees_a_save_under_way_and_the_last_saves_seconds():
    steps = [{"event": "step", "step": 9, "time": 1.0}, {"event": "step", "step": 10, "time": 2.0}]
    begin = {"event": "save", "phase": "begin", "step": 10, "time": 2.5}
    end = {"event": "save", "phase": "end", "step": 10, "time": 40.0, "seconds": 37.5}
    assert rank_progress(steps + [begin]) == (dict(steps[-1], saving=2.5), False)
    assert rank_progress(steps + [begin, end]) == (dict(steps[-1], save_seconds=37.5, saved_step=10), False)
    nxt = {"event": "step", "step": 11, "time": 41.0}
    assert rank_progress(steps + [begin, end, nxt]) == (dict(nxt, save_seconds=37.5, saved_step=10), False)
    assert rank_progress(steps + [begin, end, nxt, {"event": "done"}])[1] is True
