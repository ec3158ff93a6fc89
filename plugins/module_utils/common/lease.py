# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's lease on a run: how long the watch can go without renewing it, and the age at which the agents
count it stale (their ``--lease-timeout``).  The plan passes it to every agent (the launch backends' ``Stop``), the
checkpoint lock counts a run alive while its lease is younger (launch/lock.py), and the watch (run/watch.py) renews
it with these defaults.

Pure Python, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

# The watch's defaults (``watch_options``; module watch documents them) that the agents' lease is derived from.
POLL_INTERVAL = 2.0
STATUS_RETRY = 60.0
STATUS_TIMEOUT = 30.0
# How much longer than the watch can go without renewing the lease the agents wait before they count it stale
# (a slow start of the module, an NFS client that caches the lease's time stamp for a few seconds).
LEASE_MARGIN = 15.0


def renewal_gap(status_retry=STATUS_RETRY, status_timeout=STATUS_TIMEOUT, poll_interval=POLL_INTERVAL):
    """The longest the controller's lease can go unrenewed while the watch still tries to reach the coordinator:
    each status call renews it as it starts; the call after a renewal waits up to ``poll_interval`` and may fail
    only after ``status_timeout``; failed calls are tried again for ``status_retry`` seconds (StatusRetry), and the
    last try may itself take ``status_timeout`` before it renews the lease."""
    return float(poll_interval) + 2 * float(status_timeout) + float(status_retry)


def lease_timeout(status_retry=STATUS_RETRY, status_timeout=STATUS_TIMEOUT, poll_interval=POLL_INTERVAL):
    """The age at which the agents count the controller's lease stale (their ``--lease-timeout``, which the plan
    passes): the watch's retry window (``renewal_gap``) and a margin, so that a coordinator the watch still retries
    is never given up by its agents first."""
    return renewal_gap(status_retry, status_timeout, poll_interval) + LEASE_MARGIN
