# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Recovery of a failed run: why an attempt ended, whether another one starts, on which nodes, which nodes are
quarantined, and how much of the wall time counted (goodput).

Pure Python, no Ansible import: unit-tested on the controller.  The input is what an attempt's summary
(``run_summary``'s ``summary.json``) says about it.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import re
import time

from ansible_collections.multinode.deepspeed.plugins.module_utils.common import records
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.lock import guarded, write_whole
from ansible_collections.multinode.deepspeed.plugins.module_utils.run import grow

# What ended an attempt.  The first six may be retried; the others never are.
LOST, STALLED, KILLED, ERROR, LAUNCHER = "lost", "stalled", "killed", "error", "launcher"
# The watch stopped the attempt to move it off a slow node (on_straggler=replace; module_utils/run/stragglers.py).
STRAGGLER = "straggler"
# The watch stopped a shrunken attempt at a checkpoint because a node it lacks answers again (module_utils/run/grow.py).
GROW = grow.GROW
SUCCESS, INTERRUPTED, TIMEOUT, DISK, QUEUE, UNKNOWN = "success", "interrupted", "timeout", "disk", "queue", "unknown"
RECOVERABLE = (LOST, STALLED, KILLED, ERROR, LAUNCHER, STRAGGLER, GROW)
NOT_RETRIED = {
    INTERRUPTED: "stopped by the user (Ctrl-C); not retried",
    TIMEOUT: "the run's timeout covers every attempt; not retried",
    DISK: "a full disk fails the next attempt too; not retried",
    QUEUE: "the job waited in the queue too long; not retried",
    UNKNOWN: "the cause is not known; not retried",
}

# The words of the watch's and the summary's reasons that name each ending (module_utils/run/watch.py).
_REASONS = (
    (STRAGGLER, re.compile(r"^\S+ is a straggler: ")),
    (INTERRUPTED, re.compile(r"^interrupted|Ctrl-C|KeyboardInterrupt")),
    (TIMEOUT, re.compile(r"exceeded its timeout")),
    (DISK, re.compile(r"^disk full")),
    (QUEUE, re.compile(r"waited in the queue")),
    (STALLED, re.compile(r"stall", re.I)),
    (LAUNCHER, re.compile(r"no agent started on|launcher .*(died|gone)")),
)
# A launcher that exited non-zero: the rank that failed first, when one did, says more.
_LAUNCHER_EXIT = re.compile(r"the launcher on \S+ exited")
# A node the scheduler itself gave up on (multinode_ds/slurm.py's words: DOWN, FAIL or not responding, or a job
# that ended NODE_FAIL): the node is lost, whatever a rank said after.
_SCHEDULER_LOST = re.compile(r"\bnode (\S+) is [A-Z_]+[*~#!%$@^+-]* in Slurm|ended NODE_FAIL: node (\S+) failed")


def _reason(summary):
    """The first words that say why the attempt ended: the watch's reason, else the abort's, else the first
    problem."""
    watch = summary.get("watch") or {}
    abort = summary.get("abort") or {}
    problems = summary.get("problems") or []
    return str(watch.get("reason") or abort.get("cause") or abort.get("reason") or (problems[0] if problems else ""))


def _last_line(failure):
    """The failed rank's last log line that says something (its error), or the launcher's exit line."""
    lines = [ln.strip() for ln in str((failure or {}).get("last_lines") or "").splitlines() if ln.strip()]
    return lines[-1][-300:] if lines else str((failure or {}).get("line") or "")[-300:]


def gone_nodes(summary):
    """The nodes of a failed attempt whose agent never ended its part (its last record still says running) while
    the others did: the node went away - stopped, rebooted, its agent killed - even when it answered again before
    the watch looked, and a peer's rank failing first was a consequence."""
    nodes = summary.get("nodes") or {}
    if summary.get("status") == "success" or not any(n.get("state") in ("aborted", "finished") for n in nodes.values()):
        return []
    return sorted(h for h, n in nodes.items() if n.get("state") == "running")


# A pod whose Kubernetes Node stopped reporting, or that the Node lost (the words of pod_problems in
# module_utils/launch/backends/kubernetes/pods.py).
_K8S_NODE = re.compile(r"\bpod \S+ on node ([a-z0-9][a-z0-9.-]*)")


def scheduler_nodes(summary, kind):
    """The scheduler's own nodes (Kubernetes Nodes) behind a lost attempt, from the watch's reason and problems:
    the next attempt's pods are kept off them."""
    if kind != LOST:
        return []
    text = " ".join([_reason(summary)] + [str(p) for p in summary.get("problems") or []])
    return sorted(set(_K8S_NODE.findall(text)))


def scheduler_lost(reason):
    """The node a scheduler's verdict in ``reason`` names as lost (``[node]``), or ``[]``."""
    match = _SCHEDULER_LOST.search(reason or "")
    return [match.group(1) or match.group(2)] if match else []


def ending(summary):
    """Why an attempt ended, from its summary: ``{"kind", "why", "nodes" (the nodes that failed), "step" (the last
    step a rank recorded, or None), "signature" (rank, step and last line of the failure; None without one)}``."""
    failure = summary.get("failure") or {}
    reason = _reason(summary)
    lost = list(summary.get("lost") or []) or gone_nodes(summary) or scheduler_lost(reason)
    step = summary.get("last_step")
    # The bundled trainer records its steps; a user's script does not, so its step is never known.
    metrics = summary.get("entrypoint") in (None, "multinode_ds.train")
    out = {"kind": UNKNOWN, "why": reason, "nodes": lost, "step": step, "signature": None, "metrics": metrics,
           "scheduler_nodes": []}
    if summary.get("status") == "success":
        out.update(kind=SUCCESS, why="finished", nodes=[])
        return out
    if grow.named(reason):
        # Not a failure: the nodes named answer again, and the next attempt takes them back.
        out.update(kind=GROW, nodes=grow.named(reason), why=reason)
        return out
    kind = next((k for k, pattern in _REASONS if pattern.search(reason)), None)
    if kind in (INTERRUPTED, TIMEOUT, DISK, QUEUE):
        out["kind"] = kind
        return out
    if kind == STRAGGLER:
        # Alive and slow: the node is named by the watch, not lost; the next attempt runs without it.
        out.update(kind=STRAGGLER, nodes=[reason.split(" ", 1)[0]], why=reason)
        return out
    if lost:
        at = " at step %s" % step if step else ""
        out.update(kind=LOST, why="%s lost%s (%s)" % (", ".join(lost), at, reason or "no heartbeat"),
                   scheduler_nodes=scheduler_nodes(summary, LOST))
        return out
    if kind is None and failure.get("exit_code") is not None:
        kind = KILLED if failure.get("signal") else ERROR
    if kind is None and _LAUNCHER_EXIT.search(reason):
        kind = LAUNCHER
    if kind is None:
        return out
    host = failure.get("host")
    out.update(kind=kind, nodes=[host] if host else [])
    if failure:
        # A signal says what happened to the rank; an error, its last log line.
        what = "killed by %s" % failure.get("signal") if kind == KILLED else _last_line(failure)
        out["signature"] = [failure.get("rank"), step, what]
        at = " at step %s" % step if step is not None else ""
        if kind == KILLED:
            out["why"] = "rank %s on %s killed by %s%s" % (failure.get("rank"), host, failure.get("signal"), at)
        elif kind == ERROR:
            out["why"] = "rank %s on %s exited with %s%s: %s" % (failure.get("rank"), host, failure.get("exit_code"),
                                                                 at, what)
    return out


def judge(attempts, restarts):
    """Whether another attempt starts after the last of ``attempts`` (each an ``ending`` with its ``attempt``
    number), with ``restarts`` the budget: ``(retry, why)``."""
    last = attempts[-1]
    number = len(attempts)
    if last["kind"] == SUCCESS:
        return False, "finished"
    if last["kind"] not in RECOVERABLE:
        return False, NOT_RETRIED.get(last["kind"], NOT_RETRIED[UNKNOWN])
    if number == 1 and last.get("metrics", True) and not last.get("step") and last["kind"] != LOST:
        # A node lost before the first step is not the run's fault; an error, a kill or a stall then may be.
        return False, "failed before its first step (a bad config, an import error): not retried"
    if number >= 2 and last.get("signature") and last["signature"] == attempts[-2].get("signature"):
        rank, step, line = last["signature"]
        where = "rank %s%s" % (rank, " at step %s" % step if step is not None else "")
        return False, "the same failure twice (%s: %s); not retried" % (where, line)
    if number > restarts:
        return False, "the restart budget is spent (restarts=%d)" % restarts
    return True, "%s: retried (attempt %d of at most %d)" % (last["kind"], number + 1, restarts + 1)


def next_nodes(nodes, failed, back, spares, quarantined, min_nodes=None):
    """Where the next attempt runs: ``{"nodes", "replaced": {failed: spare}, "dropped": [...]}`` or
    ``{"error": why}``.

    ``nodes``: the last attempt's rank nodes, in order; ``failed``: those that failed; ``back``: the failed ones
    that came back and passed their check; ``spares``: the spare nodes free for this run, in order;
    ``quarantined``: nodes never used; ``min_nodes``: the fewest nodes the run may go on with (None: as many as
    now)."""
    free = [s for s in spares if s not in nodes and s not in quarantined]
    out, replaced, dropped = [], {}, []
    for node in nodes:
        if node not in failed or (node in back and node not in quarantined):
            out.append(node)
        elif free:
            replaced[node] = free.pop(0)
            out.append(replaced[node])
        else:
            dropped.append(node)
    floor = len(nodes) if min_nodes is None else int(min_nodes)
    if not out or len(out) < floor:
        gone = ", ".join(dropped)
        return {"error": "%s did not come back and no spare is free: %d node(s) left, %d needed. Fix: add a node "
                         "to the spares group, or -e min_nodes=%d to go on with fewer" % (
                             gone, len(out), floor, max(len(out), 1))}
    return {"nodes": out, "replaced": replaced, "dropped": dropped}


# The endings that are a node's fault (an exception of the script's, or a rank the OOM killer chose, is not).
NODE_FAULTS = (LOST, STALLED, LAUNCHER, STRAGGLER)


def failures_by_node(attempts):
    """``{node: [kind, ...]}``: the node faults of each node across ``attempts``."""
    out = {}
    for attempt in attempts:
        if attempt.get("kind") not in NODE_FAULTS:
            continue
        for node in attempt.get("nodes") or []:
            out.setdefault(node, []).append(attempt.get("kind"))
    return out


def to_quarantine(attempts):
    """The nodes that failed twice in this run, and a straggler the watch moved the run off at once, with why:
    ``{node: reason}``."""
    out = {}
    last = attempts[-1] if attempts else {}
    if last.get("kind") == STRAGGLER:
        for node in last.get("nodes") or []:
            out[node] = last.get("why") or "a straggler"
    for node, kinds in failures_by_node(attempts).items():
        if node in out:
            continue
        if len(kinds) >= 2:
            out[node] = "%s twice" % kinds[0] if kinds[0] == kinds[1] else "%s, then %s" % (kinds[0], kinds[1])
    return out


# A record that cannot be read as one (common/records.py): its message names the file and the fix.
RecordError = records.RecordError
RECORDS = records.RECORDS


def read_record(path, key):
    """The entries under ``key`` of the record file at ``path`` (``{}`` when there is none), read without following
    a link (common/records.py).  A file that is a link, empty, not JSON, not a JSON object, or whose ``key`` is not an
    object is an error naming the file and the fix - never taken as empty (that would let every quarantined node or
    held spare out)."""
    return records.read(os.path.expanduser(path) if path else path, key)


def make_records_dir(directory):
    """The records' directory, made when missing with mode 0755 whatever the umask (``node_facts`` reads the records
    as the login account); another play may make it at the same moment."""
    if directory and not os.path.isdir(directory):
        os.makedirs(directory, 0o755, exist_ok=True)
        os.chmod(directory, 0o755)


def write_record(path, key, entries):
    """Write the record file whole (``lock.write_whole``: a temporary file flushed to disk, then renamed over it),
    readable by every account of the coordinator (``node_facts`` reads it as the login account), written by the
    run's."""
    make_records_dir(os.path.dirname(path))
    write_whole(path, json.dumps({key: entries}, indent=2, sort_keys=True) + "\n")


def update_record(path, key, change):
    """Read the record file, apply ``change`` (entries -> (new entries, answer)) and write it back, all under an
    exclusive ``flock`` of ``<path>.lock`` (two plays, or two controllers driving the cluster, never lose each
    other's changes: the file is on the coordinator, whose own filesystem holds the lock); returns the answer.  A
    file that cannot be read is an error (read_record), and is left as it is."""
    path = os.path.expanduser(path)
    make_records_dir(os.path.dirname(path))
    with guarded(path, ".lock"):
        new, answer = change(read_record(path, key))
        write_record(path, key, new)
    return answer


def load_quarantine(path):
    """The quarantine file's nodes (``{node: {"since", "reason", "run_id"}}``); empty when there is none."""
    return read_record(path, "nodes")


def update_quarantine(path, change):
    """``update_record`` of the quarantine file: ``change`` gets its nodes."""
    return update_record(path, "nodes", change)


def save_quarantine(path, nodes):
    """Write the quarantine file whole, under its lock (a change of what was read: update_quarantine)."""
    update_quarantine(path, lambda _old: (nodes, None))


def let_out(quarantine_file, spares_file, names):
    """``-e unquarantine=``: ``names`` let out of the quarantine file and out of any run's hold in the spares file,
    each under its lock; ``{"quarantine": [...], "spares": [...]}``, the names each one held.  A file that holds none
    of them is not written (nor made)."""
    out = {}
    for key, path, release in (("quarantine", quarantine_file, lambda held: quarantine(held, {}, None, names)),
                               ("spares", spares_file, lambda held: release_nodes(held, names))):
        record = "nodes" if key == "quarantine" else "spares"
        found = sorted(n for n in read_record(path, record) if n in names)
        if found:
            found = update_record(path, record, lambda held, release=release: (
                release(held), sorted(n for n in held if n in names)))
        out[key] = found
    return out


def quarantine(nodes, add, run_id, release=(), now=None):
    """``nodes`` (the quarantine file's) with ``add`` (``{node: reason}``) quarantined in ``run_id`` and the nodes
    of ``release`` let out again."""
    out = dict((k, v) for k, v in nodes.items() if k not in release)
    for node, reason in add.items():
        out[node] = {"since": now if now is not None else time.time(), "reason": reason, "run_id": run_id}
    return out


def quarantine_lines(nodes, inventory_nodes):
    """One line for every quarantined node of the inventory, as every plan shows it."""
    lines = []
    for node in sorted(n for n in nodes if n in inventory_nodes):
        rec = nodes[node]
        since = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(float(rec.get("since") or 0)))
        lines.append("%s is quarantined since %s (%s in run %s); -e unquarantine=%s to use it again" % (
            node, since, rec.get("reason"), rec.get("run_id"), node))
    return lines


