# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stragglers: the node whose ranks compute slower than their peers', which slows every rank of a synchronous job
without failing anything.

Each rank's step record carries ``compute``: the seconds of its own work outside collectives in that step (the
bundled trainer: its forward passes).  The watch feeds ``Stragglers.see`` each poll's last record of every rank; a
step record is sampled once.  A rank's pace is the median of its newest ``window`` samples; its score is the fastest
rank's pace over its own (1.0: the fastest, 0.5: twice as slow), as NVIDIA's resiliency extension scores ranks; a
node's score is its slowest rank's.  A node is a straggler once its score has stayed below ``threshold`` for
``steps`` steps of the run.

Pure Python, no Ansible import: unit-tested on the controller with the per-rank timings of a throttled run.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re
from collections import deque

# A node's name as a rank wrote it in its records (rank code is the user's): a host name, else the rank stands in.
HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")

# A node is a straggler below this score (its slowest rank computes at under 70 % of the fastest rank's pace) ...
THRESHOLD = 0.7
# ... for this many steps in a row.
STEPS = 10
# The samples of a rank its pace is the median of.
WINDOW = 8
# Scores kept per node for the summary's plot (one entry per step at which the scores changed).
HISTORY = 2000
# Before this many samples of every rank, no score.
MIN_SAMPLES = 3


def _seconds(value):
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if seconds > 0 else None


