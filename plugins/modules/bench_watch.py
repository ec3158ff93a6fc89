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
  - C(benchmark.yml) runs it right after starting the driver, as C(benchmark_user).
extends_documentation_fragment:
  - multinode.deepspeed.progress
  - multinode.deepspeed.attributes
options:
  jid:
    description: The async job id of the driver's task.
    type: str
    required: true
  progress_file:
    description: The driver's progress file (C(<run_dir>/progress.json)).
    type: path
  timeout:
    description:
      - Seconds to wait at most (0 for no limit). After that it sends the driver TERM and fails with
        C(the benchmark did not finish within N s; it was stopped).
    type: int
    default: 0
  stop_pattern:
    description: The C(pkill -f) pattern that finds the driver; C(benchmark.yml) adds the run id.
    type: str
    default: "[m]ultinode_ds.bench run"
notes:
  - 'The progress line is the C(line) the driver writes into O(progress_file), read on the host, for example
    V([coord] phase parallel (running\): 5/8 samples, worker1 3/4, worker2 2/4, 14 s), or
    V([coord] starting the driver) before the file exists.'
  - On Ctrl-C (or a TERM to Ansible) it runs C(pkill -TERM -f <stop_pattern>) on the host. The driver then fails the
    run, records it and closes its SSH sessions to the workers, whose benchmark processes stop; the interrupt then
    ends the play.
  - It fails when the async job cannot be read.
attributes:
  check_mode:
    support: none
    description: Waits for a real job.
  diff_mode:
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
    benchmark running; C(docs/benchmark.md), "When a run fails").
  returned: when the job finished
  type: int
stdout:
  description: The driver's output (progress lines, the result line, the history).
  returned: when the job finished
  type: str
stderr:
  description: The driver's standard error.
  returned: when the job finished
  type: str
stdout_lines:
  description: RV(stdout) line by line.
  returned: when the job finished
  type: list
  elements: str
stderr_lines:
  description: RV(stderr) line by line.
  returned: when the job finished
  type: list
  elements: str
cmd:
  description: The driver's command.
  returned: when the job finished
  type: list
  elements: str
job_msg:
  description: The job's own error when the command could not run (for example a missing interpreter).
  returned: when the job failed that way
  type: str
elapsed:
  description: Seconds waited.
  returned: always
  type: float
"""
