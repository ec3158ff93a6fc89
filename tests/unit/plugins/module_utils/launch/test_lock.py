"""The checkpoint lock and the run directory's claim (issue 26, point 6): written whole, never taken as free when it
cannot be read, one winner of two takeovers, a handed-off run keeps it, one play per run directory."""
import json
import os
import threading
import time

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import lock


def run_dir(tmp_path, name, lease_age=None, done=False, beats=()):
    d = tmp_path / "runs" / name
    (d / "control").mkdir(parents=True)
    (d / "nodes").mkdir()
    if lease_age is not None:
        (d / "control" / "lease").write_text("x\n")
        t = time.time() - lease_age
        os.utime(d / "control" / "lease", (t, t))
    if done:
        (d / "control" / "DONE").write_text("{}\n")
    for node, age in beats:
        (d / "nodes" / ("%s.json" % node)).write_text("{}")
        t = time.time() - age
        os.utime(d / "nodes" / ("%s.json" % node), (t, t))
    return str(d)


def old_lock(path, run_id, rdir, age=600, handoff=False):
    path.write_text(json.dumps({"run_id": run_id, "run_dir": rdir, "time": time.time() - age, "handoff": handoff}))


def test_taken_whole_and_given_back_only_by_its_run(tmp_path):
    path = str(tmp_path / "ckpt" / "llama.lock")
    assert lock.take(path, "r1", "/s/runs/r1") is None
    assert json.loads(open(path).read())["run_id"] == "r1"
    assert [f for f in os.listdir(tmp_path / "ckpt") if f.endswith(".tmp")] == []
    assert lock.holder(path, "r2")["run_id"] == "r1"  # just taken: held while r1 writes its lease
    assert lock.release(path, "r2") is False and os.path.exists(path)
    assert lock.release(path, "r1") is True and not os.path.exists(path)


def test_an_attempt_of_a_run_with_restarts_gives_it_back_by_its_directory_as_far_as_that_attempt_goes(tmp_path):
    # The watch knows an attempt's directory (runs/<id>/attempts/<n>), whose name is not the run id: the run keeps
    # the lock between its attempts (test_lock_attempts.py), and gives it back whole by its id after the last one.
    path = str(tmp_path / "ckpt.lock")
    attempt = str(tmp_path / "runs" / "r1" / "attempts" / "2")
    assert lock.take(path, "r1", attempt) is None
    assert lock.release(path, "2", str(tmp_path / "runs" / "r0" / "attempts" / "2")) is False
    assert lock.release(path, "2", attempt + "/") is True and json.loads(open(path).read())["between"]
    assert lock.release(path, "r1", str(tmp_path / "runs" / "r1")) is True and not os.path.exists(path)


def test_an_empty_or_damaged_lock_is_held_until_it_is_old(tmp_path):
    path = tmp_path / "m.lock"
    for text in ("", "{", "[1, 2]", '{"run_dir": "/x"}'):
        path.write_text(text)
        held = lock.holder(str(path), "r2")
        assert held is not None and "unreadable lock" in held["run_id"], text
        assert lock.take(str(path), "r2", "/r2") is not None
        t = time.time() - lock.LEASE_ALIVE - 5
        os.utime(path, (t, t))
        assert lock.holder(str(path), "r2") is None
    assert lock.take(str(path), "r2", "/r2") is None


def test_a_live_run_keeps_it_a_stale_done_or_aborted_one_does_not(tmp_path):
    path = tmp_path / "m.lock"
    old_lock(path, "live", run_dir(tmp_path, "live", lease_age=5))
    assert lock.holder(str(path), "new")["run_id"] == "live"
    old_lock(path, "stale", run_dir(tmp_path, "stale", lease_age=300))
    assert lock.holder(str(path), "new") is None
    old_lock(path, "done", run_dir(tmp_path, "done", lease_age=1, done=True))
    assert lock.holder(str(path), "new") is None
    assert lock.holder(str(path), "done") is None  # its own lock never stops a run


