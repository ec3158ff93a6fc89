#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: preflight_cache
short_description: Decide whether a passing preflight stands for a job
version_added: "0.3.0"
description:
  - An action plugin; runs on the controller and reads one file of its cache.
  - Hashes what a preflight checks - the job's layout (rank nodes and slots, master, port, backend, accelerator,
    the ranks' environment but for the run's own id), every node's inventory address and addresses, every node's
    stack fingerprint (M(multinode.deepspeed.node_facts)), and the preflight's settings - and looks for a
    passing preflight recorded under that hash (by M(multinode.deepspeed.preflight_report), given RV(cache_path)).
  - The preflight stands (C(reuse)) when one is found that is at most O(max_age) seconds old; anything else -
    another layout, a changed package, a moved node, an older record, O(force) - says why it must run again.
  - A failed preflight removes the record, so the next launch checks again.
options:
  job:
    description: The job, as M(multinode.deepspeed.job_plan) returns it.
    type: dict
    required: true
  settings:
    description: The preflight's thresholds (a change runs it again).
    type: dict
    default: {}
  max_age:
    description: Seconds a passing preflight stands. C(0) never reuses one.
    type: int
    default: 3600
  force:
    description: Run the preflight again whatever is recorded (C(-e preflight=force)).
    type: bool
    default: false
  cache_dir:
    description: The controller's directory of recorded preflights.
    type: path
    default: ~/.cache/multinode-deepspeed/preflight
attributes:
  action:
    support: full
    description: Runs on the controller.
  check_mode:
    support: full
    description: Reads only.
  diff_mode:
    support: none
    description: Changes nothing.
seealso:
  - module: multinode.deepspeed.preflight_report
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Does a passing preflight stand for this job?
  multinode.deepspeed.preflight_cache:
    job: "{{ train_job }}"
    max_age: "{{ preflight_max_age | default(3600) }}"
    force: "{{ preflight | default(true) == 'force' }}"
  register: preflight_reuse
"""

RETURN = r"""
reuse:
  description: Whether the recorded preflight stands (skip the checks).
  returned: always
  type: bool
reason:
  description: Why it stands, or why the preflight runs again.
  returned: always
  type: str
  sample: a passing preflight of 312 s ago (20261123-101500-llama-tiny) checked this job layout, stack and addresses
key:
  description: The hash of what the preflight checks.
  returned: always
  type: str
cache_path:
  description: The record's file on the controller (give it to M(multinode.deepspeed.preflight_report)).
  returned: always
  type: str
record:
  description: The recorded preflight (run id, time, status, report path), when it stands.
  returned: always
  type: dict
"""
