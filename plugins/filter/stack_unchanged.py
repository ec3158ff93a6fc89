# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: stack_unchanged
short_description: Whether a node is as role stack last left it, for the stack wanted now
version_added: "0.1.0"
description:
  - True when the node's venv fingerprint (every C(*.dist-info) name, the Python version and the trainer's version,
    from M(multinode.deepspeed.node_facts)) is the one role C(stack) recorded in C(stack_record_path) after its last
    run, and the recorded build, accelerator, pinned packages and CUDA settings are the ones wanted now.
  - Role C(stack) then skips pip, the import that reads the versions, and the ops check, and uses the recorded
    versions; any installed, removed or changed package, a new pin or new CUDA settings make it false.
positional: _input, wanted
options:
  _input:
    description: The node's C(multinode_node) fact from M(multinode.deepspeed.node_facts) with O(multinode.deepspeed.node_facts#module:record).
    type: dict
    required: true
  wanted:
    description: C(build), C(accelerator), C(packages) (the pins) and C(cuda_env) of the stack chosen for the node.
    type: dict
    required: true
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Skip pip when the node is unchanged
  ansible.builtin.set_fact:
    stack_unchanged: "{{ multinode_node | multinode.deepspeed.stack_unchanged({'build': 'cpu', 'accelerator': 'cpu',
                                                                               'packages': ['torch==2.13.0'], 'cuda_env': {}}) }}"
"""

RETURN = r"""
_value:
  description: Whether nothing changed since the last provisioning.
  type: bool
"""

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.node import stack_unchanged


class FilterModule(object):
    def filters(self):
        return {"stack_unchanged": stack_unchanged}
