# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A run collected to the controller: its summary.json, report.md and plots, from what the run left in its directory.

The work of ``run_summary``, done in the controller's own process by its action plugin (no module to start; the
module's ``main`` calls the same ``report``). Pure Python apart from the plots (matplotlib, imported when drawn).

What came back from the cluster is rank code's: before anything is read, what is not a regular file or a directory
is removed (and named in the summary's ``refused_files``, with what the pull itself left behind); every file is read
and written through ``common/files.py``, which follows no link and waits on no FIFO.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import glob
import json
import os
import re
import time

from ansible_collections.multinode.deepspeed.plugins.module_utils.common import files
from ansible_collections.multinode.deepspeed.plugins.module_utils.common.hostfile import build, parse
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.diagnose import (
    abort_host_first, diagnose, first_failure)
from ansible_collections.multinode.deepspeed.plugins.module_utils.run import stragglers
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.report import markdown, plot_paths, plot_series
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.summary import (
    blame, hosts_by_log, launcher_exit, lost_nodes, node_report, rank_environment, rank_log_index, read_jsonl,
    summarize)

try:
    # Found, not imported: the plots import it when they are drawn (maybe in a process of their own).
    from importlib.util import find_spec
    HAS_MATPLOTLIB = find_spec("matplotlib") is not None
except ImportError:
    HAS_MATPLOTLIB = False

ARGUMENT_SPEC = dict(
    run_dir=dict(type="path", required=True),
    run_id=dict(type="str", required=True),
    world_size=dict(type="int"),
    launcher_rc=dict(type="int"),
    wall_time=dict(type="float"),
    coordinator=dict(type="str"),
    expect_metrics=dict(type="bool", default=True),
    plots=dict(type="bool", default=True),
    plots_in_background=dict(type="bool", default=False),
    straggler=dict(type="dict"),
    extra=dict(type="dict", default={}),
    started=dict(type="float"),
    addresses=dict(type="dict", default={}),
    lost=dict(type="list", elements="str", default=[]),
    cause=dict(type="str"),
    pull_lines=dict(type="list", elements="str", default=[]),
)
LOG_LIMIT = 4 * 1024 * 1024


class ReportError(Exception):
    """The report cannot be written (what is missing, and the fix)."""


def report(p, check_mode=False):
    """summary.json, the plots and report.md for the collected run in ``p["run_dir"]`` (``p``: the options of
    ARGUMENT_SPEC, defaults applied); the result run_summary returns. Raises ReportError."""
    p = dict(p)
    if p["wall_time"] is None and p["started"] is not None:
        p["wall_time"] = max(0.0, time.time() - p["started"])
    if p["plots"] and not HAS_MATPLOTLIB:
        raise ReportError("Failed to import the required Python library (matplotlib) on the controller. "
                          "Fix: run scripts/setup (or pip install matplotlib), or set plots=false.")
    # What the pull left behind (rsync skips what is not a regular file) and what came back all the same.
    refused = files.rsync_skipped(p["pull_lines"])
    refused += files.refuse_specials(p["run_dir"], remove=not check_mode)
    run = _read_run(p["run_dir"], refused)
    return _write_report(p, run, _summarize(p, run), check_mode)


class _Reader(object):
    """Reads the run's files under ``root`` (common/files.py: no link followed, no FIFO waited on); what is there
    but is not a regular file reads as absent, and its name is kept in ``refused``."""

    def __init__(self, root, refused):
        self.root, self.refused = root, refused

    def text(self, path, limit=LOG_LIMIT):
        """The file's last ``limit`` bytes as text; "" when it is missing or refused."""
        return files.read_text(path, self.root, limit, tail=True, refused=self.refused) or ""

    def json(self, path, unreadable):
        """A JSON record the run left; None when there is none, ``unreadable`` when it is not JSON."""
        text = files.read_text(path, self.root, LOG_LIMIT, tail=True, refused=self.refused)
        if text is None:
            return None
        try:
            return json.loads(text)
        except ValueError:
            return unreadable


def _tail(text, n=15):
    return "\n".join(text.rstrip().splitlines()[-n:])


def name_peers(text, addresses):
    """``10.89.0.12`` -> ``10.89.0.12 (worker2)`` in a log's lines: gloo and NCCL name peers by address."""
    for host, addr in sorted((addresses or {}).items(), key=lambda kv: -len(str(kv[1]))):
        if addr and addr != host:
            text = re.sub(r"(?<![\d.])%s(?![\d])" % re.escape(str(addr)), "%s (%s)" % (addr, host), text)
    return text


def message(summary, report, path):
    """What the playbook says at the end: the outcome, or why the run failed, where, and the fix."""
    secs = "%.0f" % float(summary.get("wall_time") or 0)
    if summary.get("status") != "success":
        lines = ["Run %s failed: %s" % (summary.get("run_id"), "; ".join(summary.get("problems") or []))]
        failure = summary.get("failure")
        if summary.get("lost"):
            lines.append("Lost first: %s" % ", ".join(summary["lost"]))
        if failure:
            lines.append("%s: rank %s on %s, exit code %s" % (
                "Then failed" if failure.get("consequence_of") else "Failed first", failure.get("rank"),
                failure.get("host"), failure.get("exit_code")))
            if failure.get("last_lines"):
                lines += ["Last lines of %s:" % failure.get("log"), failure["last_lines"]]
        for d in summary.get("diagnosis") or []:
            lines.append("Diagnosis (%s): %s Fix: %s" % (d.get("id"), d.get("cause"), d.get("remedy")))
        return "\n".join(lines + refused_line(summary) + ["Report: %s" % report])
    hosts = summary.get("hosts") or {}
    ranks = ", ".join("%s ranks %s" % (h, r) for h, r in sorted(hosts.items())) or (summary.get("hostfile") or "").strip()
    lines = ["Run %s: world size %s on %s" % (summary.get("run_id"), summary.get("world_size"), ranks)]
    if summary.get("first_loss") is not None:
        lines.append("Loss %.3f -> %.3f in %s steps, %s s" % (
            summary["first_loss"], summary["last_loss"], summary.get("steps"), secs))
    else:
        lines.append("%s finished on every rank in %s s" % (summary.get("entrypoint"), secs))
    return "\n".join(lines + refused_line(summary) + ["Report: %s" % report, "Summary: %s" % path])


def refused_line(summary):
    """The line naming what the run left in its directory that the controller refused (not regular files)."""
    names = summary.get("refused_files") or []
    if not names:
        return []
    return ["Not brought back (not regular files: links, FIFOs, sockets or devices): %s" % ", ".join(names)]


def _read_run(run_dir, refused):
    """What the run left in its directory: the ranks' metrics, the agents' last heartbeats, the launchers' and
    the ranks' logs, the hostfile's layout (and so each rank's host) and the ABORT record; ``reader``, which read
    them (the names it refused)."""
    read = _Reader(run_dir, refused)
    run = {"records": {}, "nodes": {}, "launcher_logs": {}, "rank_logs": {}, "layout_hosts": [], "rank_host": {},
           "reader": read}
    for path in sorted(glob.glob(os.path.join(run_dir, "metrics", "rank*.jsonl"))):
        m = re.search(r"rank(\d+)\.jsonl$", path)
        run["records"][int(m.group(1))] = read_jsonl(read.text(path))
    for path in sorted(glob.glob(os.path.join(run_dir, "nodes", "*.json"))):
        beat = read.json(path, None)
        if isinstance(beat, dict):
            run["nodes"][beat.get("host") or os.path.basename(path)[:-5]] = beat
    for path in sorted(glob.glob(os.path.join(run_dir, "nodes", "*.launcher.log"))):
        run["launcher_logs"][os.path.basename(path)[:-len(".launcher.log")]] = read.text(path)
    for path in sorted(glob.glob(os.path.join(run_dir, "logs", "*_rank*.log"))):
        m = re.search(r"_rank(\d+)\.log$", path)
        run["rank_logs"][int(m.group(1))] = path
    hostfile = files.read_text(os.path.join(run_dir, "hostfile"), run_dir, LOG_LIMIT, refused=refused)
    if hostfile is not None:
        layout = build(parse(hostfile))
        run["layout_hosts"] = layout["hosts"]
        run["rank_host"] = dict((r["rank"], r["host"]) for r in layout["ranks"])
    run["abort"] = read.json(os.path.join(run_dir, "control", "ABORT"), {"reason": "unreadable abort record"})
    return run


def _summarize(p, run):
    """The run's summary: its metrics, then what failed first and why, the logs' diagnosis, the nodes, the ranks'
    environment and the scheduler's record of the run."""
    run_dir, nodes, rank_logs, abort, read = p["run_dir"], run["nodes"], run["rank_logs"], run["abort"], run["reader"]
    launcher_rc = p["launcher_rc"] if p["launcher_rc"] is not None else launcher_exit(nodes)
    summary = summarize(p["run_id"], run["records"], expected_world_size=p["world_size"], launcher_rc=launcher_rc,
                        wall_time=p["wall_time"], coordinator=p["coordinator"],
                        launcher_log="\n".join(run["launcher_logs"].values()), expect_metrics=p["expect_metrics"],
                        rank_hosts=run["rank_host"],
                        coordinator_machine=(nodes.get(p["coordinator"]) or {}).get("machine"))
    rank_texts = dict((rank, read.text(path)) for rank, path in rank_logs.items())
    failure = first_failure(abort_host_first(run["launcher_logs"], abort), run["layout_hosts"], rank_texts)
    lost = lost_nodes(abort, p["lost"])
    if failure is not None and failure.get("rank") is not None and failure["rank"] in rank_logs:
        failure["log"] = os.path.relpath(rank_logs[failure["rank"]], run_dir)
        failure["last_lines"] = name_peers(_tail(rank_texts[failure["rank"]]), p["addresses"])
    blame(summary, failure, abort, lost, p["cause"])
    summary["lost"] = lost
    texts = dict(("nodes/%s.launcher.log" % h, t) for h, t in run["launcher_logs"].items())
    texts.update(("logs/" + os.path.basename(path), rank_texts[rank]) for rank, path in rank_logs.items())
    summary["diagnosis"] = diagnose(texts, dict((h, b.get("versions") or {}) for h, b in nodes.items()))
    summary["failure"] = failure
    summary["abort"] = abort
    summary.update(node_report(nodes))
    summary["rank_logs"] = rank_log_index(rank_logs, run["rank_host"], run_dir)
    # The ranks' whole environment (rank.env; a run from before it had only .deepspeed_env).
    env_text = files.read_text(os.path.join(run_dir, "rank.env"), run_dir, LOG_LIMIT, refused=read.refused)
    summary["environment"] = rank_environment(env_text if env_text is not None else read.text(
        os.path.join(run_dir, ".deepspeed_env")))
    # A scheduler's record of the run (the slurm backend: job id, state, exit code, elapsed, nodes).
    scheduler = read.json(os.path.join(run_dir, "scheduler.json"), {"error": "unreadable scheduler.json"})
    if scheduler is not None:
        summary["scheduler"] = scheduler
    if not summary["hosts"] and rank_logs:
        summary["hosts"] = hosts_by_log(rank_logs, run["rank_host"])
    # Each node's compute pace over the steps, against the plan's straggler settings (the watch saw samples of it).
    if p["straggler"]:
        run["stragglers"] = summary["stragglers"] = stragglers.replay(
            run["records"], p["straggler"].get("threshold") or stragglers.THRESHOLD,
            p["straggler"].get("steps") or stragglers.STEPS)
    summary.update(p["extra"])
    # Names in the run's directory that were not brought back or not read: not regular files (links, FIFOs, ...).
    summary["refused_files"] = sorted(set(read.refused))
    return summary


def _write_report(p, run, summary, check_mode):
    """summary.json, the plots and report.md in the run directory (nothing in check mode), and the result. Each is
    written beside its place and renamed over it: a link the run left there is replaced, never followed."""
    run_dir = p["run_dir"]
    out = os.path.join(run_dir, "summary.json")
    text = json.dumps(summary, indent=2, sort_keys=True) + "\n"
    changed = files.read_text(out, run_dir) != text
    plots = []
    if not check_mode:
        files.write_text(out, text, run_dir)
        if p["plots"]:
            plots = _plots(run, run_dir, p["plots_in_background"])
        files.write_text(os.path.join(run_dir, "report.md"),
                         markdown(summary, [os.path.relpath(x, run_dir) for x in plots]), run_dir)
    report = os.path.join(run_dir, "report.md")
    return dict(changed=changed, summary=summary, path=out, report=report, plots=plots,
                message=message(summary, report, out))


def _plots(run, run_dir, background):
    """The run's plots (``plots/`` of ``run_dir``), drawn here, or (``background``) in a child process that
    outlives this one: its standard streams go to /dev/null and it keeps no other descriptor, so that nothing of
    Ansible's waits on it."""
    out_dir = os.path.join(run_dir, "plots")
    if not background or not plot_paths(run["records"], out_dir, run.get("stragglers")):
        return plot_series(run["records"], run["rank_host"], out_dir, root=run_dir, scores=run.get("stragglers"))
    try:
        pid = os.fork()
    except OSError:
        return plot_series(run["records"], run["rank_host"], out_dir, root=run_dir, scores=run.get("stragglers"))
    if pid:
        return plot_paths(run["records"], out_dir, run.get("stragglers"))
    try:  # the child: no exception leaves it, whatever happens
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(3, 65536)
        plot_series(run["records"], run["rank_host"], out_dir, root=run_dir, scores=run.get("stragglers"))
    finally:
        os._exit(0)
