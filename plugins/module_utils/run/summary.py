# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Summaries of collected runs, from the per-rank metrics JSON lines.

Pure Python, no Ansible import: unit-tested on the controller.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os

from ansible_collections.multinode.deepspeed.plugins.module_utils.common.secret_names import mask_env


def read_jsonl(text):
    """Records of a JSON-lines text; a torn last line (a rank killed mid-write) is skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def launcher_exit(nodes):
    """The launchers' exit code from the agents' last heartbeats: the first non-zero one, else 0;
    None when a launcher never reported one."""
    codes = [b.get("exit_code") for b in nodes.values() if b.get("role") == "launcher"]
    if not codes:
        return None
    for code in codes:
        if code not in (0, None):
            return code
    return None if None in codes else 0


def summarize(run_id, records_by_rank, expected_world_size=None, launcher_rc=None, wall_time=None,
              coordinator=None, launcher_log="", expect_metrics=True, rank_hosts=None, coordinator_machine=None):
    """Build the run's summary from ``{rank: [records...]}``.

    ``rank_hosts``: rank -> inventory name, from the run's hostfile.  It names each rank's host
    (the names users see); the host the ranks' records give is used only for ranks it lacks.
    ``coordinator_machine``: the coordinator's own hostname (its agent reports it): a rank whose
    start record names that machine ran on the coordinator, whatever name the hostfile gives it.

    The run counts as successful only when the launcher exited 0, every expected
    rank wrote its ``done`` record, the ranks agree on the world size, and the
    launcher did not fall back to a local node (DeepSpeed exits 0 in such cases).
    """
    ranks, steps, on_coordinator = rank_summaries(records_by_rank, rank_hosts, coordinator, coordinator_machine)
    hosts = {}
    for rank, info in sorted(ranks.items()):
        hosts.setdefault(info["host"], []).append(rank)
    problems = rank_problems(ranks, expected_world_size, expect_metrics) + launcher_problems(launcher_rc, launcher_log)
    if coordinator is not None and (coordinator in hosts or on_coordinator):
        problems.append("the coordinator %s ran ranks %s" % (
            coordinator, hosts.get(coordinator) or on_coordinator))
    summary = {
        "run_id": run_id,
        "status": "success" if not problems else "failed",
        "problems": problems,
        "exit_status": launcher_rc,
        "world_size": agreed_world_size(ranks) if expect_metrics else expected_world_size,
        "hosts": hosts,
        "ranks": {str(k): v for k, v in sorted(ranks.items())},
    }
    summary.update(step_totals([steps[k] for k in sorted(steps)]))
    summary.update(wall_time=wall_time, resume=resumed_from(records_by_rank))
    return summary


def _start_record(records):
    return next((r for r in records if r.get("event") == "start"), {})


def rank_summaries(records_by_rank, rank_hosts=None, coordinator=None, coordinator_machine=None):
    """Each rank's host, world size and steps (``{rank: info}``), the step records by step number (the first
    rank's record of a step stands for it) and the ranks that ran on the coordinator (by the host their records
    name, or the machine their start record names)."""
    ranks = {}
    steps = {}
    on_coordinator = []
    for rank in sorted(records_by_rank):
        recs = records_by_rank[rank]
        start = _start_record(recs)
        done = next((r for r in recs if r.get("event") == "done"), None)
        step_recs = [r for r in recs if r.get("event") == "step"]
        recorded = start.get("host") or (step_recs[0].get("host") if step_recs else None)
        host = (rank_hosts or {}).get(rank) or recorded
        if (coordinator is not None and recorded == coordinator) or \
                (coordinator_machine is not None and start.get("machine") == coordinator_machine):
            on_coordinator.append(rank)
        ranks[rank] = {
            "host": host,
            "local_rank": start.get("local_rank"),
            "world_size": start.get("world_size"),
            "steps": len(step_recs),
            "last_step": step_recs[-1]["step"] if step_recs else None,
            "finished": done is not None,
            "mean_step_time": (sum(r["step_time"] for r in step_recs) / len(step_recs)) if step_recs else None,
        }
        for r in step_recs:
            steps.setdefault(r["step"], r)
    return ranks, steps, on_coordinator


def _world_sizes(ranks):
    return {v["world_size"] for v in ranks.values() if v["world_size"] is not None}


def agreed_world_size(ranks):
    """The world size the ranks report; None when none reports one or they disagree."""
    world_sizes = _world_sizes(ranks)
    return world_sizes.pop() if len(world_sizes) == 1 else None


def rank_problems(ranks, expected_world_size=None, expect_metrics=True):
    """What the ranks' records say went wrong: ranks that did not finish, a world size they disagree on or
    that is not the hostfile's, ranks that wrote no metrics."""
    problems = []
    if expect_metrics:
        problems += ["rank %s on %s did not finish" % (rank, info["host"])
                     for rank, info in sorted(ranks.items()) if not info["finished"]]
    if len(_world_sizes(ranks)) > 1:
        problems.append("ranks disagree on the world size")
    if expected_world_size is not None and expect_metrics:
        world_size = agreed_world_size(ranks)
        if world_size != expected_world_size:
            problems.append("world size %s, expected %s from the hostfile" % (world_size, expected_world_size))
        missing = sorted(set(range(expected_world_size)) - set(ranks))
        if missing:
            problems.append("no metrics from ranks %s" % ", ".join(map(str, missing)))
    return problems


def launcher_problems(launcher_rc, launcher_log=""):
    """What the launcher says went wrong: DeepSpeed fell back to the local node, the launcher failed or never
    finished."""
    problems = []
    if "Unable to find hostfile" in (launcher_log or ""):
        problems.append("DeepSpeed did not find the hostfile and fell back to the local node")
    if launcher_rc is None:
        problems.append("the launcher's exit code is unknown (it never finished)")
    elif launcher_rc != 0:
        problems.append("the launcher exited with %s" % launcher_rc)
    return problems


