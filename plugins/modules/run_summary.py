#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: run_summary
short_description: Summarize a collected training run into summary.json
version_added: "0.1.0"
description:
  - Reads the per-rank metrics (C(metrics/rank*.jsonl)) of a run directory that was collected to the controller,
    and writes C(summary.json) there with the world size, the hosts and their ranks, the steps,
    the first and last loss, the wall time and the exit status.
  - A run counts as successful only when the launcher exited 0 and every rank wrote its final record;
    DeepSpeed's launcher can exit 0 although ranks died.
  - Reads the per-node agents' records (C(nodes/*.json)) for exit codes and versions, finds the rank that
    failed first, and maps known failure patterns in the logs to their cause and remedy (C(diagnosis)).
  - Writes C(report.md) with PNG plots under C(plots/) (loss, throughput, step time per node).
  - Normally run on the controller, with C(delegate_to) set to C(localhost).
extends_documentation_fragment:
  - multinode.deepspeed.report
options:
  run_id:
    description: The run's id.
    type: str
    required: true
  world_size:
    description: The world size the hostfile promised.
    type: int
  launcher_rc:
    description:
      - The launchers' exit code.
      - When not given, it is taken from the agents' heartbeats (C(nodes/*.json)) of role C(launcher) - the first one
        that is not 0, else 0; unknown when a launcher never reported one.
    type: int
  wall_time:
    description: Seconds from launch to the end of the run.
    type: float
  coordinator:
    description: The coordinator's host name; a rank there is reported as a problem.
    type: str
  expect_metrics:
    description:
      - Whether the entrypoint writes the bundled trainer's metrics (C(metrics/rank*.jsonl)).
      - A user's own script need not; its run then counts as successful on the launchers' exit codes.
    type: bool
    default: true
  started:
    description: When the run started (seconds since the epoch); sets O(wall_time) when that is not given.
    type: float
  lost:
    description: Nodes the run lost (the watch found them unreachable); named first, before a rank that failed
      because of them.
    type: list
    elements: str
    default: []
  cause:
    description:
      - What the watch found brought the run down beside its ranks and nodes (its C(cause), a full disk); named
        first, and the rank that failed first is recorded as a consequence of it. The abort record's C(cause) is
        used when this is not set.
    type: str
  plots_in_background:
    description:
      - Draw the plots in a process of their own that the module does not wait for (C(train.yml) does, so that the
        play does not wait for matplotlib). C(report.md) names them at once and they appear within a second or
        two; RV(plots) lists the paths they will have.
    type: bool
    default: false
  addresses:
    description: Node -> address; the addresses in a failed rank's last lines (gloo and NCCL name peers by address)
      get the node's name beside them.
    type: dict
    default: {}
  extra:
    description:
      - More keys to store in the summary. C(train.yml) adds C(model), C(backend), C(entrypoint), C(hostfile) (its
        text), C(master), C(run_dir_on_cluster), C(watch) (the watch's status and reason) and C(preflight) (the
        preflight's outcome, or the reused record).
    type: dict
    default: {}
notes:
  - It reads C(metrics/rank*.jsonl) (a torn last line, from a rank killed while writing, is skipped); C(nodes/*.json),
    the agents' last heartbeats (roles, exit codes, versions); C(nodes/*.launcher.log) and C(logs/*_rank*.log) (the
    last 4 MiB of each); C(hostfile), to map ranks to hosts; C(control/ABORT); C(rank.env) (C(.deepspeed_env) for a
    run from before it); and C(scheduler.json) when the launch backend left one (slurm).
  - The run's C(status) is C(success) only when C(problems) is empty. A problem is recorded when a rank has no
    C(done) record (with O(expect_metrics)); the ranks disagree on the world size; the world size differs from
    O(world_size), or some of the ranks 0 to O(world_size) - 1 wrote no metrics (with O(expect_metrics)); a launcher
    log contains DeepSpeed's C(Unable to find hostfile) (it fell back to the local node); the launchers' exit code is
    unknown (it never finished) or not 0; a rank ran on O(coordinator); a rank exited non-zero; or the run was
    aborted.
  - The cause comes first in C(problems) - O(cause) (a full disk), then a lost node (O(lost), or the abort
    record's), else the rank that failed first (for example V(rank 1 on worker2 exited with -9 (SIGKILL\))), else
    who aborted the run. A rank elsewhere
    that failed after a node was lost is recorded as a consequence of it.
  - The first failure is the first line C(... exits with return code = N) (N not 0) in the launcher logs, the log of
    the node that wrote the abort record being read first. The line gives the host (pdsh prefixes it) and the local
    rank, which the hostfile turns into a global rank. A rank that exited with an error after its collective lost
    its peer (C(Connection closed by peer) in its log) is passed over for another rank's exit that is not such a
    consequence (a rank killed by a signal), whichever node's launcher noticed first.
  - The diagnosis (C(plugins/module_utils/run/diagnose.py)) looks for known patterns in the launcher and rank logs -
    the hostfile fallback, RDMA that cannot initialize, collective and rendezvous timeouts, CUDA out of memory, an
    invalid device ordinal, SSH host key and permission errors, a master port in use, a missing Python module, an
    NCCL version mismatch, a rank killed by a signal - and for versions that differ between the nodes. Each finding
    has an C(id), the C(cause), the C(remedy), and the first C(file) and C(line) that matched.
  - C(report.md) shows the status and problems, what failed (with the last lines of that rank's log), the diagnosis,
    a table of the run (model, backend, entrypoint, world size, steps, losses, tokens/s, wall time, exit status), the
    ranks per host, the versions per host, and the plots. The plots are drawn only when the ranks wrote step records
    - loss and throughput from the lowest rank, step time for every rank labelled with its host, so that a slow node
    stands out.
author:
  - multinode.deepspeed developers (@multinode)
attributes:
  check_mode:
    support: full
    description: Computes the result and reports C(changed) without writing anything.
  diff_mode:
    support: none
    description: Shows no diff.
"""

EXAMPLES = r"""
- name: Summarize the collected run
  multinode.deepspeed.run_summary:
    run_dir: "runs/{{ run_id }}"
    run_id: "{{ run_id }}"
    world_size: 2
    launcher_rc: 0
  delegate_to: localhost
"""

RETURN = r"""
message:
  description:
    - The outcome in a few lines, which C(train.yml) prints - world size, hosts, loss or the script, time; or why the
      run failed (the first failed rank, its last log lines, the diagnosis with its fix) - and where the report is.
    - 'For a successful run - C(Run <run_id>: world size <W> on <host> ranks [<r>, ...], ...), then
      C(Loss <first> -> <last> in <N> steps, <S> s) (for a user''s script C(<entrypoint> finished on every rank in
      <S> s)), C(Report: <run_dir>/report.md) and C(Summary: <run_dir>/summary.json).'
    - 'For a failed run - C(Run <run_id> failed: <problems, separated by ;>), C(Lost first: <nodes>) when the run lost
      nodes, C(Failed first: rank <R> on <host>, exit code <code>) (C(Then failed) when it failed because of a lost
      node), C(Last lines of <log>:) with its last 15 lines, one V(Diagnosis (<id>\): <cause> Fix: <remedy>) line per
      finding, and C(Report: <run_dir>/report.md).'
  returned: always
  type: str
summary:
  description: The summary written to C(summary.json) (sorted keys, indented), with the keys of O(extra) added.
  returned: always
  type: dict
  contains:
    run_id:
      description: The run's id.
      type: str
    status:
      description: C(success) or C(failed).
      type: str
    problems:
      description: Why the run counts as failed, the cause first (see the notes).
      type: list
      elements: str
    exit_status:
      description: The launchers' exit code (O(launcher_rc)), or null when unknown.
      type: int
    world_size:
      description: The world size the ranks reported (without O(expect_metrics), O(world_size) as given).
      type: int
    hosts:
      description:
        - 'Host name to the list of its global ranks, for example C({"worker1": [0], "worker2": [1]}); without
          metrics, taken from the rank logs and the hostfile.'
      type: dict
    ranks:
      description: Per rank (as a string) - C(host), C(local_rank), C(world_size), C(steps), C(last_step), C(finished),
        C(mean_step_time).
      type: dict
    steps:
      description: Distinct steps recorded.
      type: int
    last_step:
      description: The last step recorded.
      type: int
    first_loss:
      description: The mean loss at the first step.
      type: float
    last_loss:
      description: The mean loss at the last step.
      type: float
    loss_fell:
      description: Whether the loss fell from the first step to the last.
      type: bool
    mean_tokens_per_sec:
      description: The mean of the per-step tokens/s.
      type: float
    wall_time:
      description: O(wall_time) as given (or from O(started)).
      type: float
    resume:
      description: For a resumed run, C(from_tag) (the checkpoint it loaded), C(start_step) and C(skipped) (torn
        checkpoints it skipped); null for a run from scratch.
      type: dict
    failure:
      description:
        - The first failure - C(host), C(rank), C(local_rank), C(exit_code), C(signal), C(line), and when the rank's
          log exists C(log) and C(last_lines) (its last 15 lines); C(consequence_of) when it failed because of a lost
          node; null when none.
      type: dict
    lost:
      description: The nodes the run lost (O(lost) and the abort record's), sorted.
      type: list
      elements: str
    abort:
      description: The abort record, or null.
      type: dict
    diagnosis:
      description: The findings, each C(id), C(cause), C(remedy), C(file), C(line).
      type: list
      elements: dict
    versions:
      description: Per node, the versions its agent reported (python, torch, deepspeed, transformers, ...).
      type: dict
    nodes:
      description: Per node - C(role), C(state), C(exit_code), C(reason), C(left_pids) (run processes the agent could
        not stop).
      type: dict
    rank_logs:
      description: Per rank - C(host) and C(log) (its path relative to the run directory).
      type: dict
    environment:
      description:
        - The ranks' whole environment (C(rank.env)), with the values of keys containing C(TOKEN), C(SECRET),
          C(PASSWORD), C(PASSWD), C(CREDENTIAL), C(API_KEY), C(ACCESS_KEY) or C(PRIVATE_KEY) replaced by
          C(********), unless the key ends in C(_PATH) or C(_FILE).
      type: dict
    scheduler:
      description: The launch backend's record of the job (slurm - job id, state, exit code, elapsed, nodes).
      returned: when the backend left C(scheduler.json)
      type: dict
path:
  description: Path of C(summary.json).
  returned: always
  type: str
report:
  description: Path of C(report.md).
  returned: always
  type: str
plots:
  description: Paths of the PNG plots.
  returned: always
  type: list
  elements: str
"""

import glob
import json
import os
import re
import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.diagnose import (
    abort_host_first, diagnose, first_failure)
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.hostfile import build, parse
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


def _read(path, limit=4 * 1024 * 1024):
    try:
        with open(path, errors="replace") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - limit))
            return fh.read()
    except OSError:
        return ""


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
        return "\n".join(lines + ["Report: %s" % report])
    hosts = summary.get("hosts") or {}
    ranks = ", ".join("%s ranks %s" % (h, r) for h, r in sorted(hosts.items())) or (summary.get("hostfile") or "").strip()
    lines = ["Run %s: world size %s on %s" % (summary.get("run_id"), summary.get("world_size"), ranks)]
    if summary.get("first_loss") is not None:
        lines.append("Loss %.3f -> %.3f in %s steps, %s s" % (
            summary["first_loss"], summary["last_loss"], summary.get("steps"), secs))
    else:
        lines.append("%s finished on every rank in %s s" % (summary.get("entrypoint"), secs))
    return "\n".join(lines + ["Report: %s" % report, "Summary: %s" % path])


def main():
    module = AnsibleModule(
        argument_spec=dict(
            run_dir=dict(type="path", required=True),
            run_id=dict(type="str", required=True),
            world_size=dict(type="int"),
            launcher_rc=dict(type="int"),
            wall_time=dict(type="float"),
            coordinator=dict(type="str"),
            expect_metrics=dict(type="bool", default=True),
            plots=dict(type="bool", default=True),
            plots_in_background=dict(type="bool", default=False),
            extra=dict(type="dict", default={}),
            started=dict(type="float"),
            addresses=dict(type="dict", default={}),
            lost=dict(type="list", elements="str", default=[]),
            cause=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["wall_time"] is None and p["started"] is not None:
        p["wall_time"] = max(0.0, time.time() - p["started"])
    if p["plots"] and not HAS_MATPLOTLIB:
        module.fail_json(msg=missing_required_lib("matplotlib"))
    run = _read_run(p["run_dir"])
    _write_report(module, p, run, _summarize(p, run))


def _read_json(path, unreadable):
    """A JSON record the run left; None when there is none, ``unreadable`` when it is not JSON."""
    if not os.path.exists(path):
        return None
    try:
        return json.loads(_read(path))
    except ValueError:
        return unreadable


def _read_run(run_dir):
    """What the run left in its directory: the ranks' metrics, the agents' last heartbeats, the launchers' and
    the ranks' logs, the hostfile's layout (and so each rank's host) and the ABORT record."""
    run = {"records": {}, "nodes": {}, "launcher_logs": {}, "rank_logs": {}, "layout_hosts": [], "rank_host": {}}
    for path in sorted(glob.glob(os.path.join(run_dir, "metrics", "rank*.jsonl"))):
        m = re.search(r"rank(\d+)\.jsonl$", path)
        run["records"][int(m.group(1))] = read_jsonl(_read(path))
    for path in sorted(glob.glob(os.path.join(run_dir, "nodes", "*.json"))):
        try:
            beat = json.loads(_read(path))
        except ValueError:
            continue
        run["nodes"][beat.get("host") or os.path.basename(path)[:-5]] = beat
    if os.path.exists(os.path.join(run_dir, "nodes")):
        for path in sorted(glob.glob(os.path.join(run_dir, "nodes", "*.launcher.log"))):
            run["launcher_logs"][os.path.basename(path)[:-len(".launcher.log")]] = _read(path)
    for path in sorted(glob.glob(os.path.join(run_dir, "logs", "*_rank*.log"))):
        m = re.search(r"_rank(\d+)\.log$", path)
        run["rank_logs"][int(m.group(1))] = path
    if os.path.exists(os.path.join(run_dir, "hostfile")):
        layout = build(parse(_read(os.path.join(run_dir, "hostfile"))))
        run["layout_hosts"] = layout["hosts"]
        run["rank_host"] = dict((r["rank"], r["host"]) for r in layout["ranks"])
    run["abort"] = _read_json(os.path.join(run_dir, "control", "ABORT"), {"reason": "unreadable abort record"})
    return run


def _summarize(p, run):
    """The run's summary: its metrics, then what failed first and why, the logs' diagnosis, the nodes, the ranks'
    environment and the scheduler's record of the run."""
    run_dir, nodes, rank_logs, abort = p["run_dir"], run["nodes"], run["rank_logs"], run["abort"]
    launcher_rc = p["launcher_rc"] if p["launcher_rc"] is not None else launcher_exit(nodes)
    summary = summarize(p["run_id"], run["records"], expected_world_size=p["world_size"], launcher_rc=launcher_rc,
                        wall_time=p["wall_time"], coordinator=p["coordinator"],
                        launcher_log="\n".join(run["launcher_logs"].values()), expect_metrics=p["expect_metrics"],
                        rank_hosts=run["rank_host"],
                        coordinator_machine=(nodes.get(p["coordinator"]) or {}).get("machine"))
    rank_texts = dict((rank, _read(path)) for rank, path in rank_logs.items())
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
    env_file = os.path.join(run_dir, "rank.env")
    summary["environment"] = rank_environment(_read(env_file if os.path.exists(env_file) else os.path.join(
        run_dir, ".deepspeed_env")))
    # A scheduler's record of the run (the slurm backend: job id, state, exit code, elapsed, nodes).
    scheduler = os.path.join(run_dir, "scheduler.json")
    if os.path.exists(scheduler):
        summary["scheduler"] = _read_json(scheduler, {"error": "unreadable scheduler.json"})
    if not summary["hosts"] and rank_logs:
        summary["hosts"] = hosts_by_log(rank_logs, run["rank_host"])
    summary.update(p["extra"])
    return summary


def _write_report(module, p, run, summary):
    """summary.json, the plots and report.md in the run directory (nothing in check mode), and the module's result."""
    run_dir = p["run_dir"]
    out = os.path.join(run_dir, "summary.json")
    text = json.dumps(summary, indent=2, sort_keys=True) + "\n"
    changed = not os.path.exists(out) or _read(out) != text
    plots = []
    if not module.check_mode:
        with open(out, "w") as fh:
            fh.write(text)
        if p["plots"]:
            plots = _plots(run, os.path.join(run_dir, "plots"), p["plots_in_background"])
        with open(os.path.join(run_dir, "report.md"), "w") as fh:
            fh.write(markdown(summary, [os.path.relpath(x, run_dir) for x in plots]))
    report = os.path.join(run_dir, "report.md")
    module.exit_json(changed=changed, summary=summary, path=out, report=report, plots=plots,
                     message=message(summary, report, out))


def _plots(run, out_dir, background):
    """The run's plots, drawn here, or (``background``) in a child process that outlives this module: its
    standard streams go to /dev/null, so that Ansible's read of this module's answer ends when the module does."""
    if not background or not plot_paths(run["records"], out_dir):
        return plot_series(run["records"], run["rank_host"], out_dir)
    try:
        pid = os.fork()
    except OSError:
        return plot_series(run["records"], run["rank_host"], out_dir)
    if pid:
        return plot_paths(run["records"], out_dir)
    try:  # the child: no exception leaves it, whatever happens
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        plot_series(run["records"], run["rank_host"], out_dir)
    finally:
        os._exit(0)


if __name__ == "__main__":
    main()
