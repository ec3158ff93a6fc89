"""The checkpoint lock of a run with restarts (issue 44, point 4): held from its first attempt to its last - through
the recovery wait between two attempts - refused to a second run naming the first, given back after the last
attempt, and never held for long by a run that cannot go on."""
import json
import os
import time

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import lock
from ansible_collections.multinode.deepspeed.plugins.module_utils.run import recovery


def attempt(tmp_path, run_id, n, lease_age=1.0):
    d = tmp_path / "runs" / run_id / "attempts" / str(n)
    (d / "control").mkdir(parents=True)
    (d / "control" / "lease").write_text("x\n")
    t = time.time() - lease_age
    os.utime(d / "control" / "lease", (t, t))
    return str(d)


def end_attempt(rdir, reason="rank 1 on worker2 exited with -9", age=0.0):
    path = os.path.join(rdir, "control", "ABORT")
    with open(path, "w") as fh:
        json.dump({"reason": reason, "host": "worker2", "time": time.time() - age}, fh)
    t = time.time() - age
    os.utime(path, (t, t))


def test_a_run_with_restarts_holds_it_between_attempts_and_a_second_run_is_refused_naming_it(tmp_path):
    path = str(tmp_path / "checkpoints" / "llama-tiny.lock")
    first = attempt(tmp_path, "run-a", 1)
    assert lock.take(path, "run-a", first, recover_wait=120) is None
    # Attempt 1 fails: its agents abort it, its watch gives the lock back as far as that attempt goes.
    end_attempt(first)
    assert lock.release(path, "1", first) is True
    assert os.path.exists(path) and json.loads(open(path).read())["between"]
    # During the recovery wait, another run of the model is refused, naming the run.
    held = lock.holder(path, "run-b")
    assert held is not None and held["run_id"] == "run-a"
    other = attempt(tmp_path, "run-b", 1)
    assert lock.take(path, "run-b", other)["run_id"] == "run-a"
    # The run's next attempt takes it again.
    second = attempt(tmp_path, "run-a", 2)
    assert lock.take(path, "run-a", second) is None
    assert json.loads(open(path).read())["run_dir"] == second and "between" not in json.loads(open(path).read())
    assert lock.holder(path, "run-b")["run_id"] == "run-a"
    # After the last attempt the run gives it back whole (after_attempts.yml: run_status on the run's directory).
    end_attempt(second)
    assert lock.release(path, "2", second) is True and lock.holder(path, "run-b")["run_id"] == "run-a"
    assert lock.release(path, "run-a", str(tmp_path / "runs" / "run-a")) is True and not os.path.exists(path)
    assert lock.take(path, "run-b", other) is None


def test_the_hold_between_attempts_follows_recover_wait_and_ends(tmp_path):
    path = str(tmp_path / "m.lock")
    first = attempt(tmp_path, "run-a", 1, lease_age=900)
    assert lock.take(path, "run-a", first, recover_wait=600) is None
    assert json.loads(open(path).read())["hold"] == 600 + lock.BETWEEN_MARGIN
    end_attempt(first, age=700)
    record = dict(json.loads(open(path).read()), between=time.time() - 700)
    lock.write_whole(path, json.dumps(record))
    assert lock.holder(path, "run-b")["run_id"] == "run-a"           # waiting 600 s for its nodes, and more
    lock.write_whole(path, json.dumps(dict(record, between=time.time() - 600 - lock.BETWEEN_MARGIN - 5)))
    assert lock.holder(path, "run-b") is None                         # a controller that died between attempts
    # Without a between time (the watch never gave it back), the attempt's ABORT says when it ended.
    lock.write_whole(path, json.dumps(dict(record, between=None, hold=300)))
    assert lock.holder(path, "run-b") is None
    end_attempt(first, age=10)
    assert lock.holder(path, "run-b")["run_id"] == "run-a"


@pytest.mark.parametrize("reason", ["interrupted on the controller", "the run exceeded its timeout of 60s",
                                    "disk full on worker1 (/shared)", "the job waited in the queue too long (600s)",
                                    "the controller went away (interrupted or killed)",
                                    "the controller stopped watching (lease expired)"])
def test_an_attempt_no_other_can_follow_frees_it_at_once(tmp_path, reason):
    path = str(tmp_path / "m.lock")
    first = attempt(tmp_path, "run-a", 1)
    assert lock.take(path, "run-a", first) is None
    end_attempt(first, reason)
    lock.release(path, "1", first)
    assert lock.holder(path, "run-b") is None and lock.take(path, "run-b", "/s/runs/run-b") is None


def test_the_reasons_that_free_it_are_the_ones_recovery_never_retries():
    for reason, kind in (("interrupted on the controller", recovery.INTERRUPTED),
                         ("the run exceeded its timeout of 60s", recovery.TIMEOUT),
                         ("disk full on worker1", recovery.DISK),
                         ("the job waited in the queue too long", recovery.QUEUE)):
        assert recovery.ending({"abort": {"reason": reason}})["kind"] == kind
        assert lock.RUN_OVER.search(reason)
    assert not lock.RUN_OVER.search("rank 1 on worker2 exited with -9")
    assert not lock.RUN_OVER.search("node worker2 stopped answering (no heartbeat for 21s)")


def test_an_attempt_that_ended_well_frees_it_and_a_run_without_restarts_gives_it_back_whole(tmp_path):
    path = str(tmp_path / "m.lock")
    first = attempt(tmp_path, "run-a", 1)
    assert lock.take(path, "run-a", first) is None
    open(os.path.join(first, "control", "DONE"), "w").close()
    lock.release(path, "1", first)
    assert lock.holder(path, "run-b") is None
    single = str(tmp_path / "runs" / "run-c")
    os.makedirs(os.path.join(single, "control"))
    assert lock.take(path, "run-c", single) is None and "hold" not in json.loads(open(path).read())
    assert lock.release(path, "run-c", single) is True and not os.path.exists(path)


def test_attempt_directories():
    assert lock.attempt_of("/s/runs/r1/attempts/2") == "/s/runs/r1"
    assert lock.attempt_of("/s/runs/r1/attempts/2/") == "/s/runs/r1"
    assert lock.attempt_of("/s/runs/r1") is None and lock.attempt_of("/s/runs/attempts") is None
    assert lock.attempt_of(None) is None
