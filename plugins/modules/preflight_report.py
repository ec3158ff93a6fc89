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
  - Runs on the controller (C(delegate_to=localhost)). It does not fail on a failed preflight; the playbook
    prints the tables first and then fails with RV(findings).
options:
  data:
    description:
      - What the playbook gathered; keys C(job), C(versions), C(probes), C(ssh), C(port), C(gpus),
        C(expected_addresses), C(own_addresses), C(link_gbps), C(tcp_link_gbps), C(bandwidth).
    type: dict
    required: true
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
author:
  - multinode.deepspeed developers (@multinode)
attributes:
  check_mode:
    support: full
    description: Judges in check mode too; writes no file.
  diff_mode:
    support: none
    description: Shows no diff.
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

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight import PreflightError, evaluate


def text_report(report, data):
    job = data["job"]
    parts = ["Preflight %s: %s" % (job.get("run_id") or "", report["status"].upper()),
             "job: backend %s, accelerator %s, NCCL profile %s, master %s:%s, ranks %s"
             % (job.get("backend"), job.get("accelerator"), job.get("profile"), job.get("master"),
                job.get("master_port"), ", ".join("%s=%s" % kv for kv in sorted(job["rank_hosts"].items()))),
             ""]
    if data.get("version_table"):
        parts += [data["version_table"], ""]
    for key in ("ssh", "bandwidth", "bandwidth_tcp", "verdicts"):
        if key in report["tables"]:
            parts += [report["tables"][key], ""]
    if report["findings"]:
        parts += ["Failures:"] + ["  " + f for f in report["findings"]] + [""]
    if report.get("advice"):
        parts += ["Advice: " + report["advice"]["message"], ""]
    return "\n".join(parts)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            data=dict(type="dict", required=True),
            settings=dict(type="dict", default={}),
            dest=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    data = module.params["data"]
    try:
        report = evaluate(data, module.params["settings"])
    except (PreflightError, KeyError, TypeError, ValueError) as exc:
        module.fail_json(msg="cannot judge the preflight data: %s: %s" % (type(exc).__name__, exc))
    path = None
    changed = False
    dest = module.params["dest"]
    if dest and not module.check_mode:
        os.makedirs(dest, exist_ok=True)
        path = os.path.join(dest, "preflight.json")
        doc = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "job": data["job"],
               "status": report["status"], "verdicts": report["verdicts"], "findings": report["findings"],
               "warnings": report["warnings"], "advice": report["advice"], "bandwidth": report["bandwidth"],
               "settings": report["settings"],
               "raw": {k: data.get(k) for k in ("versions", "ssh", "port", "gpus", "link_gbps", "bandwidth")}}
        with open(path, "w") as fh:
            json.dump(doc, fh, indent=2, sort_keys=True, default=str)
            fh.write("\n")
        with open(os.path.join(dest, "preflight.txt"), "w") as fh:
            fh.write(text_report(report, data))
        changed = True
    module.exit_json(changed=changed, status=report["status"], verdicts=report["verdicts"],
                     findings=report["findings"], warnings_found=report["warnings"], tables=report["tables"],
                     bandwidth=report["bandwidth"], advice=report["advice"], path=path,
                     text=text_report(report, data))


if __name__ == "__main__":
    main()
