# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: slurm_node
short_description: What slurm.conf needs of one node, from its hostvars
version_added: "0.5.0"
description:
  - Slurm's name for the node (C(slurm_node_name), default the inventory name), its own hostname, the address the
    cluster reaches it at (C(cluster_hosts_address), else C(ansible_host)), CPUs, memory (MB) and GPUs
    (C(multinode_accelerators.count)).
  - The C(slurm) role uses it for C(slurm.conf) (C(docs/roles/slurm.md)).
positional: _input
options:
  _input:
    description: The node's hostvars (facts gathered).
    type: dict
    required: true
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: The workers as slurm.conf sees them
  ansible.builtin.debug:
    msg: "{{ groups['workers'] | map('extract', hostvars) | map('multinode.deepspeed.slurm_node') | list }}"
"""

RETURN = r"""
_value:
  description: C(name), C(hostname), C(addr), C(cpus), C(memtotal_mb), C(gpus).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import slurm_conf


def slurm_node(hostvars):
    try:
        return slurm_conf.node_from_hostvars(hostvars or {})
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError("slurm_node: %s: %s" % (type(exc).__name__, exc))


class FilterModule(object):
    def filters(self):
        return {"slurm_node": slurm_node}
