# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Decisions of the controller's watch loop over a running job, and its progress lines.

Pure Python, no Ansible import: unit-tested on the controller.  The input is
what the ``run_status`` module reads from the run directory: the per-node
agent heartbeats, the ABORT record, and the last metrics record of each rank.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import signal

from ansible_collections.multinode.deepspeed.plugins.module_utils.common.lease import (
    POLL_INTERVAL, STATUS_RETRY, STATUS_TIMEOUT, lease_timeout)
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.pace import CEILING, FLOOR, Pace

RUNNING = "running"
SUCCESS = "success"
FAILED = "failed"
STOPPING = "stopping"

# ssh's keep-alive period for the watch's dead man's switch (seconds).
SWITCH_ALIVE_INTERVAL = 15


def switch_keepalive(status_retry=STATUS_RETRY):
    """ssh options for the dead man's switch's session: it gives a silent coordinator up only after the agents'
    lease (``lease_timeout``) would have.  With fewer (ansible.cfg's 3 x 15 s), a 45 s outage of the network ends
    the session, and its remote end, reading the close as the controller's end, aborts a run the watch still
    retries."""
    count = int(-(-lease_timeout(status_retry) // SWITCH_ALIVE_INTERVAL)) + 1
    return ["-o", "ServerAliveInterval=%d" % SWITCH_ALIVE_INTERVAL, "-o", "ServerAliveCountMax=%d" % count]


def decide(status, expected_nodes, launchers, now, heartbeat_timeout=20.0, start_timeout=120.0,
           started_at=None, world_size=None, gone=()):
    """What the watch loop does next.

    ``status``: {"nodes": {host: heartbeat dict}, "abort": dict or None, "ranks": {rank: last record},
    "done_ranks": [ranks that wrote their done record]}.
    ``expected_nodes``: every host that runs an agent; ``launchers``: those whose agent runs a launcher.
    ``gone``: nodes known to be gone (quiet during an abort and unreachable: ``quiet_nodes``), not waited for.

    Returns ``(verdict, reason, action)``: verdict is RUNNING, STOPPING (an abort is under
    way; keep polling until every node stopped), SUCCESS or FAILED; action is None,
    ``("abort", reason)``, ``("abort", reason, [lost nodes])`` or ``("done", None)``.
    """
    nodes = status.get("nodes") or {}
    abort = status.get("abort")
    if abort:
        active = [h for h in expected_nodes if _alive(nodes.get(h), now, heartbeat_timeout)
                  and nodes[h].get("state") not in ("aborted", "finished") and h not in gone]
        if active:
            return STOPPING, abort.get("reason"), None
        return FAILED, abort.get("reason"), None
    missing = [h for h in expected_nodes if h not in nodes]
    if missing:
        if started_at is not None and now - started_at > start_timeout:
            reason = "no agent started on %s within %ds" % (", ".join(missing), start_timeout)
            return STOPPING, reason, ("abort", reason, list(missing))
        return RUNNING, None, None
    for host in expected_nodes:
        beat = nodes[host]
        if beat.get("state") in ("finished", "aborted"):
            continue
        if not _alive(beat, now, heartbeat_timeout):
            reason = "node %s stopped answering (no heartbeat for %.0fs)" % (host, now - beat.get("time", 0))
            return STOPPING, reason, ("abort", reason, [host])
    launcher_states = [nodes[h] for h in launchers]
    if launcher_states and all(b.get("state") == "finished" for b in launcher_states):
        codes = [b.get("exit_code") for b in launcher_states]
        if any(c not in (0, None) for c in codes):
            host = next(h for h in launchers if nodes[h].get("exit_code") not in (0, None))
            reason = "the launcher on %s exited with %s" % (host, nodes[host].get("exit_code"))
            return FAILED, reason, None
        done = set(status.get("done_ranks") or [])
        if world_size is not None and len(done) < world_size:
            lost = sorted(set(range(world_size)) - done)
            reason = "the launchers exited 0 but ranks %s never finished" % ", ".join(map(str, lost))
            return STOPPING, reason, ("abort", reason)
        if watchers_finished(nodes, expected_nodes, launchers):
            return SUCCESS, None, None
        return RUNNING, None, ("done", None)
    return RUNNING, None, None


def ended_well(nodes, expected_nodes, launchers, done_ranks, world_size=None):
    """Whether ``decide`` judges the run ended well (SUCCESS, or the ``done`` action that tells the watchers so)
    from these heartbeats and done ranks, leaving out what only the controller knows (the clock of a heartbeat,
    the backend's follower): every expected agent has beaten, every launcher finished with exit code 0, and every
    rank wrote its done record.  ``run_status`` writes DONE by itself when this holds (its option ``finish``)."""
    if not launchers or any(h not in nodes for h in expected_nodes):
        return False
    states = [nodes[h] or {} for h in launchers]
    if not all(b.get("state") == "finished" and b.get("exit_code") in (0, None) for b in states):
        return False
    return world_size is None or len(set(done_ranks or [])) >= int(world_size)


def watchers_finished(nodes, expected_nodes, launchers):
    """Whether every agent that runs no launcher wrote its final heartbeat (``finished``)."""
    return all((nodes.get(h) or {}).get("state") == "finished" for h in expected_nodes if h not in launchers)


def watch_options(args):
    """The watch's settings from its task's arguments, with their defaults: the nodes, the launchers' nodes and the
    world size it expects, the steps it counts to, and its periods and limits in seconds (a stall_timeout of 0
    or none: the ranks' step time decides; a timeout of 0: none)."""
    world_size = args.get("world_size")
    return {
        "nodes": list(args["nodes"]),
        "launchers": list(args["launchers"]),
        "world_size": int(world_size) if world_size not in (None, "") else None,
        "total_steps": args.get("total_steps"),
        "poll_interval": float(args.get("poll_interval", POLL_INTERVAL)),
        "progress_interval": float(args.get("progress_interval", 10)),
        "heartbeat_timeout": float(args.get("heartbeat_timeout", 20)),
        "start_timeout": float(args.get("start_timeout", 120)),
        "stop_timeout": float(args.get("stop_timeout", 60)),
        "timeout": float(args.get("timeout", 0) or 0),
        "stall_timeout": float(args.get("stall_timeout") or 0) or None,
        "stall_floor": float(args.get("stall_floor") or FLOOR),
        "stall_ceiling": float(args.get("stall_ceiling") or CEILING),
        "startup_timeout": float(args.get("startup_timeout") or 300),
        "queue_timeout": float(args.get("queue_timeout") or 0) or None,
        "status_retry": float(args["status_retry"] if args.get("status_retry") is not None else STATUS_RETRY),
        "status_timeout": float(args.get("status_timeout") or STATUS_TIMEOUT),
        "addresses": dict(args.get("addresses") or {}),
    }


class StatusRetry(object):
    """Whether the watch tries a failed status call again: for up to ``limit`` seconds since the first failure
    in a row (a success starts over), waiting ``first`` seconds, then twice as long each time, at most ``most``.
    ``deadline``: a time (same clock) after which no more tries are made (the run's timeout)."""

    def __init__(self, limit=STATUS_RETRY, first=1.0, most=10.0):
        self.limit, self.first, self.most = float(limit), float(first), float(most)
        self.failed_since = None
        self.failures = 0

    def ok(self):
        self.failed_since, self.failures = None, 0

    def failed(self, now, deadline=None):
        """After a failure at ``now``: seconds to wait before the next try, or None to give up."""
        if self.failed_since is None:
            self.failed_since = now
        self.failures += 1
        wait = min(self.most, self.first * (2 ** (self.failures - 1)))
        if now + wait - self.failed_since > self.limit:
            return None
        if deadline is not None and now + wait > deadline:
            return None
        return wait


def give_up_reason(error, failing_for, host, timed_out=False):
    """The watch's reason when it stops asking: the coordinator did not answer for ``failing_for`` seconds."""
    why = "the run's timeout passed while " if timed_out else ""
    return ("%sthe coordinator %s could not be reached or read for %.0fs (%s); the watch gave up: the run may "
            "still be going there (its lease stops it)" % (why, host or "?", failing_for, first_line(error)))


def first_line(text):
    lines = str(text or "").strip().splitlines()
    return (lines[0] if lines else "no answer")[:300]


def queue_state(status):
    """The backend's queue record that run_status reports (``status["queue"]``), when the run's job waits in a
    scheduler's queue: {"state": "queued", "label", "reason", "job_id", "since", "fix"}; None when there is none or
    the job started."""
    queue = status.get("queue")
    if isinstance(queue, dict) and queue.get("state") == "queued":
        return queue
    return None


def start_time(status):
    """When the ranks could start, on the node's clock, from the queue record (its job's start), or None."""
    queue = status.get("queue")
    if isinstance(queue, dict) and queue.get("state") == "started" and queue.get("started"):
        try:
            return float(queue["started"])
        except (TypeError, ValueError):
            return None
    return None


def queued_line(queue, now):
    """'queued: PENDING (Resources) 2m10s' for the progress line."""
    waited = max(0.0, now - float(queue.get("since") or now))
    reason = queue.get("reason")
    return "queued: %s%s %s" % (queue.get("label") or "pending",
                                " (%s)" % reason if reason not in (None, "", "None") else "", duration(waited))


def duration(seconds):
    seconds = int(seconds)
    if seconds >= 3600:
        return "%dh%02dm" % (seconds // 3600, seconds % 3600 // 60)
    if seconds >= 60:
        return "%dm%02ds" % (seconds // 60, seconds % 60)
    return "%ds" % seconds


def abort_for_queue(queue, now, queue_timeout):
    """The verdict when the run's job waited in the queue longer than ``queue_timeout`` (None: no action)."""
    waited = now - float(queue.get("since") or now)
    if not queue_timeout or waited <= queue_timeout:
        return None
    reason = "job %s waited in the queue for %s (queue_timeout %.0fs), still %s (%s)%s" % (
        queue.get("job_id") or "?", duration(waited), queue_timeout, queue.get("label") or "pending",
        queue.get("reason") or "no reason given", "; %s" % queue["fix"] if queue.get("fix") else "")
    return STOPPING, reason, ("abort", reason)


# Less than this free on the run directory's file system is a full disk: the next checkpoint or log write fails.
DISK_FULL_BYTES = 1 << 20


def size(n):
    """``n`` bytes in the largest unit that keeps it at or above 1."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%d %s" if unit == "B" else "%.1f %s") % (n, unit)
        n /= 1024.0
    return None


def disk_full(disk, host, floor=DISK_FULL_BYTES):
    """The cause, as a sentence, when run_status's ``disk`` (the run directory's file system) is full - less than
    ``floor`` bytes free - else None."""
    if not isinstance(disk, dict) or disk.get("free") is None or disk["free"] >= floor:
        return None
    text = "disk full on %s: %s has %s free of %s. Fix: free space there, or set shared_dir_path to a file system " \
           "with room for the run's checkpoints and logs"
    return text % (host, disk.get("path"), size(disk["free"]), size(disk.get("total") or 0))


def abort_for_disk(cause):
    """The verdict when the run's disk is full (``cause``: from disk_full): stop the run everywhere, naming it."""
    return STOPPING, cause, ("abort", cause, [], cause)


def abort_for_pods(problems):
    """The verdict when the backend's follower found ``problems`` (``[(host, message, lost)]``): stop the run, the
    hosts of the lost ones named as lost."""
    reason = "; ".join(msg for _host, msg, _lost in problems)
    return STOPPING, reason, ("abort", reason, [h for h, _msg, lost in problems if lost and h])


def abort_for_timeout(timeout):
    """The verdict when the run ran past its ``timeout``."""
    reason = "the run exceeded its timeout of %.0fs" % timeout
    return STOPPING, reason, ("abort", reason)


def abort_for_stall(stall, reachable):
    """The verdict when the run stalled (``stall``: from stalled): stop it, the nodes the coordinator cannot reach
    (``reachable``: run_status's probe) named first and lost."""
    reason = blame_stall(stall, reachable)
    return STOPPING, reason, ("abort", reason, unreachable(reachable))


def abort_for_straggler(reason):
    """The verdict when ``on_straggler=replace`` and a node is a straggler (``reason``: stragglers.describe): stop the
    run, naming it; the recovery moves the next attempt off that node."""
    return STOPPING, reason, ("abort", reason, [])


def abort_to_grow(reason):
    """The verdict when a shrunken attempt saved its checkpoint for a grow-back (``reason``: grow.reason): stop the
    run; the recovery places the next attempt on the run's full width."""
    return STOPPING, reason, ("abort", reason, [])


def stop_overdue(reason, stop_timeout):
    """The failure's reason when the nodes did not stop within ``stop_timeout`` after an abort."""
    return "%s; nodes still not stopped after %.0fs" % (reason, stop_timeout)


def rank_progress(records):
    """What the watch reads of a rank's last metrics records: the record it shows (the last step, else the last
    record; None without any) and whether the rank wrote its done record.  The step record carries ``saving`` (the
    time the save began) while the rank's newest record is the start of a checkpoint save, and ``save_seconds`` and
    ``saved_step``, the duration and step of its last finished save among these records (the bundled trainer's
    ``save`` records); and ``computes``, ``[step, compute]`` of every step record among them (when more than one),
    for the straggler scores."""
    steps = [r for r in records if r.get("event") == "step"]
    last = steps[-1] if steps else (records[-1] if records else None)
    if steps:
        saves = [r for r in records if r.get("event") == "save"]
        extra = {}
        if records[-1].get("event") == "save" and records[-1].get("phase") == "begin":
            extra["saving"] = records[-1].get("time")
        ended = [r for r in saves if r.get("phase") == "end" and r.get("seconds") is not None]
        if ended:
            extra["save_seconds"] = ended[-1].get("seconds")
            extra["saved_step"] = ended[-1].get("step")
        # Every step's compute among these records, not only the last one's: the straggler scores see each step.
        computes = [[r.get("step"), r["compute"]] for r in steps if r.get("compute") is not None]
        if len(computes) > 1:
            extra["computes"] = computes
        last = dict(last, **extra) if extra else last
    return last, any(r.get("event") == "done" for r in records)


def stall_limit(ranks, stall_timeout=None, floor=FLOOR, ceiling=CEILING):
    """Seconds without a finished step that make a run stalled: ``stall_timeout`` when given, else ten times the
    step time the ranks report (module_utils/run/pace.py), within ``floor``-``ceiling``."""
    if stall_timeout:
        return float(stall_timeout)
    return Pace(floor, ceiling).see(ranks).step_limit()


def compiling(status):
    """``{host: [op, ...]}``: the DeepSpeed ops the nodes' agents see being compiled now (their heartbeats'
    ``building``: a rank that loads an op nobody built compiles it first, silently, for minutes)."""
    out = {}
    for host, beat in sorted((status.get("nodes") or {}).items()):
        ops = [str(b.get("op")) for b in (beat or {}).get("building") or [] if isinstance(b, dict) and b.get("op")]
        if ops:
            out[host] = ops
    return out


def stalled(status, now, started_at, stall_timeout=None, startup_timeout=300.0, log_floor=45.0, rank_hosts=None,
            pace=None):
    """Is the run stalled (hung)?  None, or ``{"reason", "silent_for", "limit", "behind": {host: [ranks]},
    "frozen": {host: [rank processes that do not run]}}``.

    The signal: the time of every rank's last metrics record (the bundled trainer writes one per step), against the
    pace the run has shown (``pace``: module_utils/run/pace.Pace, which the watch feeds every poll; a fresh one
    learns from this poll alone): ten times its step time, within its floor and ceiling; ``stall_timeout``
    instead when set.  A checkpoint save under way counts from its start, with the save's allowance.  Before the
    first step, a fixed ``startup_timeout`` (model load, DeepSpeed's init, the first collective).  Without metrics
    (a user's script), the newest write to the ranks' logs (``status["logs_mtime"]``), at least ``log_floor``: a
    script that logs nothing for that long looks stalled.  A node that is compiling a DeepSpeed op
    (``compiling``) is not stalled: the run's timeout bounds a build that never ends.  A rank that wrote its done
    record (``status["done_ranks"]``) is past its steps: only the others are judged by them, and once every rank is
    done, their exit gets the startup allowance."""
    if compiling(status):
        return None
    ranks = status.get("ranks") or {}
    pace = (pace or Pace()).see(ranks)
    steps = dict((int(r), rec) for r, rec in ranks.items() if rec.get("event") == "step")
    # A rank that wrote its done record has no step left: the ranks still at work say whether the run moves.
    done = set(r for r in status.get("done_ranks") or [] if isinstance(r, int))
    working = dict((r, rec) for r, rec in steps.items() if r not in done)
    if steps and not working:
        # Every rank is past its work: the ranks' and the launchers' exit (a last barrier, the process group's end,
        # sixteen ranks on two cores: many seconds), bounded like a start.
        last = max(float(rec.get("time") or 0) for rec in steps.values())
        limit = max(float(stall_timeout or 0), float(startup_timeout), pace.step_limit())
        signal_name = "every rank wrote its done record, but the ranks did not exit"
    elif steps:
        steps = working
        last, limit, signal_name = _step_silence(steps, pace, stall_timeout, startup_timeout)
    elif status.get("logs_mtime") and not ranks:
        last = float(status["logs_mtime"])
        limit = float(stall_timeout or max(log_floor, startup_timeout / 2.0))
        signal_name = "no rank wrote to its log"
    else:
        last = started_at if started_at is not None else now
        limit = float(startup_timeout)
        signal_name = "no rank finished its first step"
    silent = now - last
    if silent <= limit:
        return None
    behind = {}
    if working:
        low = min(rec.get("step", 0) for rec in steps.values())
        for rank, rec in sorted(steps.items()):
            if rec.get("step", 0) == low:
                host = rec.get("host") or (rank_hosts or {}).get(rank) or "?"
                behind.setdefault(host, []).append(rank)
        where = "; the last step of every rank%s is %d" % (" not done" if done else "", low) \
            if len(set(r.get("step", 0) for r in steps.values())) == 1 else "; ranks %s on %s are behind, at step %d" % (
                ", ".join(str(r) for rs in behind.values() for r in rs), ", ".join(sorted(behind)), low)
    else:
        where = ""
    return {"reason": "the run stalled: %s for %.0fs (limit %.0fs)%s" % (signal_name, silent, limit, where),
            "silent_for": silent, "limit": limit, "behind": behind, "frozen": frozen_ranks(status)}


def _step_silence(steps, pace, stall_timeout, startup_timeout):
    """``(last sign of life, limit, what is missing)`` of a run past its first step."""
    last = max(float(rec.get("time") or 0) for rec in steps.values())
    saving = [float(rec["saving"]) for rec in steps.values() if _number(rec.get("saving"))]
    if saving:
        limit = max(float(stall_timeout or 0), pace.save_limit(startup_timeout))
        return max([last] + saving), limit, "no rank finished a step or its checkpoint save"
    if stall_timeout:
        return last, float(stall_timeout), "no rank finished a step"
    return last, pace.step_limit(), "no rank finished a step (%s)" % pace.describe()


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def frozen_ranks(status):
    """``{host: [{"rank", "pid", "state", "for"}]}``: the rank processes the nodes' agents see not running (stopped
    by a signal or a debugger, state T or t; in an uninterruptible wait for a while, state D: a driver or a file
    system that does not answer) - their heartbeats' ``frozen``."""
    out = {}
    for host, beat in sorted((status.get("nodes") or {}).items()):
        entries = [f for f in (beat or {}).get("frozen") or [] if isinstance(f, dict) and f.get("pid")]
        if entries:
            out[host] = entries
    return out


FROZEN_STATES = {"T": "stopped (SIGSTOP, or a debugger)", "t": "stopped by a debugger",
                 "D": "in an uninterruptible wait (a driver or a file system that does not answer)"}


def frozen_text(frozen):
    """The frozen rank processes, in words."""
    parts = []
    for host, entries in sorted(frozen.items()):
        for f in entries:
            rank = "rank %s" % f["rank"] if f.get("rank") is not None else "a process of the run"
            parts.append("%s on %s (pid %s) is %s, for %.0fs" % (
                rank, host, f["pid"], FROZEN_STATES.get(str(f.get("state")), "state %s" % f.get("state")),
                float(f.get("for") or 0)))
    return "; ".join(parts)


def unreachable(reachable):
    return sorted(h for h, r in (reachable or {}).items() if not r.get("ok"))


def blame_stall(stall, reachable):
    """The stall's reason with its likely cause first: the nodes the coordinator cannot reach (a cut network, a
    lost node), else a hung collective on the nodes whose ranks are behind."""
    lost = unreachable(reachable)
    if lost:
        return "%s: %s, so the run stalled (%s)" % (
            ", ".join(lost), "; ".join("%s does not answer on the cluster network (%s)" % (h, reachable[h]["error"])
                                       for h in lost), stall["reason"])
    frozen = stall.get("frozen") or {}
    if frozen:
        return "%s, so the run hung (%s)" % (frozen_text(frozen), stall["reason"])
    behind = ", ".join(sorted(stall.get("behind") or {}))
    return "%s%s" % (stall["reason"], "; every node answers, so a collective hung (NCCL/gloo waiting for a "
                     "peer) or a rank is stuck on %s: look at the ranks' last log lines" % behind if behind else "")


# Seconds without a heartbeat (agents beat every second) after which a node that has not stopped during an abort
# is probed: when the coordinator cannot reach it either, it is gone, and the stop does not wait heartbeat_timeout
# for it (a lost node's run ends, and a run with restarts goes on, that much sooner).
QUIET = 4.0


def quiet_nodes(status, expected_nodes, now, quiet=QUIET, stale_after=20.0):
    """The nodes that, during an abort, have neither stopped nor beaten for ``quiet`` seconds, and whose heartbeat is
    not stale yet (``stale_after``: a stale one is not waited for anyway)."""
    nodes = status.get("nodes") or {}
    if not status.get("abort"):
        return []
    return [h for h in expected_nodes if h in nodes and nodes[h].get("state") not in ("aborted", "finished")
            and quiet < now - nodes[h].get("time", 0) <= stale_after]


def _alive(beat, now, timeout):
    return beat is not None and now - beat.get("time", 0) <= timeout


def progress_line(status, now, total_steps=None):
    """One line: step/total, loss, tokens/s, samples/s, ETA, and each node's heartbeat age."""
    ranks = status.get("ranks") or {}
    steps = [r for r in ranks.values() if r.get("event") == "step"]
    parts = []
    if steps:
        head = min(steps, key=lambda r: r.get("step", 0))
        total = total_steps or head.get("total_steps")
        step = head.get("step", 0)
        parts.append("step %s/%s" % (step, total or "?"))
        if head.get("loss") is not None:
            parts.append("loss %.4f" % head["loss"])
        if head.get("tokens_per_sec"):
            parts.append("%.0f tok/s" % head["tokens_per_sec"])
        if head.get("samples_per_sec"):
            parts.append("%.1f samples/s" % head["samples_per_sec"])
        if total and head.get("step_time"):
            parts.append("eta %.0fs" % (max(0, total - step) * head["step_time"]))
    elif queue_state(status):
        parts.append(queued_line(queue_state(status), now))
    else:
        resumed = [r for r in ranks.values() if r.get("event") == "start" and r.get("start_step")]
        parts.append("starting, resumed from step %s" % min(r["start_step"] for r in resumed) if resumed else
                     "starting")
    ops = compiling(status)
    if ops:
        parts.append("compiling " + ", ".join("%s on %s" % ("+".join(o), h) for h, o in ops.items()))
    beats = []
    for host, beat in sorted((status.get("nodes") or {}).items()):
        beats.append("%s %s %.0fs" % (host, beat.get("state", "?"), max(0.0, now - beat.get("time", now))))
    if beats:
        parts.append("nodes: " + ", ".join(beats))
    return " | ".join(parts)


class Interrupted(Exception):
    """Ctrl-C on the controller, or Ansible terminating its worker process."""


def raise_interrupted(signum, frame):
    """One-shot: the first SIGINT/SIGTERM raises, the ones right behind it (Ctrl-C reaches the worker and Ansible's
    main process, which then terminates the worker) are ignored, so that they cannot cut short the cleanup that
    the first one started."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signal.Signals(signum).name)


def trap_stop_signals():
    """SIGINT and SIGTERM raise Interrupted (Ansible's worker would die at once), so that a controller-side
    loop can stop what it started first; returns the previous handlers for restore_signals."""
    return dict((sig, signal.signal(sig, raise_interrupted)) for sig in (signal.SIGINT, signal.SIGTERM))


def ignore_signals(previous):
    """While cleaning up after an interruption: a second Ctrl-C does not cut the cleanup short."""
    for sig in previous:
        signal.signal(sig, signal.SIG_IGN)


def interruption_reason(exc):
    """Why the watch stops the run when ``exc`` ended its loop: an interruption on the controller, or its own
    failure."""
    return ("interrupted on the controller" if isinstance(exc, (KeyboardInterrupt, Interrupted))
            else "the controller's watch failed: %s" % exc)


def switch_line(reason):
    """``reason`` as the one line the dead man's switch writes into the ABORT record: its first line, without
    double quotes (the record is JSON that a shell printf writes), at most 300 characters."""
    return reason.splitlines()[0].replace('"', "'")[:300]


def restore_signals(previous):
    for sig, handler in previous.items():
        signal.signal(sig, handler)
