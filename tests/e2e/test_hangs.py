"""Runs that heal (issue 47, point 1): a rank that hangs - its process alive, its node's agent beating, nothing
moving - is found from the pace the run has shown, not after a fixed allowance.  In a run of about 20 ms steps, a
rank frozen with SIGSTOP is named (rank, node, pid, state) within 15 s, on pdsh and on ssh-free; with
-e restarts=1 the run is recovered like a stall, on the same nodes, and ends well; nothing of the run is left."""
import json
import threading
import time

import pytest
from e2e_nodes import NODES, left_on, load_summary, node_name, on_coord, podman, when_step

pytestmark = pytest.mark.e2e
HANG_LIMIT = 15.0


def freeze_rank1():
    """SIGSTOP the rank on worker2 (rank 1): its peer waits in the next collective, its agent beats on."""
    res = podman("exec", node_name("worker2"), "pkill", "-STOP", "-f", "--", "-u -m multinode_ds.train")
    assert res.returncode == 0, res.stderr


def train_with_freeze(run_playbook, run_id, extra, name, at_step, attempt=None):
    """train.yml with rank 1 frozen once rank 0 (of ``attempt``, for a run with restarts) reached ``at_step``: the
    play's result and when the rank was frozen."""
    at = {}
    t = threading.Thread(target=lambda: at.setdefault("frozen", when_step(run_id, at_step, freeze_rank1,
                                                                          attempt=attempt)))
    t.start()
    res = run_playbook("train.yml", "-e", f"run_id={run_id}", "-e", "preflight=false", "-e", "timeout=900", *extra,
                       name=name)
    t.join()
    assert at.get("frozen"), "the run never reached step %d:\n%s" % (at_step, res.tail())
    return res, at["frozen"]


def named_in_time(run_dir, frozen_at):
    """The attempt's ABORT record: the frozen rank named, within HANG_LIMIT seconds of the SIGSTOP."""
    abort = json.loads(on_coord(f"cat {run_dir}/control/ABORT").stdout)
    took = float(abort["time"]) - frozen_at
    print(f"the run was called hung {took:.1f}s after SIGSTOP: {abort['reason']}")
    assert "rank 1 on worker2" in abort["reason"] and "is stopped (SIGSTOP" in abort["reason"], abort
    assert "the run stalled: no rank finished a step" in abort["reason"], abort
    assert took <= HANG_LIMIT, (took, abort)
    return abort


def test_with_restarts_a_hung_rank_is_named_within_15s_and_recovered_like_a_stall(provisioned, run_playbook):
    """pdsh (the default backend): named in time, and the next attempt goes on from the newest checkpoint."""
    run_id = f"e2e-hang-restart-{int(time.time())}"
    # 1,000 steps (about 25 s): a look at rank 0's step that a loaded machine slows to seconds still lands
    # mid-run (300 steps of warm ranks were once over before the look saw step 60).
    res, frozen_at = train_with_freeze(run_playbook, run_id, ["-e", "restarts=1", "-e", "steps=1000",
                                                              "-e", "save_interval=50"], "hang-restart", 60,
                                       attempt=1)
    assert res.rc == 0, res.tail()
    named_in_time(f"/shared/runs/{run_id}/attempts/1", frozen_at)
    summary = load_summary(run_id)
    first, second = summary["attempts"]
    assert summary["status"] == "success" and summary["restarted"] == 1, json.dumps(summary)[:3000]
    assert first["kind"] == "stalled" and first["retried"] is True, first
    assert "rank 1 on worker2" in first["why"] and "is stopped (SIGSTOP" in first["why"], first
    assert second["nodes"] == ["worker1", "worker2"] and second["start_step"] >= 50 and second["last_step"] == 1000
    assert left_on(NODES, run_id, seconds=30) == {}


def test_on_ssh_free_a_hung_rank_is_named_within_15s_and_nothing_is_left(provisioned, run_playbook):
    run_id = f"e2e-hang-ssh-free-{int(time.time())}"
    res, frozen_at = train_with_freeze(run_playbook, run_id, ["-e", "backend=ssh-free", "-e", "steps=100000"],
                                       "hang-ssh-free", 30)
    assert res.rc != 0, res.tail()
    named_in_time(f"/shared/runs/{run_id}", frozen_at)
    summary = load_summary(run_id)
    assert summary["status"] == "failed" and "rank 1 on worker2" in json.dumps(summary), json.dumps(summary)[:3000]
    # The stopped rank is stopped with the rest of the run (SIGKILL ends a stopped process).
    assert left_on(NODES, run_id, seconds=30) == {}
