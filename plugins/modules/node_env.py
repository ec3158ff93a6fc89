#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: node_env
short_description: Read the job variables that provisioning wrote on a node
version_added: "0.3.0"
description:
  - Reads C(KEY=VALUE) files that the roles write on every node - the job's NCCL variables
    (C(/etc/multinode-deepspeed/deepspeed_env), role C(nccl)) and the CUDA settings the ops were built with
    (C(/etc/multinode-deepspeed/stack.env), role C(stack)) - and returns them merged as the fact
    C(multinode_node_env), later files winning. Missing files are skipped. Reads only.
options:
  paths:
    description: The files, in order of precedence (later wins).
    type: list
    elements: path
    default: [/etc/multinode-deepspeed/deepspeed_env, /etc/multinode-deepspeed/stack.env]
attributes:
  check_mode:
    support: full
    description: Reads only.
  diff_mode:
    support: none
    description: Changes nothing.
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Read the job's NCCL and stack variables
  multinode.deepspeed.node_env:
"""

RETURN = r"""
ansible_facts:
  description: The fact C(multinode_node_env), variable name to value.
  returned: always
  type: dict
files:
  description: The files that were read.
  returned: always
  type: list
  elements: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.job import parse_env


def main():
    module = AnsibleModule(argument_spec=dict(
        paths=dict(type="list", elements="path",
                   default=["/etc/multinode-deepspeed/deepspeed_env", "/etc/multinode-deepspeed/stack.env"])),
        supports_check_mode=True)
    env, read = {}, []
    for path in module.params["paths"]:
        if not os.path.isfile(path):
            continue
        try:
            with open(path) as fh:
                env.update(parse_env(fh.read()))
        except (IOError, OSError) as exc:
            module.fail_json(msg="cannot read %s: %s" % (path, exc))
        read.append(path)
    module.exit_json(changed=False, files=read, ansible_facts={"multinode_node_env": env})


if __name__ == "__main__":
    main()
