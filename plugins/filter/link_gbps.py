# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: link_gbps
short_description: The link speed a node's NCCL profile uses, from its fabric facts
version_added: "0.3.0"
description:
  - For the RDMA profiles (C(ib), C(roce)), the sum of the rates of the ports NCCL uses (C(NCCL_IB_HCA)).
  - For C(tcp), the speed of NCCL's socket interface (the cluster interface) from sysfs.
  - Null when the facts do not tell (virtual interfaces often report no speed).
positional: _input, node
options:
  _input:
    description: The node's C(multinode_fabric) facts.
    type: dict
    required: true
  node:
    description: The node's profile as the P(multinode.deepspeed.nccl_profile#filter) filter returns it.
    type: dict
    required: true
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Record the link speed
  ansible.builtin.set_fact:
    preflight_link: "{{ multinode_fabric | multinode.deepspeed.link_gbps(nccl_node) }}"
"""

RETURN = r"""
_value:
  description: Gb/s, or null.
  type: float
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.bandwidth import node_link_gbps


def link_gbps(fabric, node):
    try:
        return node_link_gbps(fabric or {}, node or {})
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError("link_gbps: the input must be multinode_fabric facts and an nccl_profile result: %s" % exc)


class FilterModule(object):
    def filters(self):
        return {"link_gbps": link_gbps}
