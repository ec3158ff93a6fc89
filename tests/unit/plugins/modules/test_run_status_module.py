"""run_status: the controller's records in the run's control directory, the lock it gives back, and what it reads of
the agents' heartbeats and the ranks' metrics."""
import json
import os

import pytest

from ansible_collections.multinode.deepspeed.plugins.modules import run_status
from ansible_collections.multinode.deepspeed.plugins.module_utils.run import status


def run_dir(tmp_path):
    d = tmp_path / "runs" / "r1"
    (d / "nodes").mkdir(parents=True)
    (d / "metrics").mkdir()
    (d / "nodes" / "w1.json").write_text(json.dumps({"host": "w1", "state": "running", "time": 5.0}))
    (d / "nodes" / "w2.json").write_text(json.dumps({"state": "finished", "time": 6.0}))
    (d / "nodes" / "w3.json").write_text('{"host": "w3", "sta')
    recs = [{"event": "start", "rank": 0}, {"event": "step", "step": 1}, {"event": "step", "step": 2},
            {"event": "done", "rank": 0}]
    (d / "metrics" / "rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "metrics" / "rank1.jsonl").write_text('{"event": "start", "rank": 1}\n{"event": "st')
    (d / "metrics" / "rank2.jsonl").write_text("")
    return d


def test_what_it_reads_of_the_run(tmp_path, run_module):
    d = run_dir(tmp_path)
    res = run_module(run_status, {"run_dir": str(d)})
    assert res["changed"] is False and res["abort"] is None
    assert res["nodes"] == {"w1": {"host": "w1", "state": "running", "time": 5.0},
                            "w2": {"state": "finished", "time": 6.0}}
    assert res["ranks"] == {"0": {"event": "step", "step": 2}, "1": {"event": "start", "rank": 1}}
    assert res["done_ranks"] == [0] and res["logs_mtime"] is None and res["reachable"] == {}


def test_the_first_abort_stays_and_done_is_written_once(tmp_path, run_module):
    d = run_dir(tmp_path)
    res = run_module(run_status, {"run_dir": str(d), "touch_lease": True, "abort": "node w2 lost", "lost": ["w2"]})
    assert res["changed"] is True and (d / "control" / "lease").exists()
    abort = res["abort"]
    assert (abort["reason"], abort["host"], abort["lost"]) == ("node w2 lost", "controller", ["w2"])
    res = run_module(run_status, {"run_dir": str(d), "abort": "interrupted on the controller"})
    assert res["changed"] is False and res["abort"]["reason"] == "node w2 lost"
    assert run_module(run_status, {"run_dir": str(d), "done": True})["changed"] is True
    assert run_module(run_status, {"run_dir": str(d), "done": True})["changed"] is False


def test_check_mode_writes_nothing(tmp_path, run_module):
    d = run_dir(tmp_path)
    lock = tmp_path / "lock"
    lock.write_text(json.dumps({"run_id": "r1"}))
    res = run_module(run_status, {"run_dir": str(d), "abort": "x", "touch_lease": True, "release": str(lock),
                                  "_ansible_check_mode": True})
    assert res["changed"] is False and not (d / "control").exists() and lock.exists()


def test_the_lock_is_given_back_only_by_its_run(tmp_path, run_module):
    d = run_dir(tmp_path)
    lock = tmp_path / "lock"
    lock.write_text(json.dumps({"run_id": "r0"}))
    assert run_module(run_status, {"run_dir": str(d), "release": str(lock)})["changed"] is False
    assert lock.exists()
    lock.write_text(json.dumps({"run_id": "r1"}))
    assert run_module(run_status, {"run_dir": str(d) + "/", "release": str(lock)})["changed"] is True
    assert not lock.exists()


def test_json_that_is_not_an_object_and_odd_names_are_skipped(tmp_path, run_module):
    """Issue 26, 9: one odd file does not fail the watch's poll (it failed with AttributeError before)."""
    d = run_dir(tmp_path)
    (d / "nodes" / "w4.json").write_text("[1, 2]")
    (d / "nodes" / "w5.json").write_text("42")
    (d / "nodes" / "w6.json").write_text(json.dumps({"host": ["x"], "state": "running", "time": 7.0}))
    (d / "metrics" / "rank3.jsonl").write_text('7\n["step"]\n"x"\nnull\n')
    (d / "metrics" / "rank4.jsonl").write_text('{"event": "step", "step": 4}\n[1]\n')
    (d / "metrics" / "rank-old.jsonl").write_text(json.dumps({"event": "step", "step": 9}) + "\n")
    (d / "metrics" / "rankx.jsonl").write_text("")
    (d / "control").mkdir()
    (d / "control" / "ABORT").write_text('"stop"')
    (d / "control" / "queue.json").write_text("[]")
    res = run_module(run_status, {"run_dir": str(d)})
    assert sorted(res["nodes"]) == ["w1", "w2", "w6"]
    assert res["ranks"]["4"] == {"event": "step", "step": 4} and "3" not in res["ranks"]
    assert res["queue"] is None
    # An ABORT that exists stops every agent whatever it holds: the watch reads it as an abort too.
    assert res["abort"]["reason"].startswith("an abort record that cannot be read")


def test_the_queue_record_is_reported(tmp_path, run_module):
    d = run_dir(tmp_path)
    (d / "control").mkdir()
    queued = {"state": "queued", "label": "PENDING", "reason": "Resources", "job_id": "7", "since": 1.0, "fix": "f"}
    (d / "control" / "queue.json").write_text(json.dumps(queued))
    assert run_module(run_status, {"run_dir": str(d)})["queue"] == queued
    (d / "control" / "queue.json").unlink()
    assert run_module(run_status, {"run_dir": str(d)})["queue"] is None


def test_the_disk_the_run_directory_is_on(tmp_path, run_module):
    d = run_dir(tmp_path)
    disk = run_module(run_status, {"run_dir": str(d)})["disk"]
    assert disk["path"] == str(d) and 0 <= disk["free"] <= disk["total"] and disk["total"] > 0
    assert run_module(run_status, {"run_dir": str(tmp_path / "gone")})["disk"] is not None  # control/ is made


def test_an_empty_abort_record_still_aborts(tmp_path, run_module):
    """An agent on a full disk could create ABORT but not write it: the run is still aborted."""
    d = run_dir(tmp_path)
    (d / "control").mkdir()
    (d / "control" / "ABORT").write_text("")
    abort = run_module(run_status, {"run_dir": str(d)})["abort"]
    assert abort["reason"].startswith("an abort record that cannot be read") and "disk full" in abort["reason"]


def test_the_lease_is_renewed_by_its_time_stamp_and_a_cause_is_kept(tmp_path, run_module):
    d = run_dir(tmp_path)
    run_module(run_status, {"run_dir": str(d), "touch_lease": True})
    lease = d / "control" / "lease"
    first = lease.read_text()
    old = lease.stat().st_mtime - 100
    os.utime(lease, (old, old))
    run_module(run_status, {"run_dir": str(d), "touch_lease": True})
    assert lease.stat().st_mtime > old + 50 and lease.read_text() == first
    res = run_module(run_status, {"run_dir": str(d), "abort": "disk full on coord: x", "cause": "disk full on coord: x"})
    assert res["abort"]["cause"] == "disk full on coord: x"


def test_a_record_whose_content_the_disk_refuses_is_still_there(tmp_path, monkeypatch):
    """ENOSPC on the write: the name exists (empty), which is what the agents look for."""
    def full(fd, data):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(status.os, "write", full)
    path = tmp_path / "ABORT"
    status._put(str(path), "{}")
    assert path.exists() and path.read_text() == ""


def test_a_long_poll_answers_when_the_run_changes_not_when_a_heartbeat_ticks(tmp_path, run_module):
    import threading
    import time
    d = run_dir(tmp_path)

    def beat(state, at):
        # As the agents write it: whole, by a rename.
        (d / "nodes" / ".w1.json.tmp").write_text(json.dumps({"host": "w1", "state": state, "time": at}))
        os.replace(d / "nodes" / ".w1.json.tmp", d / "nodes" / "w1.json")

    # A beat that only moves the time does not end the wait.
    threading.Timer(0.2, beat, ("running", 9.0)).start()
    t0 = time.monotonic()
    res = run_module(run_status, {"run_dir": str(d), "wait": 0.8})
    assert time.monotonic() - t0 >= 0.8 and res["nodes"]["w1"]["time"] == 9.0
    # The launcher's agent finishing does, at once.
    threading.Timer(0.2, beat, ("finished", 10.0)).start()
    t0 = time.monotonic()
    res = run_module(run_status, {"run_dir": str(d), "wait": 10})
    assert time.monotonic() - t0 < 5 and res["nodes"]["w1"]["state"] == "finished"
    # So does a record another node writes (ABORT).
    (d / "control").mkdir(exist_ok=True)
    threading.Timer(0.2, (d / "control" / "ABORT").write_text, ('{"reason": "x"}',)).start()
    t0 = time.monotonic()
    res = run_module(run_status, {"run_dir": str(d), "wait": 10})
    assert time.monotonic() - t0 < 5 and res["abort"] == {"reason": "x"}


def test_a_long_poll_does_not_wait_through_a_change_the_caller_has_not_seen(tmp_path, run_module):
    import time
    d = run_dir(tmp_path)
    seen = run_module(run_status, {"run_dir": str(d)})["moment"]
    (d / "nodes" / "w1.json").write_text(json.dumps({"host": "w1", "state": "finished", "time": 7.0}))
    t0 = time.monotonic()
    res = run_module(run_status, {"run_dir": str(d), "wait": 10, "seen": seen})
    assert time.monotonic() - t0 < 5 and res["nodes"]["w1"]["state"] == "finished" and res["moment"] != seen


def test_the_trainers_answer_to_a_save_ends_a_long_poll(tmp_path, run_module):
    import threading
    import time
    d = run_dir(tmp_path)
    (d / "control").mkdir(exist_ok=True)
    threading.Timer(0.2, (d / "control" / "SAVED").write_text, ('{"step": 9, "time": 1.0}',)).start()
    t0 = time.monotonic()
    res = run_module(run_status, {"run_dir": str(d), "wait": 10})
    assert time.monotonic() - t0 < 5 and res["saved"] == {"step": 9, "time": 1.0}


def ended(tmp_path, launcher_code=0, done_ranks=(0, 1), watchers="running"):
    """A run whose launcher (coord) ended with ``launcher_code``, ranks ``done_ranks`` wrote done, watchers w1/w2."""
    d = tmp_path / "runs" / "r1"
    (d / "nodes").mkdir(parents=True)
    (d / "metrics").mkdir()
    (d / "nodes" / "coord.json").write_text(json.dumps({"host": "coord", "state": "finished", "role": "launcher",
                                                        "exit_code": launcher_code, "time": 5.0}))
    for host in ("w1", "w2"):
        (d / "nodes" / (host + ".json")).write_text(json.dumps({"host": host, "state": watchers, "time": 5.0}))
    for rank in (0, 1):
        recs = [{"event": "step", "step": 1}] + ([{"event": "done", "rank": rank}] if rank in done_ranks else [])
        (d / "metrics" / ("rank%d.jsonl" % rank)).write_text("".join(json.dumps(r) + "\n" for r in recs))
    (d / "hostfile").write_text("w1 slots=1\nw2 slots=1\n")
    return d


FINISH = {"nodes": ["coord", "w1", "w2"], "launchers": ["coord"], "world_size": 2}


def watchers_answer(d, after=0.2):
    """The watchers' agents: their final heartbeat once they see DONE (as multinode_ds.agent does)."""
    import threading
    import time

    def answer():
        deadline = time.time() + 5
        while not (d / "control" / "DONE").exists() and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(after)
        for host in ("w1", "w2"):
            (d / "nodes" / ".tmp").write_text(json.dumps({"host": host, "state": "finished", "time": 6.0}))
            os.replace(d / "nodes" / ".tmp", d / "nodes" / (host + ".json"))
    worker = threading.Thread(target=answer)
    worker.start()
    return worker


def test_a_run_that_ended_well_is_marked_done_in_the_long_poll_that_sees_it(tmp_path, run_module):
    import time
    d = ended(tmp_path)
    lock = tmp_path / "lock"
    lock.write_text(json.dumps({"run_id": "r1"}))
    worker = watchers_answer(d)
    t0 = time.monotonic()
    res = run_module(run_status, {"run_dir": str(d), "wait": 5, "finish": dict(FINISH, release=str(lock)),
                                  "bundle": 1 << 20})
    worker.join()
    # DONE written by the call, the lock given back, and the answer waited for the watchers' final beats.
    assert res["finished_here"] is True and res["changed"] is True and (d / "control" / "DONE").exists()
    assert not lock.exists() and time.monotonic() - t0 < 4
    assert all(b["state"] == "finished" for b in res["nodes"].values())
    # The run directory comes back with it, as the collection would copy it.
    assert res["bundle_skipped"] is None and res["bundle"]
    dest = tmp_path / "controller"
    from ansible_collections.multinode.deepspeed.plugins.module_utils.run.bundle import unpack
    unpack(res["bundle"], str(dest))
    assert (dest / "hostfile").read_text() == "w1 slots=1\nw2 slots=1\n"
    assert json.loads((dest / "nodes" / "w2.json").read_text())["state"] == "finished"
    assert (dest / "control" / "DONE").exists()


@pytest.mark.parametrize("case", ["launcher failed", "a rank never finished", "aborted", "no finish asked"])
def test_no_done_for_a_run_that_did_not_end_well(tmp_path, run_module, case):
    d = ended(tmp_path, launcher_code=1 if case == "launcher failed" else 0,
              done_ranks=(0,) if case == "a rank never finished" else (0, 1))
    if case == "aborted":
        (d / "control").mkdir()
        (d / "control" / "ABORT").write_text('{"reason": "x"}')
    args = {"run_dir": str(d), "wait": 0.3, "bundle": 1 << 20}
    if case != "no finish asked":
        args["finish"] = FINISH
    res = run_module(run_status, args)
    assert res["finished_here"] is False and not (d / "control" / "DONE").exists()
    assert res["bundle"] is None and res["bundle_skipped"] is None


def test_a_run_the_collection_must_copy_is_not_packed(tmp_path, run_module):
    d = ended(tmp_path, watchers="finished")
    os.symlink("/etc/passwd", d / "passwd")
    res = run_module(run_status, {"run_dir": str(d), "wait": 1, "finish": FINISH, "bundle": 1 << 20})
    assert res["finished_here"] is True and res["bundle"] is None
    assert res["bundle_skipped"] == "passwd is not a regular file"


def test_the_done_call_waits_for_every_watcher_not_the_first_change(tmp_path, run_module):
    d = ended(tmp_path)
    lock = tmp_path / "lock"
    lock.write_text(json.dumps({"run_id": "r1"}))
    # w1 answers at once, w2 a moment later: one answer with both.
    (d / "nodes" / "w1.json").write_text(json.dumps({"host": "w1", "state": "finished", "time": 6.0}))
    worker = watchers_answer(d, after=0.3)
    res = run_module(run_status, {"run_dir": str(d), "done": True, "wait": 5, "release": str(lock),
                                  "finish": FINISH, "bundle": 1 << 20})
    worker.join()
    assert res["changed"] is True and res["finished_here"] is False and not lock.exists()
    assert res["nodes"]["w2"]["state"] == "finished" and res["bundle"]


def test_a_bad_finish_is_refused(tmp_path, run_module):
    d = ended(tmp_path)
    res = run_module(run_status, {"run_dir": str(d), "wait": 0.1, "finish": {"nodes": ["w1"], "launchers": ["coord"]}})
    assert res["failed"] and "finish needs nodes" in res["msg"]


def test_the_spares_another_run_holds_now(tmp_path, run_module):
    d = run_dir(tmp_path)
    now = __import__("time").time()
    spares = tmp_path / "spares.json"
    spares.write_text(json.dumps({"spares": {
        "s1": {"run_id": "other", "until": now + 600}, "s2": {"run_id": "r1", "until": now + 600},
        "s3": {"run_id": "other", "until": now - 1}, "s4": {"run_id": "other", "until": "soon"}}}))
    res = run_module(run_status, {"run_dir": str(d), "spares_file": str(spares), "run_id": "r1"})
    # Its own hold, an expired one and one that is not a time are not another run's now.
    assert res["spares_held"] == ["s1"]
    assert run_module(run_status, {"run_dir": str(d)})["spares_held"] is None
    assert run_module(run_status, {"run_dir": str(d), "spares_file": str(tmp_path / "none.json")})["spares_held"] == []
    # A record that is not one: no spare counts as free.
    spares.write_text("not json")
    assert run_module(run_status, {"run_dir": str(d), "spares_file": str(spares), "run_id": "r1"})["spares_held"] is None


def test_the_trainers_answer_to_a_save_ask(tmp_path, run_module):
    d = run_dir(tmp_path)
    assert run_module(run_status, {"run_dir": str(d)})["saved"] is None
    (d / "control").mkdir(exist_ok=True)
    (d / "control" / "SAVED").write_text(json.dumps({"step": 61, "time": 5.0}))
    assert run_module(run_status, {"run_dir": str(d)})["saved"] == {"step": 61, "time": 5.0}
    (d / "control" / "SAVED").write_text("[1]")
    assert run_module(run_status, {"run_dir": str(d)})["saved"] is None
