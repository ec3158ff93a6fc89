#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: preflight_report
short_description: Judge what preflight gathered and write preflight.json and preflight.txt
version_added: "0.3.0"
description:
  - Turns the facts C(playbooks/preflight.yml) gathers from every node of a job (stack versions, the
    M(multinode.deepspeed.node_probe) results, the SSH matrix, the master-port test, GPU counts, link
    speeds, the all-reduce test) into one verdict per check and node - pass, warn, fail or skip - with the
    fix for every failure, the tables a person reads, the bandwidth judgement and, when an RDMA profile fails
    and TCP works, the variable to pin.
  - The decisions are in the pure module_utils C(preflight) (unit-tested); this module only reads its input
    and writes the files.
  - Runs on the controller (C(delegate_to=localhost)). It does not fail on a failed preflight; the C(preflight) role
    prints RV(text) first and then fails with RV(message).
options:
  data:
    description:
      - What the nodes reported; keys C(job), C(versions), C(probes), C(ssh), C(port), C(gpus),
        C(expected_addresses), C(own_addresses), C(link_gbps), C(tcp_link_gbps), C(bandwidth).
      - C(job) holds the plan's C(launch), what the job's backend described - its C(ssh_pairs) are the SSH logins
        checked, its C(ranks_over_ssh) says whether the ranks' memlock limit is the one of an SSH login.
      - Leave it out and give O(job) to have the action plugin gather it.
    type: dict
  settings:
    description:
      - Bounds and thresholds; keys C(max_clock_skew), C(min_free_gib_shared), C(min_free_gib_local),
        C(min_memlock_kib), C(bandwidth_fraction) (per profile - ib, roce, tcp, gloo), C(link_gbps).
      - Unset keys take the defaults of module_utils C(preflight).
    type: dict
    default: {}
  dest:
    description: Directory to write C(preflight.json) and C(preflight.txt) into (created). Nothing is written when unset.
    type: path
  job:
    description:
      - Instead of O(data) - the job (M(multinode.deepspeed.job_plan)'s, with C(profile)); the action plugin gathers
        the data from what the C(preflight) role left in every node's variables.
    type: dict
  cache_path:
    description:
      - The record of M(multinode.deepspeed.preflight_cache) - written when the preflight passes (a later launch
        of the same job reuses it), removed when it fails.
    type: path
  key:
    description: The hash M(multinode.deepspeed.preflight_cache) returned (stored in the record).
    type: str
notes:
  - With O(job), the action plugin gathers O(data) from each job node's variables (C(multinode_node),
    C(multinode_accelerators), C(multinode_fabric), C(cluster_hosts_file), C(preflight_probe), the link speeds and
    C(preflight_bw); C(gather) in C(plugins/module_utils/preflight/evaluate.py)). The all-reduce result is read from
    the last C(ALLREDUCE_RESULT {json}) line of the master's test output. A node that did not answer gets the version
    error C(the node did not answer).
author:
  - multinode.deepspeed developers (@multinode)
extends_documentation_fragment:
  - multinode.deepspeed.attributes
attributes:
  action:
    support: full
    description: The action plugin gathers O(data) from the nodes' variables when O(job) is given.
  check_mode:
    support: full
    description: Judges in check mode too; writes no file.
"""

EXAMPLES = r"""
- name: Judge the preflight
  multinode.deepspeed.preflight_report:
    data: "{{ preflight_data }}"
    settings:
      max_clock_skew: 1
      bandwidth_fraction: {tcp: 0.5}
    dest: "{{ playbook_dir }}/../runs/preflight-20261122-190000"
  delegate_to: localhost
  register: preflight
"""

RETURN = r"""
outcome:
  description:
    - The preflight in short - C(status), C(time), C(report) (the path), C(run_id), C(warnings), and C(bandwidth)
      (C(label), C(status), C(busbw_gbps), C(threshold_gbps), C(link_gbps) of the job's test); what a run's summary
      keeps. The record at O(cache_path) is C(outcome) plus O(key).
  returned: always
  type: dict
message:
  description:
    - 'When the preflight failed, what to say - V(Preflight failed (<n> problem(s\)\); nothing was launched:), then one
      line per problem C(- <check> on <host>: <detail>. Fix: <fix>.), C(Advice: <the fabric advice>) when there is
      one, and C(Report: <path of preflight.json>). Null on a pass.'
  returned: always
  type: str
status:
  description: C(pass), or C(fail) when any verdict failed.
  returned: always
  type: str
verdicts:
  description: Every verdict - check, host, status, detail, fix.
  returned: always
  type: list
  elements: dict
findings:
  description: One line per failure, naming the check, the host and the fix.
  returned: always
  type: list
  elements: str
warnings_found:
  description: One line per warning.
  returned: always
  type: list
  elements: str
tables:
  description: The text tables - C(ssh) (the SSH matrix), C(bandwidth) (and C(bandwidth_tcp)), C(verdicts).
  returned: always
  type: dict
bandwidth:
  description: The bandwidth judgement (rows with algbw/busbw in GB/s, threshold, link speed) of the job's profile and of the tcp fallback test.
  returned: always
  type: dict
advice:
  description: When the RDMA profile fails and TCP works - the variable to pin, its value and the message.
  returned: always
  type: dict
text:
  description: The whole report as text (also written to C(preflight.txt)).
  returned: always
  type: str
path:
  description: The JSON file written (null when O(dest) is unset).
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.verdicts import PreflightError
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.report import judge_and_write


def main():
    module = AnsibleModule(
        argument_spec=dict(
            data=dict(type="dict"),
            job=dict(type="dict"),
            settings=dict(type="dict", default={}),
            dest=dict(type="path"),
            cache_path=dict(type="path"),
            key=dict(type="str", no_log=False),
        ),
        supports_check_mode=True,
    )
    data = module.params["data"]
    if not data:
        module.fail_json(msg="preflight_report needs data (or job, gathered by its action plugin)")
    try:
        result = judge_and_write(data, module.params["settings"], module.params["dest"], module.params["cache_path"],
                                 module.params["key"], module.check_mode)
    except (PreflightError, KeyError, TypeError, ValueError) as exc:
        module.fail_json(msg="cannot judge the preflight data: %s: %s" % (type(exc).__name__, exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
