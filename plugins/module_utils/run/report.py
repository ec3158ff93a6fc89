# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run's report for a person: Markdown with PNG plots.

``markdown`` is pure; ``plot_series`` and ``plot_timeline`` import matplotlib when they are called, and write each
figure through ``common/files.py`` (beside its place, renamed over it: a link the run left there is not followed).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import io
import os

from ansible_collections.multinode.deepspeed.plugins.module_utils.common import files
from ansible_collections.multinode.deepspeed.plugins.module_utils.run import stragglers


def _steps(records):
    return [r for r in records if r.get("event") == "step"]


PLOTS = [
    ("loss.png", "Loss (mean over ranks)", "loss", True),
    ("throughput.png", "Throughput (tokens/s, whole job)", "tokens_per_sec", True),
    ("step_time.png", "Step time per rank (s): a slow node stands out", "step_time", False),
]


SCORES = "stragglers.png"


def plot_paths(records_by_rank, out_dir, scores=None):
    """The plots plot_series draws for these records: none when no rank wrote a step; the nodes' compute pace
    (``scores``: module_utils/run/stragglers.replay's record) when there is one."""
    if not any(_steps(r) for r in records_by_rank.values()):
        return []
    return [os.path.join(out_dir, spec[0]) for spec in PLOTS] + (
        [os.path.join(out_dir, SCORES)] if (scores or {}).get("history") else [])


def _save(fig, path, root):
    """The figure as PNG at ``path`` (no directory on the way from ``root`` may be a link)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    files.write_bytes(path, buf.getvalue(), root)


def plot_series(records_by_rank, rank_host, out_dir, root=None, scores=None):
    """loss.png, throughput.png and step_time.png (one line per rank, labelled with its host) in ``out_dir``, under
    the run's directory ``root`` (by default the one above ``out_dir``); with ``scores``, stragglers.png."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not plot_paths(records_by_rank, out_dir):
        return []
    root = root or os.path.dirname(os.path.abspath(out_dir))
    paths = []
    for name, title, key, rank0_only in PLOTS:
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
        _save(fig, path, root)
        plt.close(fig)
        paths.append(path)
    if (scores or {}).get("history"):
        paths.append(plot_scores(plt, scores, os.path.join(out_dir, SCORES), root))
    return paths


