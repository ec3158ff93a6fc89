# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: cluster_hosts
short_description: The /etc/hosts lines that give every node of the cluster its inventory name
version_added: "0.3.0"
description:
  - Takes the inventory names of the cluster's nodes and C(hostvars); returns one C(<address> <name> [alias ...])
    line per node.
  - The address of a node is C(cluster_hosts_address), else the address its fabric facts resolved
    (C(multinode_fabric.cluster_address)), else C(ansible_host), else its name; when that is not an IP, its default
    IPv4 from its facts. Aliases come from C(cluster_hosts_aliases).
  - Fails, naming the host, the variable and the fix, when a node has no IP address, when a name cannot stand in
    C(/etc/hosts), or when one name would point at two addresses.
  - The C(cluster_hosts) role uses it (C(docs/roles/cluster_hosts.md)).
positional: _input, hostvars
options:
  _input:
    description: The inventory names of the nodes, in the order of the block.
    type: list
    elements: str
    required: true
  hostvars:
    description: The play's C(hostvars) (or any mapping of host name to its variables).
    type: dict
    required: true
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: The cluster's names
  ansible.builtin.set_fact:
    cluster_hosts_lines: "{{ (groups['coordinator'] + groups['workers']) | multinode.deepspeed.cluster_hosts(hostvars) }}"
"""

RETURN = r"""
_value:
  description: The lines of the managed block, in the order of the input.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.cluster_hosts import (
    ClusterHostsError, hosts_lines, node_from_vars)


def cluster_hosts(names, hostvars):
    try:
        return hosts_lines([node_from_vars(name, hostvars[name]) for name in names or []])
    except ClusterHostsError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule(object):
    def filters(self):
        return {"cluster_hosts": cluster_hosts}
