import os
import signal
import time

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.run import watch
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.watch import (
    FAILED, RUNNING, STOPPING, SUCCESS, decide, progress_line)

NODES = ["coord", "w1", "w2"]


def beat(state="running", t=100.0, role="watcher", exit_code=None):
    return {"state": state, "time": t, "role": role, "exit_code": exit_code}


def test_running_while_everyone_beats():
    status = {"nodes": {h: beat() for h in NODES}, "abort": None}
    assert decide(status, NODES, ["coord"], now=105.0) == (RUNNING, None, None)


def test_silent_node_is_aborted():
    status = {"nodes": {"coord": beat(t=130), "w1": beat(t=130), "w2": beat(t=100)}, "abort": None}
    verdict, reason, action = decide(status, NODES, ["coord"], now=130.0, heartbeat_timeout=20)
    assert verdict == STOPPING and action[0] == "abort"
    assert reason == "node w2 stopped answering (no heartbeat for 30s)"


def test_abort_waits_until_every_node_stopped():
    abort = {"reason": "a rank on coord exited with -9"}
    status = {"nodes": {"coord": beat("aborted"), "w1": beat("stopping"), "w2": beat("aborted")}, "abort": abort}
    assert decide(status, NODES, ["coord"], now=101.0)[0] == STOPPING
    status["nodes"]["w1"] = beat("aborted")
    assert decide(status, NODES, ["coord"], now=101.0) == (FAILED, abort["reason"], None)
    # A node that is gone for good does not hold the verdict back.
    status["nodes"]["w1"] = beat("stopping", t=10.0)
    assert decide(status, NODES, ["coord"], now=101.0)[0] == FAILED


def test_success_needs_every_rank_done_and_the_watchers_released():
    nodes = {"coord": beat("finished", role="launcher", exit_code=0), "w1": beat(), "w2": beat()}
    status = {"nodes": nodes, "abort": None, "done_ranks": [0, 1]}
    assert decide(status, NODES, ["coord"], now=101.0, world_size=2) == (RUNNING, None, ("done", None))
    nodes["w1"], nodes["w2"] = beat("finished"), beat("finished")
    assert decide(status, NODES, ["coord"], now=101.0, world_size=2)[0] == SUCCESS


def test_launcher_exit_zero_without_all_ranks_done_is_not_success():
    nodes = {"coord": beat("finished", role="launcher", exit_code=0), "w1": beat("finished"), "w2": beat("finished")}
    verdict, reason, action = decide({"nodes": nodes, "abort": None, "done_ranks": [0]}, NODES, ["coord"],
                                     now=101.0, world_size=2)
    assert verdict == STOPPING and "ranks 1 never finished" in reason and action[0] == "abort"


def test_launcher_nonzero_exit_fails():
    nodes = {"w1": beat("finished", role="launcher", exit_code=1), "w2": beat("finished", role="launcher", exit_code=0)}
    verdict, reason, dummy = decide({"nodes": nodes, "abort": None}, ["w1", "w2"], ["w1", "w2"], now=101.0)
    assert verdict == FAILED and reason == "the launcher on w1 exited with 1"


def test_agent_that_never_starts_is_aborted_after_the_start_timeout():
    status = {"nodes": {"coord": beat(), "w1": beat()}, "abort": None}
    assert decide(status, NODES, ["coord"], now=150.0, started_at=100.0, start_timeout=120)[0] == RUNNING
    verdict, reason, action = decide(status, NODES, ["coord"], now=300.0, started_at=100.0, start_timeout=120)
    assert verdict == STOPPING and "no agent started on w2" in reason and action[0] == "abort"


def test_progress_line():
    status = {"nodes": {"w1": beat(t=98.0), "w2": beat(t=99.0)},
              "ranks": {"0": {"event": "step", "step": 10, "total_steps": 30, "loss": 3.25, "step_time": 0.5,
                              "tokens_per_sec": 1000.0, "samples_per_sec": 8.0},
                        "1": {"event": "step", "step": 11, "total_steps": 30, "loss": 3.2, "step_time": 0.5}}}
    line = progress_line(status, now=100.0)
    assert line == ("step 10/30 | loss 3.2500 | 1000 tok/s | 8.0 samples/s | eta 10s | "
                    "nodes: w1 running 2s, w2 running 1s")
    assert progress_line({"nodes": {}}, now=1.0) == "starting"
    # A later attempt's ranks say where they resumed before their first step.
    resumed = {"ranks": {"0": {"event": "start", "start_step": 50}, "1": {"event": "start", "start_step": 50}}}
    assert progress_line(resumed, now=1.0) == "starting, resumed from step 50"