def counted_steps(attempts):
    """Each attempt's steps that counted: those not done again by a later attempt (``[int]``).  An attempt is
    ``{"start_step", "last_step"}``: the step it resumed from (0: from scratch) and the last one it recorded."""
    out = []
    for i, attempt in enumerate(attempts):
        start = int(attempt.get("start_step") or 0)
        end = int(attempt.get("last_step") or start)
        if i + 1 < len(attempts):
            end = min(end, int(attempts[i + 1].get("start_step") or 0))
        out.append(max(0, end - start))
    return out


def goodput(attempts, wall_time):
    """The share of ``wall_time`` spent on steps that counted: each attempt's counted steps at its mean step
    time (``step_time``); None without a wall time."""
    if not wall_time:
        return None
    useful = sum(n * float(a.get("step_time") or 0) for n, a in zip(counted_steps(attempts), attempts))
    return round(min(1.0, useful / float(wall_time)), 4)


def attempt_record(number, summary, rank0, started):
    """One attempt as the run's summary lists it, from its own summary, rank 0's metrics records and the time it
    started: nodes, start and end, why it ended, the step it resumed from, its last step, its first step's time
    and mean step time."""
    steps = [r for r in rank0 if r.get("event") == "step"]
    end = ending(summary)
    abort = summary.get("abort") or {}
    times = [float(r["time"]) for r in rank0 if r.get("time") is not None]
    return {
        "attempt": number, "nodes": sorted(summary.get("hosts") or {}), "started": started,
        "ended": float(abort.get("time") or (max(times) if times else started or 0)),
        "status": summary.get("status"), "kind": end["kind"], "why": end["why"], "failed_nodes": end["nodes"],
        "start_step": int(((summary.get("resume") or {}).get("start_step")) or 0),
        "last_step": steps[-1]["step"] if steps else None,
        "first_step_time": float(steps[0]["time"]) if steps and steps[0].get("time") is not None else None,
        "step_time": (sum(float(r.get("step_time") or 0) for r in steps) / len(steps)) if steps else None,
        "losses": [[r["step"], r["loss"]] for r in steps if r.get("loss") is not None],
        "batch": summary.get("batch"),
    }


