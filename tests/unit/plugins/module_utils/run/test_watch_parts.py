"""The watch's settings and the verdicts that overrule the agents' records (module_utils/run/watch.py): the
backend's pods, the run's timeout, a stall; what each rank shows; why an interrupted watch stops the run."""
import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.run.watch import (
    STOPPING, Interrupted, abort_for_pods, abort_for_stall, abort_for_timeout, interruption_reason, rank_progress,
    stalled, stop_overdue, switch_line, watch_options)


def test_the_watch_options_and_their_defaults():
    opts = watch_options({"nodes": ("coord", "w1"), "launchers": ["coord"]})
    assert opts == {"nodes": ["coord", "w1"], "launchers": ["coord"], "world_size": None, "total_steps": None,
                    "poll_interval": 2.0, "progress_interval": 10.0, "heartbeat_timeout": 20.0,
                    "start_timeout": 120.0, "stop_timeout": 60.0, "timeout": 0.0, "stall_timeout": None,
                    "stall_floor": 10.0, "stall_ceiling": 1800.0, "startup_timeout": 300.0, "queue_timeout": None, "status_retry": 60.0,
                    "status_timeout": 30.0, "addresses": {}}
    opts = watch_options({"nodes": ["w1"], "launchers": [], "world_size": "4", "total_steps": 30,
                          "poll_interval": "0.5", "timeout": None, "stall_timeout": "90", "startup_timeout": 0,
                          "addresses": {"w1": "10.0.0.1"}})
    assert (opts["world_size"], opts["poll_interval"], opts["timeout"]) == (4, 0.5, 0.0)
    assert (opts["stall_timeout"], opts["startup_timeout"], opts["addresses"]) == (90.0, 300.0, {"w1": "10.0.0.1"})
    assert watch_options({"nodes": [], "launchers": [], "world_size": "", "stall_timeout": 0})["stall_timeout"] is None


def test_the_backends_problems_stop_the_run_and_name_the_lost_hosts():
    problems = [("w2", "pod w2 was evicted (node lost)", True), (None, "quota exceeded", True),
                ("w1", "pod w1 pulls its image", False)]
    reason = "pod w2 was evicted (node lost); quota exceeded; pod w1 pulls its image"
    assert abort_for_pods(problems) == (STOPPING, reason, ("abort", reason, ["w2"]))


def test_the_run_timeout_and_an_overdue_stop():
    assert abort_for_timeout(3600.0) == (STOPPING, "the run exceeded its timeout of 3600s",
                                         ("abort", "the run exceeded its timeout of 3600s"))
    assert stop_overdue("node w2 stopped answering", 60.0) == \
        "node w2 stopped answering; nodes still not stopped after 60s"


def test_a_stall_blames_the_node_the_coordinator_cannot_reach():
    status = {"ranks": {"0": {"event": "step", "step": 26, "time": 1000.0, "host": "worker1", "step_time": 0.2},
                        "1": {"event": "step", "step": 25, "time": 990.0, "host": "worker2", "step_time": 0.2}}}
    stall = stalled(status, now=1060.0, started_at=900.0)
    reachable = {"worker1": {"ok": True, "error": None}, "worker2": {"ok": False, "error": "No route to host"}}
    verdict, reason, action = abort_for_stall(stall, reachable)
    assert verdict == STOPPING and action == ("abort", reason, ["worker2"])
    assert reason == ("worker2: worker2 does not answer on the cluster network (No route to host), so the run "
                      "stalled (the run stalled: no rank finished a step (steps take 0.20s) for 60s (limit 10s); "
                      "ranks 1 on worker2 are behind, at step 25)")
    assert abort_for_stall(stall, {})[2][2] == []


def test_what_the_watch_shows_of_a_rank():
    start = {"event": "start", "rank": 0}
    steps = [{"event": "step", "step": 1}, {"event": "step", "step": 2}]
    assert rank_progress([start] + steps + [{"event": "done"}]) == ({"event": "step", "step": 2}, True)
    assert rank_progress([start]) == (start, False)
    assert rank_progress([]) == (None, False)


@pytest.mark.parametrize("exc,reason", [
    (KeyboardInterrupt(), "interrupted on the controller"),
    (Interrupted("SIGTERM"), "interrupted on the controller"),
    (RuntimeError("reading the run's status failed: timeout"),
     "the controller's watch failed: reading the run's status failed: timeout"),
])
def test_why_an_interrupted_watch_stops_the_run(exc, reason):
    assert interruption_reason(exc) == reason


def test_the_switch_gets_one_line_without_double_quotes():
    assert switch_line('the controller\'s watch failed: "x" broke\nTraceback ...') == \
        "the controller's watch failed: 'x' broke"
    assert len(switch_line("y" * 400)) == 300