def test_stop_signals_raise_interrupted_until_restored():
    previous = watch.trap_stop_signals()
    try:
        with pytest.raises(watch.Interrupted, match="SIGTERM"):
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 1)  # let the handler run
        watch.ignore_signals(previous)
        os.kill(os.getpid(), signal.SIGTERM)  # ignored while cleaning up
    finally:
        watch.restore_signals(previous)
    assert signal.getsignal(signal.SIGTERM) == previous[signal.SIGTERM]


def test_the_signal_right_behind_the_first_cannot_cut_the_cleanup_short():
    """Ctrl-C reaches Ansible's worker and its main process, which then terminates the worker: the SIGTERM that
    follows the SIGINT must not raise inside the cleanup the SIGINT started (it once skipped the run's abort)."""
    previous = watch.trap_stop_signals()
    cleaned = []
    try:
        with pytest.raises(watch.Interrupted, match="SIGINT"):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                signal.sigtimedwait([], 1)
            except watch.Interrupted:
                os.kill(os.getpid(), signal.SIGTERM)  # before the cleanup could ignore it itself
                signal.sigtimedwait([], 1)
                cleaned.append(True)
                raise
    finally:
        watch.restore_signals(previous)
    assert cleaned == [True]


def test_a_quiet_node_that_cannot_be_reached_during_an_abort_is_not_waited_for():
    # worker2 was stopped: its agent's last beat says running, 6 s ago; the others stopped on the abort.
    status = {"abort": {"reason": "a rank on coord exited with 1"}, "nodes": {
        "coord": {"state": "aborted", "time": 99.0}, "worker1": {"state": "aborted", "time": 99.0},
        "worker2": {"state": "running", "time": 94.0}}}
    nodes = ["coord", "worker1", "worker2"]
    assert watch.quiet_nodes(status, nodes, now=100.0) == ["worker2"]
    assert watch.quiet_nodes(status, nodes, now=97.0) == []            # it beat 3 s ago: not quiet yet
    assert watch.quiet_nodes(dict(status, abort=None), nodes, now=100.0) == []
    # Without the probe the stop waits for its heartbeat to go stale (20 s); unreachable, it is gone now.
    assert watch.decide(status, nodes, ["coord"], 100.0)[0] == watch.STOPPING
    assert watch.decide(status, nodes, ["coord"], 100.0, gone=["worker2"])[0] == watch.FAILED


def _ended_cases():
    launcher = {"state": "finished", "role": "launcher", "exit_code": 0}
    watcher = {"state": "running", "role": "watcher"}
    yield {"coord": launcher, "w1": watcher, "w2": watcher}, [0, 1], True
    yield {"coord": launcher, "w1": dict(watcher, state="finished"), "w2": dict(watcher, state="finished")}, [0, 1], True
    yield {"coord": dict(launcher, exit_code=None), "w1": watcher, "w2": watcher}, [0, 1], True
    yield {"coord": dict(launcher, exit_code=2), "w1": watcher, "w2": watcher}, [0, 1], False
    yield {"coord": dict(launcher, state="running"), "w1": watcher, "w2": watcher}, [0, 1], False
    yield {"coord": launcher, "w1": watcher, "w2": watcher}, [0], False
    yield {"coord": launcher, "w1": watcher}, [0, 1], False


def test_what_run_status_calls_ended_well_is_what_the_watch_judges_a_good_end():
    """run_status writes DONE by itself (ended_well) exactly when the watch's own verdict would end the run well."""
    from ansible_collections.multinode.deepspeed.plugins.module_utils.run.watch import ended_well
    now = time.time()
    for nodes, done, want in _ended_cases():
        beats = dict((h, dict(b, time=now)) for h, b in nodes.items())
        assert ended_well(beats, ["coord", "w1", "w2"], ["coord"], done, 2) is want
        verdict, _reason, action = watch.decide({"nodes": beats, "abort": None, "done_ranks": done},
                                                ["coord", "w1", "w2"], ["coord"], now, world_size=2)
        assert (verdict == watch.SUCCESS or action == ("done", None)) is want
