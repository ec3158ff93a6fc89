# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Grow-back of a shrunken run (issue 47): a run that went on with fewer nodes (``min_nodes``) returns to its full
width at its next checkpoint once a node it lost answers again, or a spare another run held is free.

Three moments, each a pure function here:

- **place** (``run_recovery`` step place, before a shrunken attempt): ``candidates`` - the nodes the attempt's watch
  looks out for, or None when the attempt is at full width or no restart would be left to grow with;
- **watch** (the ``watch`` action, every ``every`` seconds of a shrunken attempt): ``answered`` - the candidates
  that answer (a TCP connection to their SSH port from the coordinator) and, for a spare, that no other run holds
  any more. Then the watch asks the ranks for a checkpoint (control/SAVE), waits until every rank saved it, and
  stops the attempt with ``reason``'s words, which the recovery reads back (``named``);
- **place** again (after the stop): ``grown`` - the attempt's nodes with those that passed their check (as a
  replacement's: they answer with the run's stack), in the order of the run's first nodes, up to its full width.

A grow-back is an attempt: it needs a restart left, and the place step offers it only when one is.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

# The kind of ending (module_utils/run/recovery.py) of an attempt stopped to grow back.
GROW = "grow"
# How often a shrunken attempt's watch looks for its candidates (seconds).
EVERY = 5
# Seconds a look waits for a candidate's SSH port (one on the cluster network answers in milliseconds).
PROBE_TIMEOUT = 0.5
# A grow-back costs a checkpoint and a new attempt's start (about 10 s on the local cluster): with fewer seconds of
# steps left than this, the attempt finishes at its width.
LEAST_LEFT = 20.0
_REASON = re.compile(r"^grow back: (\S+(?:, \S+)*) answers? again")


def candidates(full, nodes, quarantined, reuse_lost, spares, spares_held, attempt, restarts):
    """What the watch of attempt ``attempt + 1`` looks out for: ``{"nodes", "spares", "width"}``, or None.

    ``full``: the run's first nodes (its full width); ``nodes``: the next attempt's; ``quarantined``: nodes never
    used; ``reuse_lost``: whether a node lost may take ranks again (a backend whose scheduler drains it, Slurm,
    keeps it out); ``spares``: the run's spares group; ``spares_held``: those another run holds now (a spare free
    now and not taken is one that failed its check); ``attempt``: the attempt that ended; ``restarts``: the run's
    budget.  None when the next attempt is at full width, or when it is the last one the budget allows."""
    if len(nodes) >= len(full) or attempt + 2 > restarts + 1:
        return None
    out = {"nodes": [n for n in full if n not in nodes and n not in quarantined] if reuse_lost else [],
           "spares": [s for s in spares if s in spares_held and s not in nodes and s not in quarantined],
           "width": len(full)}
    return out if out["nodes"] or out["spares"] else None


def due(last, now, every=EVERY):
    """Whether the watch looks again (``last``: when it last looked, None before the first look)."""
    return last is None or now - last >= every


def answered(grow, reachable, held):
    """The candidates of ``grow`` that answer now (``reachable``: run_status's probe, ``{node: {"ok", "error"}}``) and,
    for a spare, that ``held`` (the spares another run holds now) no longer lists, as many as the run lacks
    (``grow["missing"]``, else all)."""
    spares = set(grow.get("spares") or [])
    ready = [n for n in list(grow.get("nodes") or []) + sorted(spares)
             if ((reachable or {}).get(n) or {}).get("ok") and not (n in spares and n in (held or []))]
    missing = grow.get("missing")
    return ready[:missing] if missing is not None else ready


def worth_it(last, total, step_time, least=LEAST_LEFT):
    """Whether the run has enough left to grow back for: at least ``least`` seconds of steps from ``last`` to
    ``total`` at ``step_time`` (the run's pace; not known yet, or no total: yes)."""
    if not total or step_time is None:
        return True
    return (int(total) - int(last)) * float(step_time) >= least


def last_step(ranks):
    """The last step any rank recorded (``ranks``: the watch's last record of each rank), 0 before the first."""
    steps = [int(r.get("step") or 0) for r in (ranks or {}).values() if isinstance(r, dict) and r.get("event") == "step"]
    return max(steps) if steps else 0


def asking(names):
    """The sentence the watch shows (and writes into control/SAVE) when ``names`` answer."""
    return "grow back: %s %s again" % (", ".join(names), "answers" if len(names) == 1 else "answer")


def reason(names, width, saved, step, waited):
    """The stop's reason: what answered, and the checkpoint the next attempt resumes from."""
    head = asking(names)
    if saved:
        return "%s; the run was checkpointed at step %s and grows back to %d nodes" % (head, step, width)
    return "%s; no checkpoint came within %.0fs, so the run grows back to %d nodes from the newest one" % (
        head, waited, width)


def named(why):
    """The nodes a grow-back's reason names, or None when ``why`` is not one."""
    match = _REASON.search(why or "")
    return match.group(1).split(", ") if match else None


def grown(nodes, back, full, width):
    """The next attempt's nodes: ``nodes`` and as many of the ``back`` ones (those that passed their check) as the
    run lacks of ``width``, in the order of ``full`` (a spare after the run's own nodes)."""
    add = [n for n in back if n not in nodes][:max(0, int(width) - len(nodes))]
    chosen = list(nodes) + add
    return [n for n in full if n in chosen] + [n for n in chosen if n not in full]
