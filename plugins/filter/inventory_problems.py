# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: inventory_problems
short_description: Everything wrong with the inventory's shape, each with its fix
version_added: "0.1.0"
description:
  - The checks every playbook makes first (C(validate_inventory.yml)), before anything on the nodes changes - exactly
    one host in C(coordinator); at least one in C(workers); the coordinator not a worker; no spare also a worker
    or the coordinator; and for every node of those groups a known C(nccl_profile) (V(auto), V(ib), V(roce),
    V(tcp)), a known C(shared_dir_provider) (V(preexisting), V(nfs)) and, with V(nfs), an C(nfs_server_host)
    that is the coordinator or a worker.
  - Every problem is one sentence that names the group or the host, the variable and the fix; all of them are
    reported at once.
positional: _input, hostvars
options:
  _input:
    description: The play's C(groups).
    type: dict
    required: true
  hostvars:
    description: The play's C(hostvars).
    type: dict
    required: true
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Stop on a wrong inventory
  ansible.builtin.fail:
    msg: "{{ inventory_problems | join(' ') }}"
  vars:
    inventory_problems: "{{ groups | multinode.deepspeed.inventory_problems(hostvars) }}"
  when: inventory_problems | length > 0
"""

RETURN = r"""
_value:
  description: The problems, as sentences; empty when the inventory is fine.
  type: list
  elements: str
"""

from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.inventory import inventory_problems


class FilterModule(object):
    def filters(self):
        return {"inventory_problems": inventory_problems}
