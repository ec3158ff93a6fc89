# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: preflight_retest
short_description: Whether the job's RDMA all-reduce test failed, so that a tcp test should run
version_added: "0.3.0"
description:
  - True when the job runs NCCL on an RDMA profile (C(ib), C(roce)) and the all-reduce test the C(preflight) role
    ran with it failed or fell under its bandwidth threshold; the role then runs the same test over tcp, and the
    report says whether the fabric is to blame (C(docs/preflight.md), "Fabric fallback advice"). False for gloo, tcp,
    a test that passed, and when a rank node has no result.
positional: _input, hostvars, link_gbps, fractions
options:
  _input:
    description: The job (M(multinode.deepspeed.job_plan)'s, with C(profile)).
    type: dict
    required: true
  hostvars:
    description: The C(hostvars) of the play (each rank node's C(preflight_bw) and C(preflight_node_link_gbps)).
    type: dict
    required: true
  link_gbps:
    description: C(preflight_link_gbps), the link speed to judge against (empty - the slowest rank node's link).
    type: float
  fractions:
    description: C(preflight_bandwidth_fraction), per profile.
    type: dict
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Run the tcp test too when the RDMA test failed
  ansible.builtin.include_tasks: bandwidth.yml
  when: preflight_job | multinode.deepspeed.preflight_retest(hostvars)
"""

RETURN = r"""
_value:
  description: Whether to run the tcp test.
  type: bool
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.bandwidth import retest_needed


def preflight_retest(job, hostvars, link_gbps=None, fractions=None):
    try:
        nodes = dict((h, hostvars[h]) for h in job["rank_hosts"])
        return retest_needed(job, nodes, link_gbps, fractions)
    except (KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError("preflight_retest: %s" % exc)


class FilterModule(object):
    def filters(self):
        return {"preflight_retest": preflight_retest}
