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
  - Hashes what a preflight checks - the job's layout (rank nodes and slots, master, master address and port,
    backend and its options, accelerator, shared and stack directories, the ranks' environment but for the run's own
    id and directory), per node (the coordinator and the rank nodes) the inventory address, the IPv4 addresses, the
    stack fingerprint (M(multinode.deepspeed.node_facts)), the GPU count and C(cluster_hosts_file), and the
    preflight's settings that are set - and looks for a passing preflight recorded under that hash (by
    M(multinode.deepspeed.preflight_report), given RV(cache_path)), in C(<cache_dir>/<hash>.json). A new run id,
    model or step count keeps the hash.
  - The preflight stands (C(reuse)) when one is found that is at most O(max_age) seconds old; anything else -
    another layout, a changed package, a moved node, an older record, O(force) - says why it must run again.
  - "Prints that verdict as the task runs - C(Preflight reused: <reason>) or C(Preflight runs: <reason>)."
  - A failed preflight removes the record, so the next launch checks again.
  - The C(preflight) role runs it first (C(tasks/decide.yml)). It reads one file and writes nothing.
extends_documentation_fragment:
  - multinode.deepspeed.job
  - multinode.deepspeed.attributes
  - multinode.deepspeed.attributes.read_only
options:
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
  diff_mode:
    description: Changes nothing.
notes:
  - 'It fails, before anything runs, when O(max_age) is not whole seconds (V(preflight_max_age=... must be whole
    seconds (0: never reuse\). Fix: -e preflight_max_age=3600)) or a setting is out of range
    (V(Bad preflight setting (inventory or -e\): ...), one part per variable).'
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
  description:
    - The recorded preflight (C(status), C(time), C(report), C(run_id), C(warnings), C(bandwidth), C(key)) when it
      stands, else null.
  returned: always
  type: dict
result:
  description:
    - The run's record of the preflight when it stands - RV(record) with C(reused=true) and C(reason) - else null
      (the checks that run make it).
  returned: always
  type: dict
"""