def _step(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2.0


class Stragglers(object):
    """What the watch has learned of each rank's compute time, and which node lags."""

    def __init__(self, threshold=THRESHOLD, steps=STEPS, window=WINDOW):
        self.threshold = float(threshold)
        self.steps = int(steps)
        self.window = int(window)
        self.samples = {}
        self.sampled = {}
        self.hosts = {}
        self.below_since = {}
        self.flagged = {}
        self.history = []
        self.step = 0
        self.reported = set()

    def see(self, ranks):
        """Learn from one poll's ``{rank: last record}``: each step's compute once (the record's own, and those of
        the steps before it that it lists in ``computes``), judged step by step, so that a straggler is named at the
        step its evidence was complete, however many steps one poll brings; returns self."""
        fresh = {}
        for rank, rec in sorted((ranks or {}).items(), key=lambda kv: str(kv[0])):
            if not isinstance(rec, dict) or rec.get("event") != "step":
                continue
            for number, value in rec.get("computes") or [[rec.get("step"), rec.get("compute")]]:
                seconds, number = _seconds(value), _step(number)
                if seconds is not None and number is not None and number > self.sampled.get(rank, -1):
                    host = str(rec.get("host") or "")
                    host = host if HOST_RE.fullmatch(host) else "rank %s" % _step(rank)
                    fresh.setdefault(number, []).append((rank, seconds, host))
        for number in sorted(fresh):
            for rank, seconds, host in fresh[number]:
                self.sampled[rank] = number
                self.samples.setdefault(rank, deque(maxlen=self.window)).append(seconds)
                self.hosts[rank] = host
            self.step = max(self.step, number)
            self._judge()
        return self

    def rank_scores(self):
        """``{rank: score}`` once every rank seen has ``MIN_SAMPLES`` samples (else ``{}``)."""
        paces = dict((rank, _median(s)) for rank, s in self.samples.items())
        if len(paces) < 2 or any(len(s) < MIN_SAMPLES for s in self.samples.values()):
            return {}
        fastest = min(paces.values())
        return dict((rank, fastest / pace) for rank, pace in paces.items())

    def scores(self):
        """``{node: score}``: each node's slowest rank's score."""
        out = {}
        for rank, score in self.rank_scores().items():
            host = self.hosts[rank]
            out[host] = min(out.get(host, 1.0), score)
        return out

    def _judge(self):
        scores = self.scores()
        if not scores:
            return
        if not self.history or self.history[-1][1] != _rounded(scores):
            self.history.append((self.step, _rounded(scores)))
            del self.history[:-HISTORY]
        for host, score in scores.items():
            if score >= self.threshold:
                self.below_since.pop(host, None)
                continue
            since = self.below_since.setdefault(host, self.step)
            if self.step - since + 1 >= self.steps and host not in self.flagged:
                self.flagged[host] = {"node": host, "step": self.step, "score": round(score, 3),
                                      "since_step": since}

    def newly_flagged(self):
        """The stragglers named since the last call (each once)."""
        out = [self.flagged[h] for h in sorted(self.flagged) if h not in self.reported]
        self.reported.update(f["node"] for f in out)
        return out

    def slowest(self):
        """``(node, score)`` of the lowest score, or None before any score."""
        scores = self.scores()
        if not scores:
            return None
        host = min(sorted(scores), key=lambda h: scores[h])
        return host, scores[host]

    def line(self):
        """The progress line's part: the straggler(s), or nothing while every node keeps pace."""
        scores = self.scores()
        named = sorted(h for h in self.flagged if h in scores and scores[h] < self.threshold)
        if not named:
            return None
        return "straggler: " + ", ".join("%s (score %.2f)" % (h, scores[h]) for h in named)

    def record(self):
        """What the summary keeps: the settings, the last scores, the nodes named and the scores over the steps."""
        return {"threshold": self.threshold, "steps": self.steps, "scores": _rounded(self.scores()),
                "flagged": [self.flagged[h] for h in sorted(self.flagged)],
                "history": [{"step": step, "scores": scores} for step, scores in self.history]}


def _rounded(scores):
    return dict((host, round(score, 3)) for host, score in sorted(scores.items()))


def describe(flag):
    """One sentence naming a straggler (the abort's reason with on_straggler=replace, the summary's line)."""
    return "%s is a straggler: its ranks compute at %.0f%% of the fastest rank's pace (score %.2f) since step %s" % (
        flag["node"], 100 * flag["score"], flag["score"], flag["since_step"])


def replay(records_by_rank, threshold=THRESHOLD, steps=STEPS):
    """The scores over a finished attempt's steps, as the watch would have seen them with every step in view:
    ``records_by_rank`` (rank -> its metrics records) fed step by step.  ``Stragglers.record()``, or None when no
    step record carries ``compute`` (a script that records no steps, or no straggler settings)."""
    tracker = Stragglers(threshold, steps)
    by_step = {}
    for rank, records in (records_by_rank or {}).items():
        for rec in records or []:
            if isinstance(rec, dict) and rec.get("event") == "step" and _seconds(rec.get("compute")) is not None:
                by_step.setdefault(rec.get("step") or 0, {})[rank] = rec
    if not by_step:
        return None
    for step in sorted(by_step):
        tracker.see(by_step[step])
    return tracker.record()


def lines(record):
    """The report's lines on stragglers (``record``: ``Stragglers.record()``): each node's last score, and each
    straggler named."""
    if not record or not record.get("scores"):
        return []
    out = ["Compute pace per node (1.0: the fastest rank's; a straggler stays below %.2f for %d steps): %s." % (
        record["threshold"], record["steps"], ", ".join("%s %.2f" % (h, s) for h, s in sorted(record["scores"].items())))]
    out += ["- **straggler**: %s." % describe(flag) for flag in record.get("flagged") or []]
    return out


# With on_straggler=replace the watch asks the ranks for a checkpoint (control/SAVE) and waits for it this long at
# least (three times the run's longest save when that is longer) before it stops the attempt anyway.
SAVE_WAIT = 60.0


def saved_since(ranks, step):
    """Whether every rank that recorded a step has finished a checkpoint save at ``step`` or later (``ranks``: the
    watch's last record of each rank, with ``saved_step``: module_utils/run/watch.rank_progress)."""
    steps = [r for r in (ranks or {}).values() if isinstance(r, dict) and r.get("event") == "step"]
    return bool(steps) and all(int(r.get("saved_step") or 0) >= int(step or 0) for r in steps)


def saved_at(status, step):
    """The step of the checkpoint that answered the watch's ask at ``step``, or None: the trainer's answer
    (``control/SAVED``, run_status's ``saved``: written once every rank saved), else the ranks' last save records
    (a poll sees them only while they are among a rank's last lines)."""
    answer = (status or {}).get("saved") or {}
    try:
        if int(answer.get("step") or 0) >= int(step or 0):
            return int(answer["step"])
    except (TypeError, ValueError):
        pass
    ranks = (status or {}).get("ranks") or {}
    if saved_since(ranks, step):
        return max(int(r.get("saved_step") or 0) for r in ranks.values() if isinstance(r, dict))
    return None


def save_wait(longest_save):
    """Seconds the watch waits for the checkpoint it asked for before it moves the run all the same."""
    return max(SAVE_WAIT, 3.0 * float(longest_save or 0))


def moved_reason(why, saved, step, waited):
    """The abort's reason with on_straggler=replace (``why``: describe's sentence, which the recovery reads)."""
    if saved:
        return "%s; the run was checkpointed at step %s and moves off it" % (why, step)
    return "%s; no checkpoint came within %.0fs, so the next attempt resumes from the newest one" % (why, waited)
