#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: bench_report
short_description: Write a benchmark run's report with plots, and its history report
version_added: "0.1.0"
description:
  - Reads C(summary.json) of a benchmark run collected to the controller (written by the driver,
    C(python -m multinode_ds.bench run)) and the history (C(history.jsonl)).
  - Writes C(report.md) with the per-node and total throughput, prompt and generation throughput, latency
    percentiles, the scaling efficiency, the MLPerf LoadGen verdict and the run against the history, with
    C(plots/throughput.png) and C(plots/latency.png); and C(history.md) with C(plots/history.png), the trend per
    metric with every run's drop against the median of the runs before it flagged.
  - C(benchmark.yml) runs it with the history the play collected into C(<run_id>/history/) and the run's threshold.
extends_documentation_fragment:
  - multinode.deepspeed.report
  - multinode.deepspeed.attributes
options:
  history:
    description: The history file (C(history.jsonl)); without it, or when it does not exist, no history report.
    type: path
  threshold:
    description: A metric worse than the median of the previous runs by more than this percentage is flagged.
    type: float
    default: 10
notes:
  - 'C(report.md) (replacing the driver''s) holds the status and error, the model, the engine and why, samples and max
    new tokens, the trigger; a throughput table per node with the total (slots, samples, samples/s, tokens/s, prompt
    and generation tokens/s); a table per slot (host, local slot, engine, device, samples, wall time, samples/s,
    tokens/s); the latency p50/p90/p99; the scaling arithmetic, or V(No single-slot run: no scaling efficiency.);
    the MLPerf LoadGen verdict with its reasons, or why it was not used; the run against the history
    (C(**REGRESSION** <metric>) with its value, the median and the change, or no drop); and the plots.'
  - C(plots/throughput.png) shows samples/s and tokens/s per slot, labelled C(<host>/<local slot>), with the total in
    the title and the single slot as a dashed line; C(plots/latency.png) the latency histogram with its percentiles.
  - With a history, C(history.md) is the trend per metric, every successful run judged against the median of the
    successful runs before it (C(docs/benchmark.md), "History and the regression flag"), and C(plots/history.png)
    shows samples/s, tokens/s, p90 latency and scaling efficiency over the runs, flagged runs in red.
  - A failed run gets a report with its status and error, and neither C(throughput.png) nor C(latency.png); the
    history report is still written.
  - It fails when C(summary.json) is missing or unreadable (C(no readable benchmark summary at <path> ... did the
    driver start? See <run_dir>/logs/)), or when the history cannot be read.
attributes:
  check_mode:
    support: full
    description: Reads the run and returns the figures without writing.
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Write the report with plots
  multinode.deepspeed.bench_report:
    run_dir: runs/20261122-190000-bench
    history: runs/20261122-190000-bench/history/history.jsonl
    threshold: 10
  delegate_to: localhost
"""

RETURN = r"""
summary:
  description: The run's C(summary.json) (status, error, aggregate with slots, nodes and total, latency, scaling
    efficiency, engines, LoadGen, metrics, regressions; C(docs/benchmark.md), "What a run leaves").
  returned: always
  type: dict
report:
  description: Path of C(report.md).
  returned: always
  type: str
history_report:
  description: Path of C(history.md), or null without a history.
  returned: always
  type: str
plots:
  description: The PNG files written.
  returned: always
  type: list
  elements: str
text:
  description:
    - 'The results in a few lines, which C(benchmark.yml) prints at the end - C(Benchmark <run_id>: <status>), one line
      per node and one for the total (slots, samples/s, tokens/s, prompt and generation tokens/s), the scaling
      efficiency (and the single slot''s samples/s), the end-to-end throughput when the driver measured it, the
      latency p50/p90/p99, the engine and why, the MLPerf LoadGen verdict, the history''s verdict on this run with the
      history report''s path, and the report''s path.'
    - For a failed run, the first line and the report's path.
  returned: always
  type: list
  elements: str
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.multinode.deepspeed.plugins.module_utils.bench.core import (
    format_history, markdown, plot_history, plot_run, trend)


def _history(path):
    entries = []
    with open(path) as fh:
        for line in fh:
            if line.strip():
                entries.append(json.loads(line))
    return entries


