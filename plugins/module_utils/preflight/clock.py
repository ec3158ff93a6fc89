# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight: do the nodes' clocks agree?

Each node read its clock between two readings of the controller's; a node fails only when it is
certainly (whatever the latencies) more than the bound from the median of the nodes.  A controller
whose own clock is off only warns: the job does not use it.  Pure functions, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import statistics

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.verdicts import FAIL, PASS, WARN, PreflightError, verdict


def clock_skew(probe):
    """(estimate, half-width, certain) in seconds from a probe bracketed by the controller's clock.

    The node read its clock somewhere between the controller's ``controller_before`` and
    ``controller_after``; the skew is at least ``certain`` whatever the latency was.
    """
    node = float(probe["time"])
    before, after = float(probe["controller_before"]), float(probe["controller_after"])
    if after < before:
        raise PreflightError("controller_after < controller_before")
    mid, half = (before + after) / 2.0, (after - before) / 2.0
    est = node - mid
    certain = max(0.0, node - after, before - node)
    return est, half, certain


def clock_verdicts(probes, bound):
    """Clock skew between the nodes: each node against the median of the nodes' clocks.

    Every node's offset from the controller is known within +/- half its probe's round trip; a
    node fails when it is certainly more than ``bound`` seconds from the median node, whatever
    the latencies were. A controller whose own clock is off only warns (the job does not use it).
    """
    if not probes:
        return []
    est = dict((h, clock_skew(probes[h])) for h in probes)
    offsets = [e[0] for e in est.values()]
    # An even count has no middle node: the controller's clock (offset 0) breaks the tie.
    ref = median(offsets + ([0.0] if len(offsets) % 2 == 0 else []))
    ref_half = max(e[1] for e in est.values())
    out = []
    for host in sorted(est):
        off, half, certain_ctl = est[host]
        dev = off - ref
        certain = max(0.0, abs(dev) - half - ref_half)
        detail = "%+.3f s from the nodes' median (+/- %.3f s); %+.3f s vs the controller" % (dev, half + ref_half, off)
        fix = "synchronise the clock of %s with the other nodes (chrony or systemd-timesyncd on every node)" % host
        if certain > bound:
            out.append(verdict("clock", host, FAIL, detail + ", over the bound of %g s" % bound, fix))
        elif abs(dev) + half + ref_half > bound:
            out.append(verdict("clock", host, WARN, detail + ": cannot confirm it is within %g s" % bound))
        elif certain_ctl > bound:
            out.append(verdict("clock", host, WARN, detail + ": the controller's clock is off (reports and leases "
                               "use the nodes' clocks)"))
        else:
            out.append(verdict("clock", host, PASS, detail))
    return out


def median(values):
    """The median of the numbers (the mean of the middle two for an even count); None for none."""
    values = [float(v) for v in values]
    return statistics.median(values) if values else None
