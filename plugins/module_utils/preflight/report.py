# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Judge a preflight (module_utils/preflight/evaluate.evaluate) and write it: preflight.json, preflight.txt, and the
record a later launch of the same job reuses.  Shared by the preflight_report module and its action plugin
(which runs it on the controller without a module round trip)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import time

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight import health
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.evaluate import evaluate


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


def load_history(path):
    """The health history file's content ({} when it is absent or unreadable: the nodes are judged by their peers)."""
    try:
        with open(path) as fh:
            loaded = json.load(fh)
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def judge_and_write(data, settings, dest=None, cache_path=None, key=None, check_mode=False):
    """The module's result: status, message, outcome, verdicts, findings, tables, text, path, changed.

    Raises PreflightError, KeyError, TypeError or ValueError on data that cannot be judged."""
    # Each node's health figures of its last passing preflights, beside the preflight records (module_utils/
    # preflight/health.py): read before the judgement, the new figures added after a pass.
    history_path = os.path.join(os.path.dirname(cache_path), "health.json") if cache_path else None
    data = dict(data, health_history=load_history(history_path) if history_path else {})
    report = evaluate(data, settings)
    path = None
    changed = False
    if dest and not check_mode:
        os.makedirs(dest, exist_ok=True)
        path = os.path.join(dest, "preflight.json")
        doc = {"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "job": data["job"],
               "status": report["status"], "verdicts": report["verdicts"], "findings": report["findings"],
               "warnings": report["warnings"], "advice": report["advice"], "bandwidth": report["bandwidth"],
               "settings": report["settings"],
               "raw": dict((k, data.get(k)) for k in ("versions", "ssh", "port", "gpus", "link_gbps", "bandwidth",
                                                      "health"))}
        with open(path, "w") as fh:
            json.dump(doc, fh, indent=2, sort_keys=True, default=str)
            fh.write("\n")
        with open(os.path.join(dest, "preflight.txt"), "w") as fh:
            fh.write(text_report(report, data))
        changed = True
    outcome = {"status": report["status"], "time": time.time(), "report": path, "run_id": data["job"].get("run_id"),
               "warnings": report["warnings"],
               "bandwidth": dict((k, (report["bandwidth"].get("primary") or {}).get(k))
                                 for k in ("label", "status", "busbw_gbps", "threshold_gbps", "link_gbps"))}
    if cache_path and not check_mode:
        if report["status"] == "pass":
            os.makedirs(os.path.dirname(cache_path), exist_ok=True)
            record = dict(outcome, key=key)
            with open(cache_path + ".tmp", "w") as fh:
                json.dump(record, fh, indent=2, sort_keys=True, default=str)
            os.replace(cache_path + ".tmp", cache_path)
            history = health.updated_history(data["health_history"], data.get("health"))
            if history != data["health_history"]:  # figures were measured (not only errors)
                with open(history_path + ".tmp", "w") as fh:
                    json.dump(history, fh, indent=1, sort_keys=True)
                os.replace(history_path + ".tmp", history_path)
        elif os.path.exists(cache_path):
            os.remove(cache_path)
    message = None
    if report["status"] == "fail":
        message = "Preflight failed (%d problem(s)); nothing was launched:\n%s" % (
            len(report["findings"]), "\n".join("- " + f for f in report["findings"]))
        if report.get("advice"):
            message += "\nAdvice: " + report["advice"]["message"]
        message += "\nReport: %s" % path
    return dict(changed=changed, status=report["status"], message=message, outcome=outcome,
                verdicts=report["verdicts"], findings=report["findings"], warnings_found=report["warnings"],
                tables=report["tables"], bandwidth=report["bandwidth"], advice=report["advice"], path=path,
                text=text_report(report, data))
