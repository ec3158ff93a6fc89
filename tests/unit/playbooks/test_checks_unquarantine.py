"""playbooks/tasks/checks.yml lets the nodes of -e unquarantine= out of the quarantine and spares records on the
coordinator, after the plan checked the names (issue 44, point 12): run on localhost (controller and coordinator at
once) with the real modules."""
import json
import os
import time
from pathlib import Path

import localplay

ROOT = Path(__file__).resolve().parents[3]
PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  vars:
    run_user: %(user)s
    train_preflight_on: false
    train_job: {run_id: r2, unquarantine: %(names)s, coordinators: [localhost], master: localhost, ds_check: null,
                ds_ops: [], env: {}, launch: {steps: {}, start: true, secret_hosts: []}}
    train_plan:
      records: {quarantine_file: %(quarantine)s, spares_file: %(spares)s}
  tasks:
    - name: The checks
      ansible.builtin.include_tasks: %(tasks)s
"""


def play(tmp_path, names, quarantine, spares):
    (tmp_path / "play.yml").write_text(PLAY % dict(
        user=os.environ.get("USER") or "root", names=json.dumps(names), quarantine=quarantine, spares=spares,
        tasks=ROOT / "playbooks" / "tasks" / "checks.yml"))
    return localplay.run_local(tmp_path / "play.yml", "-e", "ansible_become=false")


def test_unquarantine_lets_the_nodes_out_in_the_records_on_the_coordinator(tmp_path):
    records = tmp_path / "shared" / "runs" / ".records"
    records.mkdir(parents=True)
    quarantine, spares = records / "quarantine.json", records / "spares.json"
    quarantine.write_text(json.dumps({"nodes": {n: {"since": 0, "reason": "lost twice", "run_id": "r0"}
                                                for n in ("worker1", "worker2")}}))
    now = time.time()
    spares.write_text(json.dumps({"spares": {"worker3": {"run_id": "r0", "since": now, "until": now + 3600}}}))
    rc, out = play(tmp_path, ["worker2", "worker3"], quarantine, spares)
    assert rc == 0, out
    assert list(json.loads(quarantine.read_text())["nodes"]) == ["worker1"]
    assert json.loads(spares.read_text())["spares"] == {}
