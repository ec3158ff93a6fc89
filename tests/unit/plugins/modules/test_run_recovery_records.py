"""Two controllers (two runs, one quarantine file and one spares file) through run_recovery and the plan (issue 44,
point 12): each sees the other's holds, a run gives its spares back when it ends, -e unquarantine lets out a spare
a run that is gone still holds, and a damaged record stops the step naming the file."""
import json

from ansible_collections.multinode.deepspeed.plugins.action.job_plan import quarantined
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
                 spares=["worker3"], timeout=3600)
    a = run_module(run_recovery, dict(place, run_dir=_run(tmp_path, "ra"), run_id="ra"))
    assert a["replaced"] == {"worker2": "worker3"}
    # The other controller's judge sees the hold, and its placement names the run and the way out.
    judge = run_module(run_recovery, dict(files, step="judge", attempt=1, restarts=1, run_dir=_run(tmp_path, "rb"),
                                          run_id="rb", nodes=["worker1", "worker2"], spares=["worker3"]))
    assert judge["spares_held"] == ["worker3"] and judge["spares_free"] == []
    b = run_module(run_recovery, dict(place, run_dir=str(tmp_path / "rb"), run_id="rb"))
    assert b["failed"] is True
    assert "spare worker3 is held by another run (ra, until " in b["msg"]
    assert "-e unquarantine=worker3 lets it out" in b["msg"]
    # Run ra is gone without giving it back: -e unquarantine=worker3 on the next plan lets it out.
    assert quarantined({"unquarantine": "worker3", **files}, ["worker1", "worker2", "worker3"]) == {}
    assert json.loads(open(files["spares_file"]).read())["spares"] == {}
    b = run_module(run_recovery, dict(place, run_dir=str(tmp_path / "rb"), run_id="rb"))
    assert b["replaced"] == {"worker2": "worker3"}
    # Run rb ends (after_attempts.yml's release, whatever ended it): its spare is free again; ra had none left.
    assert run_module(run_recovery, dict(files, step="release", attempt=1, run_dir=str(tmp_path / "rb"),
                                         run_id="rb"))["released"] == ["worker3"]
    again = run_module(run_recovery, dict(files, step="release", attempt=1, run_dir=str(tmp_path / "ra"),
                                          run_id="ra"))
    assert again["changed"] is False and again["released"] == []
    assert json.loads(open(files["spares_file"]).read())["spares"] == {}


def test_quarantines_of_two_runs_are_both_kept(tmp_path, run_module):
    files = {"quarantine_file": str(tmp_path / "q.json"), "spares_file": str(tmp_path / "s.json")}
    for run_id, node in (("ra", "worker2"), ("rb", "worker1")):
        run = tmp_path / run_id
        for n in (1, 2):
            d = run / "attempts" / str(n)
            d.mkdir(parents=True)
            (d / "summary.json").write_text(json.dumps(dict(LOST, lost=[node])))
        run_module(run_recovery, dict(files, step="judge", attempt=2, restarts=3, run_dir=str(run), run_id=run_id,
                                      nodes=["worker1", "worker2"]))
    held = json.loads(open(files["quarantine_file"]).read())["nodes"]
    assert sorted((n, r["run_id"]) for n, r in held.items()) == [("worker1", "rb"), ("worker2", "ra")]


def test_a_damaged_spares_file_stops_the_step_naming_it(tmp_path, run_module):
    spares = tmp_path / "s.json"
    spares.write_text('{"spares": ')
    res = run_module(run_recovery, {"step": "judge", "attempt": 1, "restarts": 1, "run_dir": _run(tmp_path, "ra"),
                                    "run_id": "ra", "quarantine_file": str(tmp_path / "q.json"),
                                    "spares_file": str(spares), "nodes": ["worker1", "worker2"]})
    assert res["failed"] is True
    assert res["msg"].startswith("run_recovery (judge): %s is not a spares file (spares_file): it is not JSON" % spares)
    assert "Fix: repair it" in res["msg"] and spares.read_text() == '{"spares": '