def test_a_handed_off_run_keeps_it_while_it_runs(tmp_path):
    path = tmp_path / "m.lock"
    old_lock(path, "h1", run_dir(tmp_path, "h1", lease_age=3600), handoff=True)
    # Not started by the user (no file of it moves): it does not keep the checkpoints from the next run.
    assert lock.holder(str(path), "new") is None
    h0 = run_dir(tmp_path, "h0", lease_age=3600)
    os.mkdir(os.path.join(h0, "metrics"))
    open(os.path.join(h0, "metrics", "rank0.jsonl"), "w").close()
    old_lock(path, "h0", h0, handoff=True)
    assert lock.holder(str(path), "new")["run_id"] == "h0"  # a batch script run by hand: its metrics move
    with open(os.path.join(h0, "metrics", "rank0.jsonl"), "w") as fh:
        fh.write('{"event": "step", "step": 8}\n{"event": "done", "rank": 0}\n')
    assert lock.holder(str(path), "new") is None  # every rank wrote its last record: it has ended
    with open(os.path.join(h0, "metrics", "rank1.jsonl"), "w") as fh:
        fh.write('{"event": "step", "step": 8}\n')
    assert lock.holder(str(path), "new")["run_id"] == "h0"  # rank 1 still runs
    old_lock(path, "h2", run_dir(tmp_path, "h2", lease_age=3600, beats=[("w1", 5), ("w2", 500)]), handoff=True)
    assert lock.holder(str(path), "new")["run_id"] == "h2"
    old_lock(path, "h3", run_dir(tmp_path, "h3", lease_age=3600, beats=[("w1", 400)]), handoff=True)
    assert lock.holder(str(path), "new") is None  # its nodes stopped beating
    old_lock(path, "h4", run_dir(tmp_path, "h4", lease_age=3600, done=True), handoff=True)
    assert lock.holder(str(path), "new") is None


def test_of_many_takeovers_of_a_stale_lock_exactly_one_wins(tmp_path):
    path = tmp_path / "m.lock"
    old_lock(path, "stale", run_dir(tmp_path, "stale", lease_age=300))
    start, results = threading.Barrier(8), {}

    def contender(i):
        start.wait()
        results[i] = lock.take(str(path), "r%d" % i, "/runs/r%d" % i)

    threads = [threading.Thread(target=contender, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, held in results.items() if held is None]
    assert len(winners) == 1
    assert json.loads(path.read_text())["run_id"] == "r%d" % winners[0]
    assert all(held["run_id"] == "r%d" % winners[0] for held in results.values() if held is not None)


def test_one_play_per_run_directory(tmp_path):
    d = str(tmp_path / "runs" / "r1")
    assert lock.claim(d, "tokenA", "r1", "coord") is None
    assert lock.claim(d, "tokenA", "r1", "coord") is None  # the same play again (after its preflight)
    msg = lock.claim(d, "tokenB", "r1", "coord")
    assert msg.startswith("run_id=r1 is being started by another play") and "Fix: pick another -e run_id" in msg


def test_two_plays_claiming_one_run_directory_at_once_one_wins(tmp_path):
    d = str(tmp_path / "runs" / "same")
    start, results = threading.Barrier(6), {}

    def play(i):
        start.wait()
        results[i] = lock.claim(d, "token%d" % i, "same", "coord")

    threads = [threading.Thread(target=play, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(1 for msg in results.values() if msg is None) == 1


def test_a_claim_is_given_back_only_by_its_play(tmp_path):
    d = str(tmp_path / "runs" / "r1")
    assert lock.claim(d, "tokenA", "r1", "coord") is None
    assert lock.unclaim(d, "tokenB") is False and os.path.exists(os.path.join(d, "control", "claim"))
    assert lock.unclaim(d, "tokenA") is True and not os.path.exists(os.path.join(d, "control", "claim"))
    assert lock.unclaim(d, "tokenA") is False
    assert lock.claim(d, "tokenB", "r1", "coord") is None


def test_a_run_whose_controller_retries_an_unreachable_coordinator_keeps_the_lock(tmp_path):
    """Issue 44, point 6: the lock counts a run alive as long as its agents do (their lease timeout, which outlasts
    the watch's retry window), not 60 s: a run in a 90 s outage of its controller is not taken over."""
    from ansible_collections.multinode.deepspeed.plugins.module_utils.common import lease
    assert lock.LEASE_ALIVE == lease.lease_timeout() > lease.renewal_gap()
    path = tmp_path / "m.lock"
    old_lock(path, "live", run_dir(tmp_path, "live", lease_age=90))
    assert lock.holder(str(path), "new")["run_id"] == "live"
