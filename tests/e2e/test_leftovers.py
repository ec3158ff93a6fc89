"""A finished run stays finished (issue 44, point 5): a user's script that leaves a child running when it exits 0
(a stray dataloader worker, a tracker's sidecar) ends well, in one attempt, and nothing of the run is left on any
node; the child is named in the summary (``left_pids``), never as the run's failure."""
import json
import time
from pathlib import Path

import pytest
from e2e_nodes import NODES, left_on, load_summary

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]

# No torch, no DeepSpeed: each rank starts `sleep 300` in the background (its own session, its output elsewhere,
# as a daemon would) and exits 0 at once.
SCRIPT = """import subprocess, sys
child = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
print("started sleep 300 as", child.pid, "and exits", flush=True)
"""


@pytest.mark.parametrize("backend,restarts", [("pdsh", 1), ("ssh-free", 0)])
def test_a_child_left_by_a_script_that_ended_well_is_stopped_and_named(provisioned, run_playbook, tmp_path, backend,
                                                                       restarts):
    """pdsh: the workers' agents watch (DONE ends the run there); ssh-free: each worker's agent runs its launcher.
    With restarts the agents run in the attempt's directory (runs/<id>/attempts/1), which is not the run's id."""
    project = tmp_path / "proj"
    project.mkdir()
    (project / "leave_child.py").write_text(SCRIPT)
    run_id = f"e2e-leftover-{backend}-{int(time.time())}"
    t0 = time.time()
    # timeout bounds the test if the run hangs waiting for the child.
    res = run_playbook("train.yml", "-e", f"backend={backend}", "-e", f"workdir={project}",
                       "-e", "entrypoint=leave_child.py", "-e", f"restarts={restarts}", "-e", "timeout=150",
                       "-e", f"run_id={run_id}", "-e", "preflight=false", name=f"leftover-{backend}")
    took = time.time() - t0
    assert res.rc == 0, res.tail()
    summary = load_summary(run_id)
    assert summary["status"] == "success", json.dumps(summary)[:2000]
    # Nothing carrying the run's marker is left on any node (the play ended after every agent's last beat).
    assert left_on(NODES, run_id, seconds=5) == {}
    where = ROOT / "runs" / run_id
    if restarts:
        assert len(summary["attempts"]) == 1 and summary["attempts"][0]["status"] == "success"
        where = where / "attempts" / "1"
    else:
        assert "attempts" not in summary
    attempt = json.loads((where / "summary.json").read_text())
    left = attempt["left_pids"]
    assert sorted(left) == ["worker1", "worker2"], left
    for host, entries in left.items():
        assert [(e["cmd"], e["stopped"]) for e in entries] == [("sleep 300", True)], (host, entries)
        assert attempt["nodes"][host]["left_pids"] == entries
    assert attempt["status"] == "success" and not attempt["problems"]
    report = (where / "report.md").read_text()
    assert "Left running when the run ended, stopped by the node's agent: worker1: " in report
    assert "`sleep 300`" in report and "still running" not in report
    print(f"{backend}: the play took {took:.0f}s")
