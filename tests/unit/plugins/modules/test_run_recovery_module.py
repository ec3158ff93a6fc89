"""run_recovery over a run's attempt directories: judge, place, finish (the decisions are recovery.py's)."""
import json

from ansible_collections.multinode.deepspeed.plugins.modules import run_recovery


def _attempt(run, n, summary, steps, t0):
    d = run / "attempts" / str(n)
    (d / "metrics").mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(summary))
    recs = [{"event": "step", "step": s, "loss": 6.0 - s / 10.0, "step_time": 0.5, "time": t0 + i * 0.5}
            for i, s in enumerate(steps)]
    (d / "metrics" / "rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


LOST = {"status": "failed", "lost": ["worker2"], "hosts": {"worker1": [0], "worker2": [1]}, "last_step": 14,
        "watch": {"status": "failed", "reason": "node worker2 stopped answering (no heartbeat for 21s)"},
        "abort": {"reason": "node worker2 stopped answering", "time": 1010.0}, "started": 1000.0, "problems": []}
DONE = {"status": "success", "hosts": {"worker1": [0], "worker3": [1]}, "last_step": 30, "started": 1020.0,
        "resume": {"start_step": 10, "from_tag": "step10"}, "problems": []}


def test_judge_place_and_finish_a_run_that_lost_a_node(tmp_path, run_module):
    run, quarantine = tmp_path / "r1", str(tmp_path / "q.json")
    _attempt(run, 1, LOST, range(1, 15), 1001.0)
    base = {"run_dir": str(run), "run_id": "r1", "attempt": 1, "restarts": 2}
    judged = run_module(run_recovery, dict(base, step="judge"))
    assert judged["retry"] is True and judged["failed_nodes"] == ["worker2"] and judged["quarantined"] == {}
    assert judged["why"].startswith("worker2 lost at step 14 (node worker2 stopped answering")
    assert json.loads((run / "attempts" / "1" / "recovery.json").read_text())["retry"] is True
    # On the coordinator: the records (nothing to quarantine yet), the free spares and the wait.
    res = run_module(run_recovery, {"run_id": "r1", "step": "quarantine", "quarantine": {},
                                    "quarantine_file": quarantine, "nodes": ["worker1", "worker2"],
                                    "spares": ["worker3"], "check_nodes": judged["check_nodes"]})
    assert res["spares_free"] == ["worker3"] and res["wait"] == 5 and res["changed"] is False
    res = run_module(run_recovery, {"run_id": "r1", "step": "place", "attempt": 1, "restarts": 2, "why": judged["why"],
                                    "quarantine_file": quarantine, "nodes": ["worker1", "worker2"],
                                    "spares": ["worker3"], "failed_nodes": ["worker2"], "checks": [],
                                    "spares_file": str(tmp_path / "s.json")})
    assert res["nodes"] == ["worker1", "worker3"] and res["replaced"] == {"worker2": "worker3"}
    assert res["line"].startswith("attempt 2/3 on worker1, worker3 (worker2 lost")
    _attempt(run, 2, DONE, range(11, 31), 1025.0)
    res = run_module(run_recovery, dict(base, step="finish", attempt=2, started=1000.0))
    summary = json.loads((run / "summary.json").read_text())
    assert res["summary"]["attempts"] == summary["attempts"] and summary["status"] == "success"
    first, second = summary["attempts"]
    assert (first["kind"], first["retried"], second["start_step"], second["recomputed_steps"]) == ("lost", True, 10, 4)
    assert second["fault_to_first_step"] == 15.0 and 0 < summary["goodput"] < 1
    assert (run / "plots" / "timeline.png").stat().st_size > 0
    assert "| [2](attempts/2/report.md) | worker1, worker3 | 10-30 |" in (run / "report.md").read_text()


def test_place_fails_naming_the_fix_when_no_node_is_left(tmp_path, run_module):
    run = tmp_path / "r1"
    _attempt(run, 1, LOST, range(1, 15), 1001.0)
    res = run_module(run_recovery, {"run_dir": str(run), "run_id": "r1", "attempt": 1, "restarts": 1,
                                    "step": "place", "nodes": ["worker1", "worker2"], "failed_nodes": ["worker2"],
                                    "quarantine_file": str(tmp_path / "q.json"), "spares_file": str(tmp_path / "s.json"),
                                    "checks": [{"item": "worker2", "failed": True, "msg": "timed out"}]})
    assert res["failed"] is True
    assert "The run cannot go on: worker2 did not come back and no spare is free" in res["msg"]
    assert "-e min_nodes=1" in res["msg"] and "worker2 did not answer: timed out" in res["msg"]
    # A node that came back with another stack is not used again.
    res = run_module(run_recovery, {"run_dir": str(run), "run_id": "r1", "attempt": 1, "restarts": 1,
                                    "step": "place", "nodes": ["worker1", "worker2"], "failed_nodes": ["worker2"],
                                    "quarantine_file": str(tmp_path / "q.json"), "spares_file": str(tmp_path / "s.json"),
                                    "min_nodes": 1,
                                    "fingerprints": {"worker2": "aaa"},
                                    "checks": [{"item": "worker2", "ansible_facts": {
                                        "multinode_node": {"stack_fingerprint": "bbb"}}}]})
    assert res["nodes"] == ["worker1"] and "worker2 came back with another stack" in res["notes"][0]


def test_no_attempt_starts_when_the_runs_timeout_is_spent(tmp_path, run_module):
    run = tmp_path / "r1"
    _attempt(run, 1, LOST, range(1, 15), 1001.0)
    res = run_module(run_recovery, {"run_dir": str(run), "run_id": "r1", "attempt": 1, "restarts": 2,
                                    "step": "judge", "timeout": 60, "started": 1000.0,
                                    "quarantine_file": str(tmp_path / "q.json")})
    assert res["retry"] is False and "timeout of 60s covers every attempt and is spent" in res["why"]


SLURM_DOWN = dict(LOST, lost=[], watch={"status": "failed", "reason": "node worker2 is DOWN in Slurm (x); Slurm job 8 "
                                                                      "ended NODE_FAIL"})


def test_a_scheduler_that_drains_a_lost_node_gets_it_to_drain_not_to_wait_for(tmp_path, run_module):
    run = tmp_path / "r1"
    _attempt(run, 1, SLURM_DOWN, range(1, 15), 1001.0)
    base = {"run_dir": str(run), "run_id": "r1", "attempt": 1, "restarts": 1}
    res = run_module(run_recovery, dict(base, step="judge", reuse_lost=False))
    assert res["retry"] is True and res["check_nodes"] == [] and res["drain_nodes"] == ["worker2"]
    res = run_module(run_recovery, dict(base, step="judge"))
    assert res["check_nodes"] == ["worker2"] and res["drain_nodes"] == []
    res = run_module(run_recovery, {"run_id": "r1", "step": "quarantine", "nodes": ["worker1", "worker2"],
                                    "check_nodes": res["check_nodes"], "quarantine_file": str(tmp_path / "q.json"),
                                    "spares_file": str(tmp_path / "s.json")})
    assert res["wait"] == 120 and res["spares_free"] == []


def test_a_spare_one_run_holds_is_not_taken_by_another_until_it_gives_it_back(tmp_path, run_module):
    spares_file = str(tmp_path / "s.json")
    runs = {}
    for run_id in ("ra", "rb"):
        runs[run_id] = tmp_path / run_id
        _attempt(runs[run_id], 1, LOST, range(1, 15), 1001.0)
    place = {"attempt": 1, "restarts": 1, "step": "place", "nodes": ["worker1", "worker2"],
             "failed_nodes": ["worker2"], "spares": ["worker3"], "quarantine_file": str(tmp_path / "q.json"),
             "spares_file": spares_file, "fingerprints": {"worker1": "aaa", "worker2": "aaa"},
             "spare_checks": [{"item": "worker3", "ansible_facts": {"multinode_node": {"stack_fingerprint": "aaa"}}}]}
    res = run_module(run_recovery, dict(place, run_dir=str(runs["ra"]), run_id="ra"))
    assert res["replaced"] == {"worker2": "worker3"} and res["changed"] is True
    free = run_module(run_recovery, {"run_id": "rb", "step": "quarantine", "nodes": ["worker1", "worker2"],
                                     "spares": ["worker3"], "check_nodes": ["worker2"],
                                     "quarantine_file": str(tmp_path / "q.json"), "spares_file": spares_file})
    assert free["spares_free"] == [] and free["spares_held"] == ["worker3"] and free["wait"] == 120
    res = run_module(run_recovery, dict(place, run_dir=str(runs["rb"]), run_id="rb"))
    assert res["failed"] is True and "spare worker3 is held by another run" in res["msg"]
    # Run ra ends: after_attempts.yml gives its spares back on the coordinator.
    gone = run_module(run_recovery, {"run_id": "ra", "step": "release", "spares_file": spares_file})
    assert gone["released"] == ["worker3"] and gone["changed"] is True
    res = run_module(run_recovery, dict(place, run_dir=str(runs["rb"]), run_id="rb"))
    assert res["replaced"] == {"worker2": "worker3"}
    # A spare whose stack is not the run's is not used: the replacement's preflight.
    stale = dict(place, spare_checks=[{"item": "worker3", "ansible_facts": {"multinode_node": {
        "stack_fingerprint": "old"}}}], spares_file=str(tmp_path / "s2.json"), min_nodes=1)
    res = run_module(run_recovery, dict(stale, run_dir=str(runs["ra"]), run_id="ra"))
    assert res["nodes"] == ["worker1"] and "spare worker3 is not used: its stack" in res["notes"][-1]


def test_the_last_attempt_says_the_budget_is_spent(tmp_path, run_module):
    run = tmp_path / "r1"
    _attempt(run, 1, LOST, range(1, 15), 1001.0)
    (run / "attempts" / "1" / "recovery.json").write_text(json.dumps({"retry": True, "why": "lost: retried"}))
    _attempt(run, 2, dict(LOST, started=1020.0), range(11, 20), 1025.0)
    res = run_module(run_recovery, {"run_dir": str(run), "run_id": "r1", "attempt": 2, "restarts": 1,
                                    "step": "finish", "started": 1000.0})
    second = res["summary"]["attempts"][1]
    assert second["retried"] is False and second["retry_reason"].startswith("worker2 lost at step 14 (")
    assert second["retry_reason"].endswith("; the restart budget is spent (restarts=1)")
    assert "attempt 2: worker2 lost" in res["message"] and res["message"].startswith("failed after 2 attempt(s)")


def test_verify_writes_the_replacements_preflight_and_fails_naming_the_fix(tmp_path, run_module):
    run = tmp_path / "r1"
    job = {"backend": "pdsh", "shared_dir": "/shared", "home": "/opt/mnds", "addresses": {"worker3": "10.0.0.3"},
           "launch": {"ssh_pairs": [["coord", "worker3"]]}}
    good = {"item": "worker3", "time": 100.1, "controller_before": 100.0, "controller_after": 100.2,
            "resolved": {"worker3": {"addresses": ["10.0.0.3"]}},
            "disk": {"/shared": {"free_bytes": 10 << 30}, "/opt/mnds": {"free_bytes": 10 << 30}}}
    coord = {"time": 100.1, "controller_before": 100.0, "controller_after": 100.2,
             "ssh": {"worker3": {"rc": 0, "stdout": "8192", "stderr": ""}}}
    base = {"run_dir": str(run), "run_id": "r1", "attempt": 2, "step": "verify", "replaced": {"worker2": "worker3"},
            "job": job, "reference": {"coord": coord}}
    res = run_module(run_recovery, dict(base, probes=[good]))
    assert res["line"] == "preflight of worker3: 5 checks passed"
    assert json.loads((run / "attempts" / "2" / "replacement-preflight.json").read_text())["nodes"] == ["worker3"]
    full = dict(good, disk={"/shared": {"free_bytes": 1 << 30}, "/opt/mnds": {"free_bytes": 10 << 30}})
    res = run_module(run_recovery, dict(base, probes=[full]))
    assert res["failed"] is True and res["msg"].startswith("The node(s) taking a place failed their preflight, so "
                                                           "attempt 2 does not start: disk worker3: shared /shared")
    assert "Fix: free space on /shared of worker3" in res["msg"]


SHRUNK = {"status": "failed", "hosts": {"worker1": [0]}, "last_step": 190, "started": 1020.0,
          "nodes": {"worker1": {"state": "aborted"}, "coord": {"state": "aborted"}},
          "watch": {"status": "failed", "reason": "grow back: worker2 answers again; the run was checkpointed at "
                                                  "step 180 and grows back to 2 nodes"},
          "abort": {"reason": "grow back: worker2 answers again", "time": 1030.0},
          "resume": {"start_step": 50}, "problems": []}


def test_a_run_that_shrank_looks_out_for_its_node_and_grows_back_when_it_answers(tmp_path, run_module):
    run = tmp_path / "r1"
    records = {"quarantine_file": str(tmp_path / "q.json"), "spares_file": str(tmp_path / "s.json")}
    _attempt(run, 1, LOST, range(1, 15), 1001.0)
    base = dict(records, run_dir=str(run), run_id="r1", restarts=2, full_nodes=["worker1", "worker2"])
    # Attempt 1 lost worker2, which did not come back: attempt 2 runs on worker1 and looks out for worker2.
    shrink = run_module(run_recovery, dict(base, step="place", attempt=1, nodes=["worker1", "worker2"],
                                           failed_nodes=["worker2"], kind="lost", min_nodes=1,
                                           checks=[{"item": "worker2", "unreachable": True, "msg": "No route"}]))
    assert shrink["nodes"] == ["worker1"] and shrink["dropped"] == ["worker2"] and shrink["verify"] == {}
    assert shrink["grow"] == {"nodes": ["worker2"], "spares": [], "width": 2}
    # Attempt 2 stopped to grow back: the quick look, then worker2 (the run's stack) takes its place again.
    _attempt(run, 2, SHRUNK, range(51, 191), 1021.0)
    judged = run_module(run_recovery, dict(base, step="judge", attempt=2))
    assert judged["retry"] and judged["kind"] == "grow" and judged["check_nodes"] == ["worker2"]
    looked = run_module(run_recovery, dict(base, step="quarantine", nodes=["worker1"], check_nodes=["worker2"],
                                           kind="grow", recover_wait=120))
    assert looked["wait"] == 5
    grown = run_module(run_recovery, dict(base, step="place", attempt=2, nodes=["worker1"], failed_nodes=["worker2"],
                                          kind="grow", min_nodes=1, fingerprints={"worker1": "aaa"},
                                          why=judged["why"], checks=[{"item": "worker2", "ansible_facts": {
                                              "multinode_node": {"stack_fingerprint": "aaa"}}}]))
    assert grown["nodes"] == ["worker1", "worker2"] and grown["grown"] == ["worker2"] and grown["grow"] is None
    assert grown["verify"] == {"worker2": "worker2"} and grown["changed"] is True
    assert grown["line"].startswith("attempt 3/3 on worker1, worker2 (grow back: worker2 answers again")
    # Back with another stack: the attempt stays on worker1 and does not look for worker2 again.
    other = run_module(run_recovery, dict(base, step="place", attempt=2, nodes=["worker1"], failed_nodes=["worker2"],
                                          kind="grow", restarts=5, fingerprints={"worker1": "aaa"},
                                          checks=[{"item": "worker2", "ansible_facts": {
                                              "multinode_node": {"stack_fingerprint": "bbb"}}}]))
    assert other["nodes"] == ["worker1"] and other["grow"] is None and other["grown"] == []
    assert "worker2 came back with another stack" in other["notes"][0]


def test_a_spare_that_grows_the_run_is_held_for_it(tmp_path, run_module):
    run = tmp_path / "r1"
    spares = tmp_path / "s.json"
    spares.write_text(json.dumps({"spares": {}}))
    _attempt(run, 1, LOST, range(1, 15), 1001.0)
    _attempt(run, 2, dict(SHRUNK, watch={"status": "failed", "reason": "grow back: spare1 answers again"}),
             range(51, 191), 1021.0)
    res = run_module(run_recovery, {"run_dir": str(run), "run_id": "r1", "restarts": 3, "step": "place",
                                    "attempt": 2, "nodes": ["worker1"], "failed_nodes": ["spare1"], "kind": "grow",
                                    "spares": ["spare1"], "full_nodes": ["worker1", "worker2"],
                                    "quarantine_file": str(tmp_path / "q.json"), "spares_file": str(spares),
                                    "fingerprints": {"worker1": "aaa"}, "spare_checks": [],
                                    "checks": [{"item": "spare1", "ansible_facts": {
                                        "multinode_node": {"stack_fingerprint": "aaa"}}}]})
    assert res["nodes"] == ["worker1", "spare1"] and res["grown"] == ["spare1"]
    assert json.loads(spares.read_text())["spares"]["spare1"]["run_id"] == "r1"
