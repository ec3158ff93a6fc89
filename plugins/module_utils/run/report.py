# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run's report for a person: Markdown with PNG plots.

``markdown`` is pure; ``plot_series`` imports matplotlib when it is called.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os


def _steps(records):
    return [r for r in records if r.get("event") == "step"]


def plot_series(records_by_rank, rank_host, out_dir):
    """loss.png, throughput.png and step_time.png (one line per rank, labelled with its host)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not any(_steps(r) for r in records_by_rank.values()):
        return []
    if not os.path.isdir(out_dir):
        os.makedirs(out_dir)
    paths = []
    specs = [
        ("loss.png", "Loss (mean over ranks)", "loss", True),
        ("throughput.png", "Throughput (tokens/s, whole job)", "tokens_per_sec", True),
        ("step_time.png", "Step time per rank (s): a slow node stands out", "step_time", False),
    ]
    for name, title, key, rank0_only in specs:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        for rank in sorted(records_by_rank):
            if rank0_only and rank != min(records_by_rank):
                continue
            steps = _steps(records_by_rank[rank])
            xs = [r["step"] for r in steps if r.get(key) is not None]
            ys = [r[key] for r in steps if r.get(key) is not None]
            label = "rank %d (%s)" % (rank, rank_host.get(rank) or steps[0].get("host") if steps else "?")
            ax.plot(xs, ys, marker=".", label=label)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        if not rank0_only:
            ax.legend(fontsize="small")
        fig.tight_layout()
        path = os.path.join(out_dir, name)
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


def markdown(summary, plots):
    """report.md: status, failure and diagnosis first, then the figures."""
    lines = ["# Run %s" % summary.get("run_id"), ""]
    lines.append("**Status: %s**" % summary.get("status"))
    lines.append("")
    for problem in summary.get("problems") or []:
        lines.append("- %s" % problem)
    failure = summary.get("failure")
    if failure:
        lines += ["", "## What failed", ""]
        lines.append("Rank %s on %s exited with %s%s." % (
            failure.get("rank"), failure.get("host"), failure.get("exit_code"),
            " (%s)" % failure["signal"] if failure.get("signal") else ""))
        if failure.get("last_lines"):
            lines += ["", "Last lines of `%s`:" % failure.get("log"), "", "```", failure["last_lines"], "```"]
    if summary.get("diagnosis"):
        lines += ["", "## Diagnosis", ""]
        for d in summary["diagnosis"]:
            lines.append("- **%s** — %s Fix: %s (`%s`: `%s`)" % (d["id"], d["cause"], d["remedy"], d["file"],
                                                                 d["line"][:160]))
    lines += ["", "## Run", "", "| | |", "|---|---|"]
    for key in ("model", "backend", "entrypoint", "world_size", "steps", "first_loss", "last_loss",
                "mean_tokens_per_sec", "wall_time", "exit_status"):
        value = summary.get(key)
        if isinstance(value, float):
            value = "%.4g" % value
        lines.append("| %s | %s |" % (key, value))
    pre = summary.get("preflight")
    if pre:
        bw = pre.get("bandwidth") or {}
        text = "Preflight: %s" % pre.get("status")
        if bw.get("busbw_gbps") is not None:
            text += "; all-reduce bus bandwidth %.3f GB/s (%s)" % (bw["busbw_gbps"], bw.get("label"))
            if bw.get("threshold_gbps"):
                text += ", threshold %.3f GB/s of a %g Gb/s link" % (bw["threshold_gbps"], bw.get("link_gbps") or 0)
        lines += ["", text + " (preflight.txt)."]
        lines += ["- warning: %s" % w for w in pre.get("warnings") or []]
    lines += ["", "Ranks per host: " + ", ".join(
        "%s: %s" % (h, r) for h, r in sorted((summary.get("hosts") or {}).items()))]
    versions = summary.get("versions") or {}
    if versions:
        pkgs = sorted({k for v in versions.values() if v for k in v})
        lines += ["", "## Versions", "", "| host | " + " | ".join(pkgs) + " |",
                  "|---" * (len(pkgs) + 1) + "|"]
        for host, v in sorted(versions.items()):
            lines.append("| %s | %s |" % (host, " | ".join(str((v or {}).get(k)) for k in pkgs)))
    if plots:
        lines += ["", "## Plots", ""]
        lines += ["![%s](%s)" % (os.path.basename(p)[:-4], p) for p in plots]
    return "\n".join(lines) + "\n"
