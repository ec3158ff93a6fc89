#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: ds_ops
short_description: Have the DeepSpeed ops a job's config needs built on a rank node, with no stale build lock left
version_added: "0.5.0"
description:
  - Runs C(multinode_ds.ops_ready) (the node package, in the stack's venv) on the node it is given, with the ranks'
    environment (C(train.yml) gives the task C(job.env)), so that the ops are built exactly as the ranks would
    build them.
  - It first removes the stale build locks under O(extensions_dir) - torch's C(<op>/lock) that a build killed
    half-way left behind, which no process has open and in whose directory nothing changed for 30 s; every later
    load of that op would wait for it forever. It names each one it removes.
  - Then each op of O(ops) (C(job.ds_ops) of M(multinode.deepspeed.job_plan), from the config) is ready when its
    library is there with the stamp of the venv's DeepSpeed and torch, else loaded through DeepSpeed's own builder,
    which builds it (minutes on a CPU node, once) or finds it current. A build another process runs is waited for.
  - Fails, naming the node, the op and the fix, when an op does not exist for the node's accelerator, cannot be
    built there, or its build fails, and when the step runs past O(timeout) (it is stopped; the lock it leaves is
    stale for the next run's step).
options:
  ops:
    description: The ops, each C({builder, op, why}) (C(job.ds_ops)).
    type: list
    elements: dict
    required: true
  venv:
    description: The stack's venv on the node (C(job.venv)).
    type: path
    required: true
  extensions_dir:
    description: Torch's extensions directory on the node, C(TORCH_EXTENSIONS_DIR) of the ranks (C(job.torch_extensions_dir)).
    type: path
    required: true
  accelerator:
    description: The node's DeepSpeed accelerator (C(cpu), C(cuda)), for the fix in a message.
    type: str
  host:
    description: This node's inventory name, for the messages.
    type: str
  timeout:
    description: Seconds the step may take on this node.
    type: int
    default: 1800
extends_documentation_fragment:
  - multinode.deepspeed.attributes
attributes:
  check_mode:
    support: full
    description: In check mode nothing runs; the result lists the ops.
  diff_mode:
    description: Builds a cache; nothing to show.
seealso:
  - module: multinode.deepspeed.job_plan
  - module: multinode.deepspeed.ds_config_check
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Build the ops the job's config needs on a rank node
  multinode.deepspeed.ds_ops:
    ops: "{{ train_job.ds_ops }}"
    venv: "{{ train_job.venv }}"
    extensions_dir: "{{ train_job.torch_extensions_dir }}"
    accelerator: "{{ train_job.accelerator }}"
    host: worker1
  environment: "{{ train_job.env }}"
  delegate_to: worker1
"""

RETURN = r"""
lines:
  description: What the step did on the node, one line each (stale locks removed, ops built with their seconds,
    ops that were built already).
  returned: always
  type: list
  elements: str
report:
  description: C(multinode_ds.ops_ready)'s report (C(removed), C(held), C(ready), C(built), C(problems)).
  returned: when the step ran
  type: dict
"""

import json

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.dsops import call, ops_argv, ops_result


def main():
    module = AnsibleModule(argument_spec=dict(ops=dict(type="list", elements="dict", required=True),
                                              venv=dict(type="path", required=True),
                                              extensions_dir=dict(type="path", required=True),
                                              accelerator=dict(type="str"),
                                              host=dict(type="str"),
                                              timeout=dict(type="int", default=1800)),
                           supports_check_mode=True)
    p = module.params
    host = p["host"] or "this node"
    names = ", ".join(str(op.get("op")) for op in p["ops"])
    if module.check_mode:
        module.exit_json(changed=False, lines=["%s: would have %s built" % (host, names)])
    argv = ops_argv(p["venv"], p["extensions_dir"], p["ops"], max(10, p["timeout"] - 30))
    rc, out, err, timed_out = call(argv, timeout=p["timeout"])
    if rc is None or timed_out:
        why = err if rc is None else "it ran past %d s and was stopped (its build lock is removed by the next " \
            "run's step)" % p["timeout"]
        module.fail_json(msg="%s: the DeepSpeed ops step (%s) did not end: %s. Fix: build them while provisioning "
                             "(stack_ops in your inventory, then site.yml), or give it longer (-e ds_ops_timeout="
                             "<seconds>)" % (host, names, why), lines=[])
    lines, problems = ops_result(out, host, p["accelerator"], err)
    try:
        report = json.loads(out)
    except ValueError:
        report = {}
    if problems:
        module.fail_json(msg="; ".join(problems), lines=lines, report=report, stderr_tail=err[-2000:])
    module.exit_json(changed=bool(report.get("removed") or report.get("built")), lines=lines, report=report)


if __name__ == "__main__":
    main()