def plot_scores(plt, scores, path, root):
    """Each node's compute pace over the steps (1.0: the fastest rank's), the straggler threshold dashed."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    history = scores["history"]
    for host in sorted({h for entry in history for h in entry["scores"]}):
        points = [(e["step"], e["scores"][host]) for e in history if host in e["scores"]]
        ax.step([p[0] for p in points], [p[1] for p in points], where="post", marker=".", label=host)
    ax.axhline(scores["threshold"], linestyle="--", color="grey", label="straggler below")
    ax.set_title("Compute pace per node (1.0: the fastest rank)")
    ax.set_xlabel("step")
    ax.set_ylim(0, 1.05)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    _save(fig, path, root)
    plt.close(fig)
    return path


def code_and_tracking(summary):
    """The lines on the code the ranks ran (the workdir's content, its commit), the DeepSpeed config they read, and
    where the trackers' files are, with how to open them."""
    lines = []
    workdir = summary.get("workdir") or {}
    if workdir.get("id"):
        git = workdir.get("git") or {}
        commit = " from commit %s%s" % (str(git["commit"])[:12], " with changes not committed" if git.get("dirty")
                                        else "") if git.get("commit") else ""
        lines.append("- Code: workdir %s, content %s%s (%s files, %s)." % (
            workdir.get("root"), workdir["id"], commit, workdir.get("count"),
            "copied to the cluster" if workdir.get("copied") else "on the cluster already, not copied"))
    if summary.get("ds_config"):
        lines.append("- DeepSpeed config: `ds_config.json` in this directory (from %s)." % summary["ds_config"])
    names = summary.get("tracking") or []
    if "tensorboard" in names:
        lines.append("- TensorBoard: `tensorboard --logdir %s` (the loss is `Train/Samples/train_loss` when the "
                     "script logs it)." % summary.get("tensorboard_dir", "tensorboard"))
    if "csv" in names:
        lines.append("- CSV: `csv/` in this directory.")
    if "mlflow" in names and summary.get("mlflow_uri"):
        lines.append("- MLflow: `mlflow ui --backend-store-uri %s` (the run is tagged multinode_ds.run_id=%s)." % (
            summary["mlflow_uri"], summary.get("run_id")))
    for name in ("wandb", "comet"):
        if name in names:
            lines.append("- %s: `%s/` in this directory (offline unless its key was given in secret_env)." % (
                name, name))
    return ["", "## Code and tracking", ""] + lines if lines else []


def refused_files(summary):
    """The lines naming what the run left in its directory that the controller refused: not regular files (links,
    FIFOs, sockets, devices), neither brought back nor read."""
    names = summary.get("refused_files") or []
    if not names:
        return []
    return ["", "## Refused files", "", "Not brought back from the cluster, not read: not regular files (links, FIFOs, "
            "sockets or devices) that the run left in its directory:", ""] + ["- `%s`" % n for n in names]


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
    lines += refused_files(summary)
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
    lines += code_and_tracking(summary) + [""] * bool(summary.get("stragglers"))
    lines += stragglers.lines(summary.get("stragglers"))
    lines += ["", "Ranks per host: " + ", ".join(
        "%s: %s" % (h, r) for h, r in sorted((summary.get("hosts") or {}).items()))]
    left = summary.get("left_pids") or {}
    if left:
        # What the run left running when it ended (a child of the script): named, never the run's failure.
        lines += ["", "Left running when the run ended, stopped by the node's agent: " + "; ".join(
            "%s: %s `%s`%s" % (host, e.get("pid"), str(e.get("cmd") or "?").replace("`", "'"),
                               "" if e.get("stopped") else " (still running)")
            for host, entries in sorted(left.items()) for e in entries) + "."]
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


def plot_timeline(attempts, losses, path, root=None):
    """timeline.png: each attempt as a bar over wall time (its nodes), a fault marked where one ended, and the loss
    across the attempts by step below (``losses``: per attempt ``[[step, loss], ...]``), at ``path`` under the run's
    directory ``root`` (by default the file's own directory)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not attempts:
        return None
    t0 = min(float(a.get("started") or a.get("ended") or 0) for a in attempts)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5))
    for i, attempt in enumerate(attempts):
        start = float(attempt.get("started") or t0) - t0
        end = float(attempt.get("ended") or start + t0) - t0
        ok = attempt.get("status") == "success"
        top.barh(i, max(end - start, 0.5), left=start, color="tab:green" if ok else "tab:orange")
        top.text(start, i, " %d: %s" % (attempt["attempt"], ", ".join(attempt.get("nodes") or [])), va="center",
                 fontsize="small")
        if not ok:
            top.axvline(end, color="tab:red", linestyle="--", linewidth=1)
    top.set_yticks([])
    top.set_xlabel("seconds since the first attempt started")
    top.set_title("Attempts (red: a fault)")
    for attempt, points in zip(attempts, losses):
        if points:
            bottom.plot([p[0] for p in points], [p[1] for p in points], marker=".",
                        label="attempt %d" % attempt["attempt"])
    bottom.set_xlabel("step")
    bottom.set_ylabel("loss")
    bottom.grid(True, alpha=0.3)
    if any(losses):
        bottom.legend(fontsize="small")
    fig.tight_layout()
    _save(fig, path, root)
    plt.close(fig)
    return path


def attempts_markdown(summary, timeline):
    """The report of a run that had attempts: the run's status and goodput, then each attempt - its nodes, how far
    it went, why it ended and whether it was retried - with a link to its own report."""
    lines = ["# Run %s" % summary.get("run_id"), "", "**Status: %s** after %d attempt(s); goodput %s" % (
        summary.get("status"), len(summary.get("attempts") or []),
        "%.0f%%" % (100 * summary["goodput"]) if summary.get("goodput") is not None else "unknown"), ""]
    for problem in summary.get("problems") or []:
        lines.append("- %s" % problem)
    lines += ["", "| attempt | nodes | steps | ended | retried | fault to first step |", "|---|---|---|---|---|---|"]
    for a in summary.get("attempts") or []:
        lines.append("| [%d](attempts/%d/report.md) | %s | %s-%s | %s | %s | %s |" % (
            a["attempt"], a["attempt"], ", ".join(a.get("nodes") or []), a.get("start_step"), a.get("last_step"),
            a.get("why"), a.get("retry_reason"),
            "%.1f s" % a["fault_to_first_step"] if a.get("fault_to_first_step") is not None else ""))
        if a.get("note"):
            lines.append("")
            lines.append("- %s" % a["note"])
    if timeline:
        lines += ["", "![timeline](%s)" % timeline]
    return "\n".join(lines) + "\n"
