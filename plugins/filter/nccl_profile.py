# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: nccl_profile
short_description: Choose a node's NCCL profile (ib, roce or tcp) from its fabric facts
version_added: "0.2.0"
description:
  - Picks C(ib) when the node has active InfiniBand ports (C(NCCL_IB_HCA) lists them with an exact match),
    C(roce) when it has active Ethernet-link-layer RDMA ports with a RoCE v2 GID (C(NCCL_IB_GID_INDEX) is that GID's
    index), and C(tcp) otherwise (C(NCCL_IB_DISABLE=1), C(NCCL_SOCKET_IFNAME) is the cluster interface).
  - Warns when RDMA hardware is present but not usable, the case that ends in C(Call to ibv_modify_qp failed).
  - Fails with a message naming the host, the variable and the fix for an unknown profile, when a requested profile
    cannot work on the node, or when the cluster interface is unknown and O(socket_ifname) is not given.
  - The logic lives in the collection's C(nccl) module_utils and is unit-tested over fixtures of real sysfs trees.
  - The C(nccl) role uses it; the profiles and the variables each one writes are in C(docs/roles/nccl.md).
positional: _input, host, requested, socket_ifname, env
options:
  _input:
    description: The node's C(multinode_fabric) facts (from M(multinode.deepspeed.fabric_facts)).
    type: dict
    required: true
  host:
    description: The node's inventory name, for messages.
    type: str
    required: true
  requested:
    description: The profile the inventory asks for (C(nccl_profile)).
    type: str
    default: auto
    choices: [auto, ib, roce, tcp]
  socket_ifname:
    description: Interface for NCCL's and gloo's sockets; default the interface carrying the node's inventory address.
    type: str
  env:
    description: Variables set over the chosen ones (C(nccl_env)); an empty value removes a variable.
    type: dict
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Choose the node's NCCL settings
  ansible.builtin.set_fact:
    nccl_node: "{{ multinode_fabric | multinode.deepspeed.nccl_profile(inventory_hostname, nccl_profile) }}"
"""

RETURN = r"""
_value:
  description:
    - Keys C(profile), C(requested), C(reason) (for example V(4 active InfiniBand port(s\))), C(env) (variable to
      value), C(warnings) (a list, for example RDMA hardware present but not used), C(rdma_ports) (the ports NCCL
      will use) and C(memlock_unlimited) (true for the RDMA profiles).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.nccl import NcclError, node_profile


def nccl_profile(fabric, host, requested="auto", socket_ifname=None, env=None):
    try:
        return node_profile(fabric or {}, host=host, requested=requested, socket_ifname=socket_ifname, env=env)
    except NcclError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule(object):
    def filters(self):
        return {"nccl_profile": nccl_profile}
