"""Two controllers (two runs, one quarantine file and one spares file on the coordinator) through run_recovery's
steps there (issue 44, point 12): each sees the other's holds, a run gives its spares back when it ends,
-e unquarantine lets out a node and a spare a run that is gone still holds, and a damaged record stops the step
naming the file."""
import json
import os

from ansible_collections.multinode.deepspeed.plugins.modules import run_recovery

LOST = {"status": "failed", "lost": ["worker2"], "hosts": {"worker1": [0], "worker2": [1]}, "last_step": 14,
        "watch": {"status": "failed", "reason": "node worker2 stopped answering (no heartbeat for 21s)"},
        "abort": {"reason": "node worker2 stopped answering", "time": 1010.0}, "started": 1000.0, "problems": []}


def _run(tmp_path, run_id):
    d = tmp_path / run_id / "attempts" / "1"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(LOST))
    return str(tmp_path / run_id)


def test_two_controllers_see_each_others_spare_holds_until_the_run_ends_or_the_spare_is_let_out(
        tmp_path, run_module):
    files = {"quarantine_file": str(tmp_path / "shared" / "q.json"), "spares_file": str(tmp_path / "shared" / "s.json")}
    place = dict(files, step="place", attempt=1, restarts=1, nodes=["worker1", "worker2"], failed_nodes=["worker2"],
                 spares=["worker3"], timeout=3600, why="worker2 lost")
    a = run_module(run_recovery, dict(place, run_id="ra"))
    assert a["replaced"] == {"worker2": "worker3"}
    # The other controller's run sees the hold, and its placement names the run and the way out.
    free = run_module(run_recovery, dict(files, step="quarantine", run_id="rb", nodes=["worker1", "worker2"],
                                         spares=["worker3"]))
    assert free["spares_held"] == ["worker3"] and free["spares_free"] == []
    b = run_module(run_recovery, dict(place, run_id="rb"))
    assert b["failed"] is True
    assert "spare worker3 is held by another run (ra, until " in b["msg"]
    assert "-e unquarantine=worker3 lets it out" in b["msg"]
    # Run ra is gone without giving it back: -e unquarantine=worker3 (checks.yml, after the plan) lets it out.
    out = run_module(run_recovery, dict(files, step="unquarantine", run_id="rc", nodes=["worker3"]))
    assert out["changed"] is True and out["released"] == ["worker3"] and out["unquarantined"] == []
    assert json.loads(open(files["spares_file"]).read())["spares"] == {}
    b = run_module(run_recovery, dict(place, run_id="rb"))
    assert b["replaced"] == {"worker2": "worker3"}
    # Run rb ends (after_attempts.yml's release, whatever ended it): its spare is free again; ra had none left.
    assert run_module(run_recovery, dict(files, step="release", run_id="rb"))["released"] == ["worker3"]
    again = run_module(run_recovery, dict(files, step="release", run_id="ra"))
    assert again["changed"] is False and again["released"] == []
    assert json.loads(open(files["spares_file"]).read())["spares"] == {}


def test_quarantines_of_two_runs_are_both_kept_until_let_out(tmp_path, run_module):
    files = {"quarantine_file": str(tmp_path / "q.json"), "spares_file": str(tmp_path / "s.json")}
    for run_id, node in (("ra", "worker2"), ("rb", "worker1")):
        run = tmp_path / run_id
        for n in (1, 2):
            d = run / "attempts" / str(n)
            d.mkdir(parents=True)
            (d / "summary.json").write_text(json.dumps(dict(LOST, lost=[node])))
        judged = run_module(run_recovery, dict(step="judge", attempt=2, restarts=3, run_dir=str(run), run_id=run_id))
        assert judged["quarantined"] == {node: "lost twice"}
        run_module(run_recovery, dict(files, step="quarantine", run_id=run_id, quarantine=judged["quarantined"],
                                      nodes=["worker1", "worker2"]))
    held = json.loads(open(files["quarantine_file"]).read())["nodes"]
    assert sorted((n, r["run_id"]) for n, r in held.items()) == [("worker1", "rb"), ("worker2", "ra")]
    out = run_module(run_recovery, dict(files, step="unquarantine", run_id="rc", nodes=["worker2", "worker9"]))
    assert out["unquarantined"] == ["worker2"] and out["released"] == []
    assert list(json.loads(open(files["quarantine_file"]).read())["nodes"]) == ["worker1"]
    # Nothing of the names held: nothing written (the spares file is never made).
    out = run_module(run_recovery, dict(files, step="unquarantine", run_id="rc", nodes=["worker2"]))
    assert out["changed"] is False and not (tmp_path / "s.json").exists()


def test_a_later_decision_of_the_run_does_not_quarantine_again_what_an_earlier_one_did(tmp_path, run_module):
    run = tmp_path / "ra"
    for n in (1, 2, 3):
        d = run / "attempts" / str(n)
        d.mkdir(parents=True)
        (d / "summary.json").write_text(json.dumps(LOST))
    first = run_module(run_recovery, dict(step="judge", attempt=2, restarts=3, run_dir=str(run), run_id="ra"))
    assert first["quarantined"] == {"worker2": "lost twice"}
    later = run_module(run_recovery, dict(step="judge", attempt=3, restarts=3, run_dir=str(run), run_id="ra"))
    assert later["quarantined"] == {}


def test_a_damaged_spares_file_stops_the_step_naming_it(tmp_path, run_module):
    spares = tmp_path / "s.json"
    spares.write_text('{"spares": ')
    res = run_module(run_recovery, {"step": "quarantine", "run_id": "ra", "quarantine_file": str(tmp_path / "q.json"),
                                    "spares_file": str(spares), "nodes": ["worker1", "worker2"]})
    assert res["failed"] is True
    assert res["msg"].startswith("run_recovery (quarantine): %s is not a spares file (spares_file): it is not JSON"
                                 % spares)
    assert "Fix: repair it" in res["msg"] and spares.read_text() == '{"spares": '


def test_the_records_default_to_the_shared_directory_on_the_coordinator(tmp_path, run_module):
    """Without quarantine_file and spares_file, the steps on the coordinator use <shared_dir>/runs/.records/, made
    readable by every account there (node_facts reads it as the login account) and writable by the run's only."""
    shared = tmp_path / "shared"
    (shared / "runs").mkdir(parents=True)
    umask = os.umask(0o077)  # the run's account's umask: the records stay readable all the same
    try:
        res = run_module(run_recovery, {"step": "quarantine", "run_id": "ra", "shared_dir": str(shared),
                                        "quarantine": {"worker2": "lost twice"}, "nodes": ["worker1", "worker2"]})
    finally:
        os.umask(umask)
    assert res["changed"] is True, res
    records = shared / "runs" / ".records"
    held = json.loads((records / "quarantine.json").read_text())["nodes"]
    assert held["worker2"]["run_id"] == "ra" and held["worker2"]["reason"] == "lost twice"
    assert (records.stat().st_mode & 0o777) == 0o755 and ((records / "quarantine.json").stat().st_mode & 0o777) == 0o644
