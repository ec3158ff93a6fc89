"""playbooks/tasks/after_attempts.yml gives the run's checkpoint lock and its spares back after its last attempt,
and after a failure with no attempt left (issue 44, points 4 and 12): run on localhost (controller and coordinator
at once) with the real modules."""
import json
import time
from pathlib import Path

import localplay

ROOT = Path(__file__).resolve().parents[3]
PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  vars:
    train_retry: %(retry)s
    train_started: %(started)s
    train_collect_dir: %(collect)s
    train_plan:
      job: {run_id: r1, restarts: 1, shared_dir: %(shared)s, checkpoint_lock: %(lock)s, mlflow: null, timeout: 3600}
      # Where job_plan says the records are on the coordinator (here: the play's one host).
      records: {quarantine_file: %(quarantine)s, spares_file: %(spares)s}
    train_job: {run_id: r1, attempt: 1, restarts: 1, recover_wait: 0, timeout: 3600, rank_hosts: [worker1, worker2],
                launch: {ssh_agents: [], steps: {}, reuse_lost: true}}
  tasks:
    - name: After the first attempt
      ansible.builtin.include_tasks: %(tasks)s
"""


def setup(tmp_path, ending):
    shared, collect = tmp_path / "shared", tmp_path / "runs" / "r1"
    first = shared / "runs" / "r1" / "attempts" / "1"
    (first / "control").mkdir(parents=True)
    (first / "control" / "ABORT").write_text(json.dumps({"reason": "rank 1 on worker2 exited with -9"}))
    lock = shared / "checkpoints" / "llama-tiny.lock"
    lock.parent.mkdir(parents=True)
    # As attempt 1's watch left it: the run keeps it between attempts.
    lock.write_text(json.dumps({"run_id": "r1", "run_dir": str(first), "time": time.time(), "handoff": False,
                                "hold": 300.0, "between": time.time()}))
    (collect / "attempts" / "1").mkdir(parents=True)
    (collect / "attempts" / "1" / "summary.json").write_text(json.dumps(ending))
    spares = tmp_path / "spares.json"
    now = time.time()
    spares.write_text(json.dumps({"spares": {"worker3": {"run_id": "r1", "since": now, "until": now + 3600},
                                             "worker4": {"run_id": "r0", "since": now, "until": now + 3600}}}))
    return {"shared": shared, "collect": collect, "lock": lock, "spares": spares,
            "quarantine": tmp_path / "quarantine.json"}


def play(tmp_path, paths, retry, started=1000.0):
    (tmp_path / "play.yml").write_text(PLAY % dict(
        retry=str(retry).lower(), tasks=ROOT / "playbooks" / "tasks" / "after_attempts.yml", started=started,
        **dict((k, str(v)) for k, v in paths.items())))
    return localplay.run_local(tmp_path / "play.yml")


def held_spares(paths):
    return sorted(json.loads(paths["spares"].read_text())["spares"])


def test_after_the_last_attempt_the_lock_and_the_spares_go(tmp_path):
    paths = setup(tmp_path, {"status": "success", "run_id": "r1", "hosts": {"worker1": [0], "worker3": [1]}})
    rc, out = play(tmp_path, paths, retry=False)
    assert rc == 0, out
    assert not paths["lock"].exists(), out
    assert held_spares(paths) == ["worker4"]  # another run's hold stays
    assert json.loads((paths["collect"] / "summary.json").read_text())["status"] == "success"


def test_after_a_failure_with_no_attempt_left_the_lock_and_the_spares_go_too(tmp_path):
    paths = setup(tmp_path, {"status": "failed", "run_id": "r1", "lost": ["worker2"], "last_step": 14,
                             "watch": {"status": "failed", "reason": "node worker2 stopped answering"}})
    # The next attempt cannot be placed: the quarantine file on the coordinator is damaged (named with its fix,
    # left as it is).
    paths["quarantine"].write_text("{not json")
    rc, out = play(tmp_path, paths, retry=True, started=time.time())
    assert rc != 0
    flat = " ".join(out.split())
    assert "%s is not a quarantine file (quarantine_file)" % paths["quarantine"] in flat, out
    assert "Fix: repair it" in flat and paths["quarantine"].read_text() == "{not json"
    assert not paths["lock"].exists(), out
    assert held_spares(paths) == ["worker4"]


def test_an_attempt_the_judge_does_not_retry_ends_the_run_without_an_error(tmp_path):
    """The run's timeout is spent: the judge says no, nothing is quarantined, the records on the coordinator are not
    touched, and no skipped task of the next attempt fails (not even an ignored one: 'item' is undefined)."""
    paths = setup(tmp_path, {"status": "failed", "run_id": "r1", "lost": ["worker2"], "last_step": 14,
                             "watch": {"status": "failed", "reason": "node worker2 stopped answering"}})
    rc, out = play(tmp_path, paths, retry=True, started=1000.0)
    assert rc == 0, out
    assert "ERROR" not in out and "is undefined" not in out and "ignored=0" in out, out
    assert "timeout of 3600s covers every attempt and is spent" in out
    assert not paths["quarantine"].exists() and held_spares(paths) == ["worker4"]
