# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: preflight_bandwidth
short_description: Judge an all-reduce bandwidth test against a threshold per NCCL profile
version_added: "0.3.0"
description:
  - Computes, from the raw timings C(multinode_ds.allreduce_perf) writes, the algorithm bandwidth (bytes / time) and the
    bus bandwidth (algbw x 2(n-1)/n over n ranks, as nccl-tests' all_reduce_perf) of every message size, and compares the
    large-message bus bandwidth with a fraction of the link speed.
  - The fraction is per profile (C(ib), C(roce), C(tcp)) on NCCL and C(gloo) on CPU nodes.
  - One rank node passes without a threshold (the test does not cross the network); an unknown link speed warns.
  - The logic is in the collection's C(preflight) module_utils, unit-tested.
positional: _input, nodes, profile, backend, link_gbps, fractions
options:
  _input:
    description: The test - C(label), C(ok) (whether every node finished), C(error) (why not), C(raw) (the JSON).
    type: dict
    required: true
  nodes:
    description: Number of rank nodes.
    type: int
    required: true
  profile:
    description: The NCCL profile the test ran with.
    type: str
    required: true
  backend:
    description: C(nccl) or C(gloo).
    type: str
    required: true
  link_gbps:
    description: The slowest rank node's link speed in Gb/s (null when unknown).
    type: float
  fractions:
    description: Threshold fraction of the link speed per profile (overrides the defaults).
    type: dict
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Judge the test
  ansible.builtin.set_fact:
    judged: "{{ test | multinode.deepspeed.preflight_bandwidth(2, 'ib', 'nccl', 400.0, {'ib': 0.6}) }}"
"""

RETURN = r"""
_value:
  description:
    - Keys C(status) (pass, warn, fail), C(reason), C(rows) (size, time_us, algbw_gbps, busbw_gbps per size),
      C(busbw_gbps), C(threshold_gbps) (GB/s), C(link_gbps), C(fraction), C(key) (the profile, or C(gloo) on CPU
      nodes).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.bandwidth import judge_bandwidth
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.verdicts import PreflightError


def preflight_bandwidth(test, nodes, profile, backend, link_gbps=None, fractions=None):
    try:
        link = float(link_gbps) if link_gbps not in (None, "") else None
        return judge_bandwidth(test or {}, int(nodes), profile, backend, link, fractions or {})
    except (PreflightError, KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError("preflight_bandwidth: %s" % exc)


class FilterModule(object):
    def filters(self):
        return {"preflight_bandwidth": preflight_bandwidth}
