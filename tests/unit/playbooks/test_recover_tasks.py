"""playbooks/tasks/next_attempt.yml (which includes recover.yml) when the run needs no next attempt (train_retry
false: the attempt before ended well): every task is skipped, none fails, not even an ignored one (issue 44: 'item'
is undefined printed as an [ERROR] by every run with restarts)."""
from pathlib import Path

import localplay

ROOT = Path(__file__).resolve().parents[3]
PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  vars:
    train_retry: false
    train_attempt: 2
    train_collect_dir: /nonexistent
    train_job: {run_id: r1, restarts: 1, recover_wait: 0, rank_hosts: [], launch: {ssh_agents: [], steps: {}}}
  tasks:
    - name: The next attempt's tasks
      ansible.builtin.include_tasks: %s
""" % (ROOT / "playbooks" / "tasks" / "next_attempt.yml")


def test_a_run_that_needs_no_next_attempt_skips_every_task_without_an_error(tmp_path):
    (tmp_path / "play.yml").write_text(PLAY)
    rc, out = localplay.run_local(tmp_path / "play.yml", timeout=120)
    assert rc == 0, out
    assert "is undefined" not in out and "ERROR" not in out, out
    assert "failed=0" in out and "ignored=0" in out, out
