#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ds_config_check
short_description: Check a user's DeepSpeed config with DeepSpeed's own config class, on a node of the job
version_added: "0.4.0"
description:
  - Runs C(multinode_ds.ds_check) (the node package, in the stack's venv) on the node it is given - C(train.yml) gives
    it the job's master, a rank node with the workers' accelerator - with the config on standard input. It builds
    C(deepspeed.runtime.config.DeepSpeedConfig) at the job's world size, then checks what DeepSpeed only finds once
    its engine starts (fp16 or bf16 on an accelerator without them, offload devices, optimizer and scheduler names,
    keys DeepSpeed does not read).
  - 'Fails, before anything on the nodes changes, with one line per problem naming the key, the values and the fix,
    for example V(ds_config: train_batch_size 32 ≠ micro batch 4 × accumulation 2 × world 2 — set train_batch_size
    to 16, or remove it and DeepSpeed derives it).'
  - For the bundled trainer (C(--bundled) in O(argv)) it checks the config as the trainer has it, merged over the
    batch sizes the trainer gives. With C(--op) in O(argv) (C(job.ds_ops), the ops the config makes DeepSpeed
    load), it checks that the node's accelerator has each of them (DeepSpeed's own builder).
  - Writes nothing; the config never reaches a file or a command line on the node.
options:
  argv:
    description: The check's argv, C(job.ds_check) of M(multinode.deepspeed.job_plan).
    type: list
    elements: str
    required: true
  config:
    description: The config's JSON text (C(job.ds_config.text)).
    type: str
    required: true
  source:
    description: Where the user gave it (the controller's path), for the message.
    type: str
  host:
    description: This node's inventory name, for the message.
    type: str
  timeout:
    description:
      - Seconds the check may take (it imports torch and DeepSpeed, a few seconds). Past them it is stopped and the
        module fails, naming the node.
    type: int
    default: 120
extends_documentation_fragment:
  - multinode.deepspeed.attributes
attributes:
  check_mode:
    support: full
    description: Checks; nothing changes in either mode.
  diff_mode:
    description: Nothing changes.
seealso:
  - module: multinode.deepspeed.job_plan
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Check the user's DeepSpeed config on the job's master
  multinode.deepspeed.ds_config_check:
    argv: "{{ train_job.ds_check }}"
    config: "{{ train_job.ds_config.text }}"
    source: "{{ train_job.ds_config.source }}"
    host: "{{ train_job.master }}"
  delegate_to: "{{ train_job.master }}"
"""

RETURN = r"""
problems:
  description: Each problem as C(message — fix) (empty when the config is usable).
  returned: always
  type: list
  elements: str
derived:
  description: The batch sizes DeepSpeed derives at the job's world size (C(train_batch_size),
    C(train_micro_batch_size_per_gpu), C(gradient_accumulation_steps)).
  returned: when the config is usable
  type: dict
accelerator:
  description: The accelerator DeepSpeed checked against (C(cpu), C(cuda)).
  returned: always
  type: str
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.dsconfig import check_result
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.dsops import call


def main():
    module = AnsibleModule(argument_spec=dict(argv=dict(type="list", elements="str", required=True),
                                              config=dict(type="str", required=True),
                                              source=dict(type="str"),
                                              host=dict(type="str"),
                                              timeout=dict(type="int", default=120)),
                           supports_check_mode=True)
    params = module.params
    rc, out, err, timed_out = call(params["argv"], data=params["config"], timeout=params["timeout"])
    problems = check_result(out)
    try:
        report = json.loads(out)
    except ValueError:
        report = {}
    if timed_out:
        problems = ["the check ran past %d s and was stopped. Fix: look at the node's load and its venv (python -m "
                    "multinode_ds.ds_check --help), or give it longer (-e ds_config_check_timeout=<seconds>)"
                    % params["timeout"]]
    elif rc not in (0, 1) and not report:
        lines = [x for x in (err or "").splitlines() if x.strip()]
        problems = ["the check did not run (%s): %s" % ("exit code %d" % rc if rc is not None else "no start",
                                                        lines[-1] if lines else "no output")]
        if "unrecognized arguments" in (err or ""):
            problems[0] += ". Fix: run site.yml (the node package there is older than the collection)"
    result = {"changed": False, "problems": problems, "accelerator": report.get("accelerator"),
              "derived": report.get("derived") or {}}
    if problems:
        where = " on %s" % params["host"] if params.get("host") else ""
        module.fail_json(msg="ds_config=%s, checked by DeepSpeed's DeepSpeedConfig%s at the job's world size: %s" % (
            params.get("source") or "(the job's)", where, "; ".join(problems)), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
