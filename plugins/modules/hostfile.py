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
  - The C(benchmark) role calls it in check mode to lay out its slots. C(train.yml) does not call it -
    M(multinode.deepspeed.job_plan) validates the layout with the same code, and M(multinode.deepspeed.run_prepare)
    writes the file.
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
notes:
  - It fails, with a message that names the host and the fix, when a host has no slots in O(slots) and there is no
    O(default_slots); when slots are not a whole number, or are below 1 (slots given as a string of digits, as
    inventories often do, are accepted); when a host name is empty or contains characters that DeepSpeed's hostfile
    parser cannot take (spaces, C(=), C(#)); when a host appears twice (DeepSpeed rejects duplicates); when
    O(include) or O(exclude) names a host that is not in O(hosts); or when no host is left.
  - These checks matter because DeepSpeed itself only prints a warning when the hostfile is missing or unusable, and
    then runs every rank on the launching node.
  - The file is written through a temporary file and an atomic rename, and only when its content differs, so a
    second run with the same layout reports no change.
author:
  - multinode.deepspeed developers (@multinode)
extends_documentation_fragment:
  - multinode.deepspeed.attributes
  - multinode.deepspeed.attributes.dry_run
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
  description: Rank hosts in order, each C(name), C(slots) and C(first_rank) (its first global rank).
  returned: always
  type: list
  elements: dict
ranks:
  description:
    - Every global rank, each C(rank), C(host) and C(local_rank).
    - Global ranks follow the file's order, as in DeepSpeed - the first host gets ranks 0 to its slots - 1, and so on.
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
from ansible_collections.multinode.deepspeed.plugins.module_utils.common.hostfile import HostfileError, build, with_slots


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
