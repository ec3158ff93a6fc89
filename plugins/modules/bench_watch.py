#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: bench_watch
short_description: Wait for the benchmark driver's async job and print its progress
version_added: "0.1.0"
description:
  - An action plugin that runs on the controller against the coordinator. It polls the driver's async job
    (started with C(async) and C(poll=0)) every O(poll_interval) seconds and prints the driver's progress file
    (phase, samples done per node, elapsed time) every O(progress_interval) seconds.
  - On Ctrl-C, or after O(timeout) seconds, it sends TERM to the driver, which closes its SSH sessions to the
    workers; the workers' benchmark processes stop when their session closes.
  - The task does not fail when the driver fails; it returns the driver's exit code and output so that the
    play can collect the run's logs first.
options:
  jid:
    description: The async job id of the driver's task.
    type: str
    required: true
  progress_file:
    description: The driver's progress file (C(<run_dir>/progress.json)).
    type: path
  timeout:
    description: Seconds to wait at most (0 for no limit).
    type: int
    default: 0
  poll_interval:
    description: Seconds between looks at the job.
    type: float
    default: 2
  progress_interval:
    description: Seconds between progress lines.
    type: float
    default: 10
  stop_pattern:
    description: The C(pkill -f) pattern that finds the driver.
    type: str
    default: "[m]ultinode_ds.bench run"
attributes:
  check_mode:
    support: none
    description: Waits for a real job.
  diff_mode:
    support: none
    description: Changes nothing.
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Start the benchmark
  ansible.builtin.command:
    argv: [/opt/multinode-deepspeed/venv/bin/python, -m, multinode_ds.bench, run, --config, /shared/bench/r1/config.json]
  async: 1900
  poll: 0
  register: bench_job

- name: Watch it
  multinode.deepspeed.bench_watch:
    jid: "{{ bench_job.ansible_job_id }}"
    progress_file: /shared/bench/r1/progress.json
    timeout: 1860
"""

RETURN = r"""
rc:
  description: The driver's exit code (0 success, 1 the run failed, 2 bad settings or the run id taken, 3 another
    benchmark running).
  returned: when the job finished
  type: int
stdout:
  description: The driver's output (progress lines, the result line, the history).
  returned: when the job finished
  type: str
job_msg:
  description: The job's own error when the command could not run (for example a missing interpreter).
  returned: when the job failed that way
  type: str
elapsed:
  description: Seconds waited.
  returned: always
  type: float
"""