def run_summary(attempts, retries, wall_time):
    """The run's summary over its ``attempts`` (``attempt_record``s, in order; ``retries``: each one's
    ``(retried, why)``): the attempts with the steps each recomputed and the seconds from the fault to the next
    attempt's first step, the goodput, and the run's status (the last attempt's)."""
    out = []
    for i, (attempt, (retried, why)) in enumerate(zip(attempts, retries)):
        rec = dict((k, v) for k, v in attempt.items() if k != "losses")
        rec.update(retried=retried, retry_reason=why, recomputed_steps=0, fault_to_first_step=None)
        if i:
            before = attempts[i - 1]
            rec["recomputed_steps"] = max(0, int(before.get("last_step") or 0) - rec["start_step"])
            if rec.get("first_step_time") is not None and before.get("ended"):
                rec["fault_to_first_step"] = round(rec["first_step_time"] - float(before["ended"]), 1)
            if rec["start_step"] == 0 and before.get("last_step"):
                rec["note"] = "attempt %d started from step 0: the script did not resume" % rec["attempt"]
            batch = rec.get("batch") or {}
            if batch and not batch.get("exact"):
                rec["note"] = ("attempt %d on %d node(s) kept the global batch of %d ranks only approximately "
                               "(gradient accumulation %d)" % (rec["attempt"], len(rec["nodes"]),
                                                               batch["global_world"], batch["grad_accum"]))
        out.append(rec)
    last = attempts[-1]
    return {"attempts": out, "goodput": goodput(attempts, wall_time), "status": last.get("status"),
            "restarted": len(attempts) - 1}