def _text(summary, history_lines, report):
    agg = summary.get("aggregate") or {}
    total = agg.get("total") or {}
    out = ["Benchmark %s: %s" % (summary.get("run_id"), summary.get("status"))]
    if not total:
        return out + ["Report: %s" % report]
    for host in sorted(agg["nodes"]):
        n = agg["nodes"][host]
        out.append("  %-12s %d slot(s): %8.4g samples/s %10.4g tokens/s (prompt %.4g, generation %.4g)" % (
            host, n["slots"], n["samples_per_s"], n["tokens_per_s"], n["prompt_tokens_per_s"],
            n["generation_tokens_per_s"]))
    out.append("  %-12s %d slot(s): %8.4g samples/s %10.4g tokens/s (prompt %.4g, generation %.4g)" % (
        "total", total["slots"], total["samples_per_s"], total["tokens_per_s"], total["prompt_tokens_per_s"],
        total["generation_tokens_per_s"]))
    eff = agg.get("scaling_efficiency")
    single = agg.get("single") or {}
    out.append("  scaling efficiency %s (one slot alone: %s samples/s)" % (
        "%.3f" % eff if eff is not None else "-", "%.4g" % single["samples_per_s"] if single else "-"))
    if total.get("samples_per_s_end_to_end"):
        e2e = agg.get("scaling_efficiency_end_to_end")
        out.append("  end to end: %d samples in %.3g s = %.4g samples/s (the slowest slot sets it)%s" % (
            total["samples"], total["elapsed_s"], total["samples_per_s_end_to_end"],
            ", efficiency %.3f" % e2e if e2e is not None else ""))
    lat = agg.get("latency") or {}
    out.append("  latency per sample: p50 %.4g s, p90 %.4g s, p99 %.4g s" % (
        lat["latency_p50_s"], lat["latency_p90_s"], lat["latency_p99_s"]))
    out.append("  engine: %s (%s)" % (", ".join(agg.get("engines") or []), summary.get("engine_reason")))
    lg = summary.get("loadgen") or {}
    if lg.get("used"):
        why = ("; " + "; ".join(lg["invalid_reasons"])) if lg.get("invalid_reasons") else ""
        out.append("  MLPerf LoadGen Offline: %s, %.4g samples/s%s" % (lg["result"], lg["samples_per_s"] or 0, why))
    else:
        out.append("  MLPerf LoadGen Offline: not used (%s)" % lg.get("reason"))
    out += history_lines
    out.append("Report: %s" % report)
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(run_dir=dict(type="path", required=True), history=dict(type="path"),
                           threshold=dict(type="float", default=10.0), plots=dict(type="bool", default=True)),
        supports_check_mode=True,
    )
    p = module.params
    run_dir = p["run_dir"]
    path = os.path.join(run_dir, "summary.json")
    try:
        with open(path) as fh:
            summary = json.load(fh)
    except (OSError, ValueError) as exc:
        module.fail_json(msg="no readable benchmark summary at %s (%s): did the driver start? See %s/logs/"
                         % (path, exc, run_dir))
    report = os.path.join(run_dir, "report.md")
    history_report = None
    plots = []
    history_lines = []
    entries = []
    if p["history"] and os.path.exists(p["history"]):
        try:
            entries = _history(p["history"])
        except (OSError, ValueError) as exc:
            module.fail_json(msg="the history %s is unreadable: %s" % (p["history"], exc))
        rows = trend(entries, p["threshold"])
        text = format_history(entries, p["threshold"]).splitlines()
        verdict = [x for x in text if x.startswith("REGRESSION")] or text[-1:]
        history_lines = ["History (%d successful run(s) of %d): %s" % (len(rows), len(entries), verdict[0])]
        history_lines += ["  " + x for x in verdict[1:]]
        history_report = os.path.join(run_dir, "history.md")
    if not module.check_mode:
        if p["plots"]:
            plots = plot_run(summary.get("aggregate"), os.path.join(run_dir, "plots"))
        with open(report, "w") as fh:
            fh.write(markdown(summary, [os.path.relpath(x, run_dir) for x in plots]))
        if history_report:
            hplots = plot_history(rows, os.path.join(run_dir, "plots")) if p["plots"] else []
            with open(history_report, "w") as fh:
                fh.write("# Benchmark history\n\n```\n%s\n```\n" % format_history(entries, p["threshold"]))
                for x in hplots:
                    fh.write("\n![%s](%s)\n" % (os.path.basename(x), os.path.relpath(x, run_dir)))
            plots += hplots
            history_lines.append("History report: %s" % history_report)
    module.exit_json(changed=not module.check_mode, summary=summary, report=report, history_report=history_report,
                     plots=plots, text=_text(summary, history_lines, report))


if __name__ == "__main__":
    main()
