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
  description: Keys C(profile), C(env) (shared variables), C(node_local) (variable to value per host) and C(hosts).
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