def progress_line(number, restarts, nodes, before):
    """The line the play shows as attempt ``number`` starts: its nodes and why the one ``before`` ended."""
    return "attempt %d/%d on %s (%s)" % (number, restarts + 1, ", ".join(nodes), before["why"])


# The fewest seconds worth starting an attempt for (the plan's least timeout).
LEAST_TIMEOUT = 10


def timeout_left(timeout, started, now):
    """The seconds of the run's ``timeout`` (which covers every attempt) left at ``now`` for the run that
    ``started``; None when too few are left to start another attempt."""
    left = int(float(timeout) - (float(now) - float(started)))
    return left if left >= LEAST_TIMEOUT else None


# Seconds a failed node gets to answer when a free spare can take its place anyway.
QUICK_LOOK = 5


def wait_seconds(failed, spares_free, recover_wait, kind=None):
    """How long the play waits for the failed nodes to answer: a quick look when the free spares can take all their
    places, or when the nodes are those a grow-back saw answer, else ``recover_wait``."""
    return QUICK_LOOK if kind == GROW or len(spares_free) >= len(failed) else int(recover_wait)


def came_back(checks, fingerprints, run_fingerprint=None):
    """The failed nodes that came back, from the play's node reads (``checks``: the loop's results, each with
    ``item`` and, when it answered, ``ansible_facts.multinode_node``) and their stack fingerprints before the
    failure (a node this attempt did not have, one a grow-back takes again: the run's, ``run_fingerprint``):
    ``(back, notes)``, a node whose stack changed is not back."""
    back, notes = [], []
    for result in checks:
        node = result.get("item")
        if result.get("failed") or result.get("unreachable") or result.get("skipped"):
            notes.append("%s did not answer: %s" % (node, str(result.get("msg") or "unreachable")[:200]))
            continue
        now = ((result.get("ansible_facts") or {}).get("multinode_node") or {}).get("stack_fingerprint")
        before = (fingerprints or {}).get(node) or run_fingerprint
        if before and now != before:
            notes.append("%s came back with another stack (fingerprint %s, was %s): not used again" % (
                node, now, before))
            continue
        back.append(node)
    return back, notes