def resumed_from(records_by_rank):
    """A resumed run: the step it started from, the checkpoint it loaded and the torn ones it skipped (rank 0's
    start record); None for a run from scratch."""
    start0 = _start_record(records_by_rank.get(0, []))
    if not start0.get("resumed_from"):
        return None
    return {"from_tag": start0["resumed_from"], "start_step": start0.get("start_step"),
            "skipped": start0.get("skipped_checkpoints") or []}


def step_totals(ordered):
    """The run's progress from its step records in step order: steps, last step, first and last loss, whether
    the loss fell, the mean throughput."""
    losses = [r["loss"] for r in ordered if r.get("loss") is not None]
    tps = [r["tokens_per_sec"] for r in ordered if r.get("tokens_per_sec")]
    return {
        "steps": len(ordered),
        "last_step": ordered[-1]["step"] if ordered else None,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "loss_fell": bool(losses) and losses[-1] < losses[0],
        "mean_tokens_per_sec": (sum(tps) / len(tps)) if tps else None,
    }


def lost_nodes(abort, reported=()):
    """The nodes the run lost: those its abort record names and ``reported`` (the ones the watch cannot reach)."""
    return sorted(set((abort or {}).get("lost") or []) | set(reported))


def blame(summary, failure, abort, lost, cause=None):
    """Put the cause first in ``summary``'s problems, and fail the run when there is one: what the watch found
    beside the ranks and nodes (``cause``, a full disk), then a lost node, then the rank that failed first
    (``failure``, from diagnose.first_failure), else who aborted the run.  A rank on another node that failed
    after a node was lost failed because its peer went away: ``failure`` records it as a consequence."""
    cause = cause or (abort or {}).get("cause")
    _blame_ranks(summary, failure, abort, lost, quiet_abort=bool(cause))
    if cause:
        summary["status"] = "failed"
        summary["problems"].insert(0, cause)
        if failure is not None:
            failure["consequence_of"] = cause


def _blame_ranks(summary, failure, abort, lost, quiet_abort=False):
    if failure is not None:
        rank = failure.get("rank")
        summary["status"] = "failed"
        if lost and failure.get("host") not in lost:
            # A rank elsewhere failed because the lost node's ranks went away: a consequence, not the cause.
            failure["consequence_of"] = lost
            summary["problems"].insert(0, "rank %s on %s failed because its peer went away (exit code %s)" % (
                rank, failure.get("host"), failure.get("exit_code")))
        else:
            summary["problems"].insert(0, "rank %s on %s exited with %s%s" % (
                rank, failure.get("host"), failure.get("exit_code"),
                " (%s)" % failure["signal"] if failure.get("signal") else ""))
    if abort:
        summary["status"] = "failed"
        if lost:
            summary["problems"].insert(0, "%s was lost: %s" % (", ".join(lost), abort.get("reason")))
        elif failure is None and not quiet_abort:
            summary["problems"].insert(0, "the run was aborted by %s: %s" % (abort.get("host"), abort.get("reason")))


def node_report(nodes):
    """What the summary keeps of the agents' last heartbeats (``{host: heartbeat}``): each node's versions, and
    its role, state, exit code, why it stopped and what the run left running there (``left_pids``, see
    ``left_behind``); ``left_pids`` also by host, for the nodes that have any (never a failure of the run)."""
    left = dict((h, left_behind(b)) for h, b in sorted(nodes.items()))
    return {
        "versions": dict((h, b.get("versions")) for h, b in sorted(nodes.items())),
        "nodes": dict((h, {"role": b.get("role"), "state": b.get("state"), "exit_code": b.get("exit_code"),
                           "reason": b.get("reason"), "left_pids": left[h]})
                      for h, b in sorted(nodes.items())),
        "left_pids": dict((h, entries) for h, entries in left.items() if entries),
    }


def left_behind(beat):
    """What the run left on a node, from its agent's last heartbeat: ``[{"pid", "cmd", "stopped"}]`` - the processes
    still there after the launcher's exit (a watcher: after DONE), which the agent stopped after a short grace
    (its ``left_pids``), then any of the run's processes its last heartbeat still lists (``pids``: the agent did
    not stop them, or it died while they ran)."""
    out = []
    for entry in beat.get("left_pids") or []:
        if isinstance(entry, dict) and isinstance(entry.get("pid"), int):
            out.append({"pid": entry["pid"], "cmd": entry.get("cmd"), "stopped": bool(entry.get("stopped"))})
    listed = dict((e["pid"], e) for e in out)
    for pid in beat.get("pids") or []:
        if pid in listed:
            listed[pid]["stopped"] = False
        elif isinstance(pid, int):
            out.append({"pid": pid, "cmd": None, "stopped": False})
    return out


def rank_log_index(rank_logs, rank_host, run_dir):
    """``{rank: log path}`` -> ``{"rank": {"host", "log"}}``, the log relative to the run directory."""
    return dict((str(r), {"host": rank_host.get(r), "log": os.path.relpath(path, run_dir)})
                for r, path in sorted(rank_logs.items()))


def hosts_by_log(rank_logs, rank_host):
    """Ranks per host from the ranks' logs, for a run without metrics (a user's script)."""
    hosts = {}
    for r in sorted(rank_logs):
        hosts.setdefault(rank_host.get(r), []).append(r)
    return hosts


def rank_environment(text):
    """The ranks' environment from its file's ``KEY=VALUE`` lines, with the secrets' values masked."""
    env = {}
    for line in text.splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            env[key] = value
    return mask_env(env)
