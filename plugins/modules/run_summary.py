#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: run_summary
short_description: Summarize a collected training run into summary.json
version_added: "0.1.0"
description:
  - Reads the per-rank metrics (C(metrics/rank*.jsonl)) of a run directory that was collected to the controller,
    and writes C(summary.json) there with the world size, the hosts and their ranks, the steps,
    the first and last loss, the wall time and the exit status.
  - A run counts as successful only when the launcher exited 0 and every rank wrote its final record;
    DeepSpeed's launcher can exit 0 although ranks died.
  - Normally run on the controller, with C(delegate_to) set to C(localhost).
options:
  run_dir:
    description: The collected run directory.
    type: path
    required: true
  run_id:
    description: The run's id.
    type: str
    required: true
  world_size:
    description: The world size the hostfile promised.
    type: int
  launcher_rc:
    description: The launcher's exit code.
    type: int
  wall_time:
    description: Seconds from launch to the end of the run.
    type: float
  coordinator:
    description: The coordinator's host name; a rank there is reported as a problem.
    type: str
  extra:
    description: More facts to keep in the summary (model, backend, hostfile path, ...).
    type: dict
    default: {}
author:
  - multinode.deepspeed developers (@multinode)
attributes:
  check_mode:
    support: full
    description: Computes the result and reports C(changed) without writing anything.
  diff_mode:
    support: none
    description: Shows no diff.
"""

EXAMPLES = r"""
- name: Summarize the collected run
  multinode.deepspeed.run_summary:
    run_dir: "runs/{{ run_id }}"
    run_id: "{{ run_id }}"
    world_size: 2
    launcher_rc: 0
  delegate_to: localhost
"""

RETURN = r"""
summary:
  description: The summary written to C(summary.json).
  returned: always
  type: dict
  contains:
    status:
      description: C(success) or C(failed).
      type: str
    problems:
      description: Why the run counts as failed.
      type: list
      elements: str
    world_size:
      description: Ranks that took part.
      type: int
    hosts:
      description: Host name to the list of its global ranks.
      type: dict
    first_loss:
      description: Loss at the first step.
      type: float
    last_loss:
      description: Loss at the last step.
      type: float
path:
  description: Path of C(summary.json).
  returned: always
  type: str
"""

import glob
import json
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.summary import read_jsonl, summarize


def main():
    module = AnsibleModule(
        argument_spec=dict(
            run_dir=dict(type="path", required=True),
            run_id=dict(type="str", required=True),
            world_size=dict(type="int"),
            launcher_rc=dict(type="int"),
            wall_time=dict(type="float"),
            coordinator=dict(type="str"),
            extra=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    p = module.params
    run_dir = p["run_dir"]
    records = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "metrics", "rank*.jsonl"))):
        m = re.search(r"rank(\d+)\.jsonl$", path)
        with open(path) as fh:
            records[int(m.group(1))] = read_jsonl(fh.read())
    launcher_log = ""
    log_path = os.path.join(run_dir, "launcher.log")
    if os.path.exists(log_path):
        with open(log_path, errors="replace") as fh:
            launcher_log = fh.read()
    summary = summarize(p["run_id"], records, expected_world_size=p["world_size"], launcher_rc=p["launcher_rc"],
                        wall_time=p["wall_time"], coordinator=p["coordinator"], launcher_log=launcher_log)
    summary.update(p["extra"])
    out = os.path.join(run_dir, "summary.json")
    text = json.dumps(summary, indent=2, sort_keys=True) + "\n"
    changed = not os.path.exists(out) or open(out).read() != text
    if changed and not module.check_mode:
        with open(out, "w") as fh:
            fh.write(text)
    module.exit_json(changed=changed, summary=summary, path=out)


if __name__ == "__main__":
    main()
