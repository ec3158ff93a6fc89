#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: slurm_facts
short_description: Read a cluster's Slurm from a node that can reach it (sinfo, scontrol ping), and judge a partition
version_added: "0.5.0"
description:
  - Runs C(sinfo --version), C(scontrol ping) and C(sinfo -h -N -o '%N|%P|%T|%E') and returns them read back.
  - With O(partition) and O(nodes), judges whether the partition holds every one of the nodes, idle
    (one verdict per node, as preflight writes them), waiting up to O(wait) seconds for nodes that are not idle
    yet (slurmd registering after a restart).
  - A node the partition holds, idle, passes; a busy one warns (the exclusive job waits); one that is DOWN, DRAINED,
    not responding or missing fails, with the fix.
  - With O(fail=true), fails when a verdict fails, naming the node, its state, the variable and the fix.
  - Changes nothing; runs in check mode.
  - The C(slurm) role ends with it, C(slurm_provider=existing) is nothing but it, and preflight's slurm checks use it
    (C(docs/roles/slurm.md)).
options:
  partition:
    description: The partition to judge.
    type: str
  nodes:
    description: Slurm's names of the nodes the partition must hold, idle.
    type: list
    elements: str
    default: []
  wait:
    description: Seconds to wait for the nodes to be idle.
    type: int
    default: 0
  fail:
    description: Fail when a verdict fails.
    type: bool
    default: false
  controller:
    description: The name the verdicts give the node this runs on (the coordinator) when they are about Slurm itself.
    type: str
    default: the coordinator
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: The partition has the workers, idle
  multinode.deepspeed.slurm_facts:
    partition: gpu
    nodes: "{{ groups['workers'] }}"
    wait: 60
    fail: true
"""

RETURN = r"""
version:
  description: Slurm's version (C(sinfo --version)), or null when the command is missing.
  returned: always
  type: str
controller:
  description: C(scontrol ping)'s line, or its error.
  returned: always
  type: str
nodes:
  description: sinfo's rows, each C(node), C(partition), C(default), C(state), C(raw_state), C(reason).
  returned: always
  type: list
  elements: dict
verdicts:
  description: One per node of O(nodes) (C(check), C(host), C(status) pass, warn or fail, C(detail), C(fix)).
  returned: always
  type: list
  elements: dict
message:
  description: The failed verdicts in one sentence each, or an empty string.
  returned: always
  type: str
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight import slurm


def read(module):
    version = None
    rc, out, err = module.run_command(["sinfo", "--version"])
    if rc == 0:
        version = out.strip().split()[-1] if out.strip() else None
    rc, ping, perr = module.run_command(["scontrol", "ping"])
    ping = (ping or perr or "").strip()
    rc2, out, err = module.run_command(["sinfo", "-h", "-N", "-o", "%N|%P|%T|%E"])
    return version, ping, slurm.parse_sinfo(out if rc2 == 0 else ""), (err or "").strip() if rc2 else ""


def main():
    module = AnsibleModule(argument_spec=dict(partition=dict(type="str"),
                                              nodes=dict(type="list", elements="str", default=[]),
                                              wait=dict(type="int", default=0),
                                              fail=dict(type="bool", default=False),
                                              controller=dict(type="str", default="the coordinator")),
                           supports_check_mode=True)
    p = module.params
    if module.get_bin_path("sinfo") is None:
        module.fail_json(msg="sinfo is not installed on this node, so it cannot reach Slurm. Fix: install "
                             "slurm-client here (site.yml -e slurm=true), or run from a node that has it")
    deadline = time.time() + max(0, p["wait"])
    host = p["controller"]
    while True:
        version, ping, rows, error = read(module)
        verdicts = []
        if p["partition"]:
            verdicts = slurm.partition_verdicts(rows, p["partition"], p["nodes"], host)
            if error:
                for v in verdicts:
                    v["detail"] += " (sinfo: %s)" % error
        pending = [v for v in verdicts if v["status"] != "pass"]
        if not pending or time.time() >= deadline:
            break
        time.sleep(2)
    failed = [v for v in verdicts if v["status"] == "fail"]
    message = "; ".join("%s: %s. Fix: %s" % (v["host"], v["detail"], v["fix"]) for v in failed)
    result = dict(changed=False, version=version, controller=ping, nodes=rows, verdicts=verdicts, message=message)
    if p["fail"] and failed:
        module.fail_json(msg="Slurm is not ready (partition %s): %s" % (p["partition"], message), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
