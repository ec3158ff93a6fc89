# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: nccl_job
short_description: Check that the nodes of one job share an NCCL profile, and split their variables
version_added: "0.2.0"
description:
  - Takes the per-node results of P(multinode.deepspeed.nccl_profile#filter) for the nodes that run ranks together.
  - Fails, listing every node with its profile and why, when they differ; NCCL needs the same transport on every rank.
  - Returns the variables identical on every node (what DeepSpeed's launcher exports to every rank) and, per node,
    those that differ (kept in each node's C(/etc/nccl.conf)).
  - The C(nccl) role uses it (C(docs/roles/nccl.md)).
  - 'With no hosts it fails with V(no hosts to choose an NCCL profile for. Fix: put the rank nodes in the group
    ''workers''.)'
notes:
  - 'The error, for one node with active InfiniBand ports and one whose port is down, lists every node with its
    profile and why (V(gpu1) V(ib) - 4 active InfiniBand port(s); V(gpu2) V(tcp) - no active RDMA port), then says
    V(NCCL needs the same transport on every rank. Fix: set nccl_profile to one value for all of them in
    group_vars/workers (tcp works everywhere; ib/roce need active ports on every node\), or fix the ports of the nodes
    that differ.)'
options:
  _input:
    description: Host name to that host's C(nccl_profile) result.
    type: dict
    required: true
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: The job's NCCL settings
  ansible.builtin.set_fact:
    nccl_job_settings: "{{ dict(groups['workers'] | zip(groups['workers'] | map('extract', hostvars, 'nccl_node'))) | multinode.deepspeed.nccl_job }}"
  run_once: true
"""

RETURN = r"""
_value:
  description:
    - Keys C(profile), C(env) (the variables identical on every node - what DeepSpeed's launcher exports to every rank),
      C(node_local) (variable name to its value per host, for the variables that differ) and C(hosts) (sorted).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.nccl import NcclError, job_profile


def nccl_job(per_host):
    try:
        return job_profile(per_host or {})
    except NcclError as exc:
        raise AnsibleFilterError(str(exc))


class FilterModule(object):
    def filters(self):
        return {"nccl_job": nccl_job}
