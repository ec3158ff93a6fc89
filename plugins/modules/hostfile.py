#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: hostfile
short_description: Write a validated DeepSpeed hostfile and return the rank layout
version_added: "0.1.0"
description:
  - Validates the rank hosts and their slots, writes a DeepSpeed hostfile (C(host slots=N) lines) to O(path),
    and returns the world size, the ranks per host and the master host.
  - Fails with a message naming the host and the fix on duplicates, zero or non-numeric slots, or when
    no rank host is left; DeepSpeed itself would silently fall back to one local node.
  - The layout logic lives in the collection's C(hostfile) module_utils and is unit-tested.
options:
  path:
    description: Where to write the hostfile (normally the run's directory on shared storage).
    type: path
    required: true
  hosts:
    description: Candidate rank hosts in rank order, by the names the launching node resolves.
    type: list
    elements: str
    required: true
  slots:
    description:
      - Processes (ranks) per host, by host name.
      - A host missing here gets O(default_slots); without it, the module fails naming the host.
    type: dict
    default: {}
  default_slots:
    description: Slots of a host that O(slots) does not name.
    type: int
  include:
    description: Only these hosts become ranks.
    type: list
    elements: str
  exclude:
    description: These hosts do not become ranks.
    type: list
    elements: str
    default: []
  mode:
    description: File mode of the hostfile.
    type: str
    default: "0644"
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
- name: Hostfile from the workers group, one rank per GPU
  multinode.deepspeed.hostfile:
    path: /shared/runs/run1/hostfile
    hosts: "{{ groups['workers'] }}"
    slots: "{{ dict(groups['workers'] | zip(groups['workers'] | map('extract', hostvars, 'gpu_count'))) }}"
  register: layout

- name: Two hosts, one of them left out
  multinode.deepspeed.hostfile:
    path: /shared/runs/run2/hostfile
    hosts: [worker1, worker2]
    default_slots: 1
    exclude: [worker2]
"""

RETURN = r"""
path:
  description: The hostfile's path.
  returned: always
  type: str
content:
  description: The hostfile's text.
  returned: always
  type: str
  sample: "worker1 slots=1\nworker2 slots=1\n"
world_size:
  description: Total number of ranks.
  returned: always
  type: int
  sample: 2
hosts:
  description: Rank hosts in order, with their slots and first global rank.
  returned: always
  type: list
  elements: dict
ranks:
  description: Every global rank with its host and local rank.
  returned: always
  type: list
  elements: dict
master:
  description: The first rank host (global rank 0 runs there).
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.hostfile import HostfileError, build, with_slots


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            hosts=dict(type="list", elements="str", required=True),
            slots=dict(type="dict", default={}),
            default_slots=dict(type="int"),
            include=dict(type="list", elements="str"),
            exclude=dict(type="list", elements="str", default=[]),
            mode=dict(type="str", default="0644"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    try:
        layout = build(with_slots(p["hosts"], p["slots"], p["default_slots"]),
                       exclude=p["exclude"], include=p["include"])
    except HostfileError as exc:
        module.fail_json(msg=str(exc))
    path = p["path"]
    current = None
    if os.path.exists(path):
        with open(path) as fh:
            current = fh.read()
    changed = current != layout["text"]
    if changed and not module.check_mode:
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(layout["text"])
        os.replace(tmp, path)
    if not module.check_mode:
        file_args = module.load_file_common_arguments(dict(path=path, mode=p["mode"]))
        changed = module.set_fs_attributes_if_different(file_args, changed)
    module.exit_json(changed=changed, path=path, content=layout["text"], world_size=layout["world_size"],
                     hosts=layout["hosts"], ranks=layout["ranks"], master=layout["master"])


if __name__ == "__main__":
    main()