def nodes_to_check(end, reuse_lost=True):
    """The failed nodes of an attempt's ``end`` that the play waits for and checks before they take ranks again:
    none of a node fault where the backend's scheduler keeps such a node out of the run (Slurm drains it)."""
    if end["kind"] == STRAGGLER or (not reuse_lost and end["kind"] in NODE_FAULTS):
        return []
    return list(end["nodes"])


def nodes_to_drain(end, reuse_lost=True):
    """The failed nodes the backend's scheduler is told to keep out (Slurm: DRAIN with the reason)."""
    if reuse_lost or end["kind"] not in NODE_FAULTS:
        return []
    return list(end["nodes"])


def spares_ready(checks, fingerprint):
    """The spares fit to take a place, from the play's reads of them (``checks``: the loop's results, as in
    ``came_back``) and the run's stack fingerprint: ``(ready, notes)``.  This is the replacement's preflight: it
    answers, its agent's Python runs (node_facts ran there), its stack is the run's."""
    ready, notes = [], []
    for result in checks:
        node = result.get("item")
        if result.get("failed") or result.get("unreachable") or result.get("skipped"):
            notes.append("spare %s is not used: it did not answer (%s)" % (
                node, str(result.get("msg") or "unreachable")[:200]))
            continue
        now = ((result.get("ansible_facts") or {}).get("multinode_node") or {}).get("stack_fingerprint")
        if fingerprint and now != fingerprint:
            notes.append("spare %s is not used: its stack (fingerprint %s) is not the run's (%s). Fix: site.yml "
                         "--limit %s" % (node, now, fingerprint, node))
            continue
        ready.append(node)
    return ready, notes


