"""multinode_ds/k8s.py (issue 14, WIP): a run's pod runs its ordinal's agent."""
import json
import sys

import pytest

from multinode_ds import k8s


def test_ordinal_from_the_pod_name():
    assert k8s.ordinal("mnds-r1-0") == 0 and k8s.ordinal("mnds-run-a-12") == 12
    with pytest.raises(SystemExit, match="not a run.s pod name"):
        k8s.ordinal("worker1")


def test_the_pod_runs_its_agent_and_records_its_exit(tmp_path):
    (tmp_path / "k8s").mkdir()
    (tmp_path / "k8s" / "agents.json").write_text(json.dumps([
        [sys.executable, "-c", "raise SystemExit(0)"], [sys.executable, "-c", "raise SystemExit(3)"]]))
    assert k8s.main(["pod", "--run-dir", str(tmp_path), "--pod", "mnds-r1-1", "--exit"]) == 3
    assert (tmp_path / "k8s" / "pod1.exit").read_text() == "3\n"


def test_an_ordinal_beyond_the_plan_is_named(tmp_path):
    (tmp_path / "k8s").mkdir()
    (tmp_path / "k8s" / "agents.json").write_text(json.dumps([["true"]]))
    with pytest.raises(SystemExit, match="pod ordinal 2 has no agent"):
        k8s.main(["pod", "--run-dir", str(tmp_path), "--pod", "mnds-r1-2", "--exit"])


def test_the_pod_ends_with_its_agent_without_being_told(tmp_path):
    """Issue 26, point 11: a pod whose agent ended (a stale lease: the controller died) exits, so that the pod
    (restartPolicy Never) ends and gives its GPUs back; it used to sleep until something deleted it."""
    import subprocess
    (tmp_path / "k8s").mkdir()
    (tmp_path / "k8s" / "agents.json").write_text(json.dumps([[sys.executable, "-c", "raise SystemExit(4)"]]))
    proc = subprocess.run([sys.executable, "-m", "multinode_ds.k8s", "pod", "--run-dir", str(tmp_path),
                           "--pod", "mnds-r1-0"], capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "the agent exited with 4; the pod ends" in proc.stdout
    assert (tmp_path / "k8s" / "pod0.exit").read_text() == "4\n"
