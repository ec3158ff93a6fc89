# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Summaries of collected runs, from the per-rank metrics JSON lines.

Pure Python, no Ansible import: unit-tested on the controller.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json


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
    problems = []
    ranks = {}
    steps = {}
    on_coordinator = []
    for rank in sorted(records_by_rank):
        recs = records_by_rank[rank]
        start = next((r for r in recs if r.get("event") == "start"), {})
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
        if done is None and expect_metrics:
            problems.append("rank %s on %s did not finish" % (rank, host))
    world_sizes = {v["world_size"] for v in ranks.values() if v["world_size"] is not None}
    world_size = world_sizes.pop() if len(world_sizes) == 1 else None
    if len(world_sizes) > 1:
        problems.append("ranks disagree on the world size")
    if expected_world_size is not None and expect_metrics:
        if world_size != expected_world_size:
            problems.append("world size %s, expected %s from the hostfile" % (world_size, expected_world_size))
        missing = sorted(set(range(expected_world_size)) - set(ranks))
        if missing:
            problems.append("no metrics from ranks %s" % ", ".join(map(str, missing)))
    if "Unable to find hostfile" in (launcher_log or ""):
        problems.append("DeepSpeed did not find the hostfile and fell back to the local node")
    if launcher_rc is None:
        problems.append("the launcher's exit code is unknown (it never finished)")
    elif launcher_rc != 0:
        problems.append("the launcher exited with %s" % launcher_rc)
    hosts = {}
    for rank, info in sorted(ranks.items()):
        hosts.setdefault(info["host"], []).append(rank)
    if coordinator is not None and (coordinator in hosts or on_coordinator):
        problems.append("the coordinator %s ran ranks %s" % (
            coordinator, hosts.get(coordinator) or on_coordinator))
    # A resumed run: the step it started from, the checkpoint it loaded and the torn ones it skipped (rank 0's).
    start0 = next((r for r in records_by_rank.get(0, []) if r.get("event") == "start"), {})
    resume = None
    if start0.get("resumed_from"):
        resume = {"from_tag": start0["resumed_from"], "start_step": start0.get("start_step"),
                  "skipped": start0.get("skipped_checkpoints") or []}
    ordered = [steps[k] for k in sorted(steps)]
    losses = [r["loss"] for r in ordered if r.get("loss") is not None]
    tps = [r["tokens_per_sec"] for r in ordered if r.get("tokens_per_sec")]
    return {
        "run_id": run_id,
        "status": "success" if not problems else "failed",
        "problems": problems,
        "exit_status": launcher_rc,
        "world_size": world_size if expect_metrics else expected_world_size,
        "hosts": hosts,
        "ranks": {str(k): v for k, v in sorted(ranks.items())},
        "steps": len(ordered),
        "last_step": ordered[-1]["step"] if ordered else None,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "loss_fell": bool(losses) and losses[-1] < losses[0],
        "mean_tokens_per_sec": (sum(tps) / len(tps)) if tps else None,
        "wall_time": wall_time,
        "resume": resume,
    }


SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "API_KEY", "ACCESS_KEY", "PRIVATE_KEY")


def secret_name(key):
    """Does the variable's name say it holds a secret (a path to one, ``*_PATH``/``*_FILE``, does not)?"""
    upper = str(key).upper()
    return any(w in upper for w in SECRET_WORDS) and not upper.endswith(("_PATH", "_FILE"))


def mask_env(env):
    """The environment with the values of secret-looking variables replaced (paths to secrets are kept)."""
    return dict((key, "********" if secret_name(key) else value) for key, value in env.items())