def run_fingerprint(nodes, failed, fingerprints):
    """The run's stack fingerprint: its first node's that did not fail, else its first node's."""
    for node in [n for n in nodes if n not in failed] + list(nodes):
        if (fingerprints or {}).get(node):
            return fingerprints[node]
    return None


# How long a spare stays held by a run without a timeout (a run that ended without giving it back).
HOLD_SECONDS = 24 * 3600


def spares_held(held, run_id, now):
    """The spares another run holds now (``held``: the spares file's ``{node: {"run_id", "until"}}``)."""
    return sorted(n for n, rec in held.items() if rec.get("run_id") != run_id and float(rec.get("until") or 0) > now)


def hold_spares(held, nodes, run_id, now, seconds):
    """``held`` with ``nodes`` held by ``run_id`` for ``seconds`` (the time its timeout leaves it), and the
    records that expired dropped."""
    out = dict((n, r) for n, r in held.items() if float(r.get("until") or 0) > now)
    for node in nodes:
        out[node] = {"run_id": run_id, "since": now, "until": now + float(seconds or HOLD_SECONDS)}
    return out


def release_spares(held, run_id):
    """``held`` without the spares ``run_id`` held."""
    return dict((n, r) for n, r in held.items() if r.get("run_id") != run_id)


def load_spares(path):
    """The spares file's holds (``{node: {"run_id", "since", "until"}}``); empty when there is none."""
    return read_record(path, "spares")


def update_spares(path, change):
    """Read the spares file, apply ``change`` (held -> (new held, answer)) and write it back, under an exclusive
    lock (two plays placing at once never take the same spare); returns the answer."""
    return update_record(path, "spares", change)


def release_nodes(held, nodes):
    """``held`` without the holds on ``nodes``, whichever run holds them (``-e unquarantine=<spare>``: a run that
    ended without giving its spare back)."""
    return dict((n, r) for n, r in held.items() if n not in nodes)


def held_note(node, record):
    """Why a spare is not free to this run: the run that holds it, until when, and how to let it out."""
    until = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(float(record.get("until") or 0)))
    return ("spare %s is held by another run (%s, until %s; if that run no longer runs, -e unquarantine=%s lets it "
            "out)" % (node, record.get("run_id"), until, node))
