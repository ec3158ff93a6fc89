# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The run's pace, as the watch learns it: how long its steps and its checkpoint saves take, and from that how long
a silence makes the run hung.

Pure Python, no Ansible import: unit-tested on the controller.  The watch feeds ``Pace.see`` each poll's ranks
(``run_status``'s last step record of each rank, with ``saving`` while a rank's newest record is the start of a
checkpoint save and ``save_seconds`` from its last finished save: module_utils/run/watch.rank_progress).  A step
record is sampled once; the newest ``WINDOW`` samples make the step time's 90th percentile.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from collections import deque

# A hang is this many times the run's step time (its 90th percentile) without a finished step ...
FACTOR = 10.0
# ... bounded by these (the plan's stall_floor and stall_ceiling): a run of 20 ms steps is not called hung after
# 0.2 s, one of ten-minute steps is after at most half an hour.
FLOOR = 10.0
CEILING = 1800.0
# A checkpoint save in progress: three times the longest save seen in this run, and never less than the startup
# allowance (the first save has no history: a model's save can take minutes on a slow shared directory).
SAVE_FACTOR = 3.0
WINDOW = 64


class Pace(object):
    """What the watch has learned of this run's steps and saves."""

    def __init__(self, floor=FLOOR, ceiling=CEILING, factor=FACTOR, window=WINDOW):
        self.floor = float(floor)
        self.ceiling = max(float(ceiling), self.floor)
        self.factor = float(factor)
        self.samples = deque(maxlen=int(window))
        self.sampled = {}
        self.longest_save = 0.0

    def see(self, ranks):
        """Learn from one poll's ``{rank: last record}``; returns self."""
        for rank, rec in sorted((ranks or {}).items()):
            if not isinstance(rec, dict):
                continue
            if rec.get("event") == "step" and self.sampled.get(rank) != rec.get("step"):
                self.sampled[rank] = rec.get("step")
                seconds = _seconds(rec.get("step_time"))
                if seconds is not None:
                    self.samples.append(seconds)
            save = _seconds(rec.get("save_seconds"))
            if save is not None:
                self.longest_save = max(self.longest_save, save)
        return self

    def step_time(self):
        """The 90th percentile of the sampled step times (None before any)."""
        if not self.samples:
            return None
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]

    def step_limit(self):
        """Seconds without a finished step that make the run hung: ``factor`` times the step time, within
        ``floor``-``ceiling``."""
        typical = self.step_time() or 0.0
        return min(self.ceiling, max(self.floor, self.factor * typical))

    def save_limit(self, startup_timeout):
        """Seconds a checkpoint save in progress may take."""
        return max(float(startup_timeout or 0), SAVE_FACTOR * self.longest_save, self.step_limit())

    def describe(self):
        """The learned figures, for the stall's reason."""
        typical = self.step_time()
        return "steps take %s" % ("%.2fs" % typical if typical is not None else "no time yet")


def _seconds(value):
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if seconds >= 0 else None
