# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight of a node that takes a failed node's place in a run's next attempt (``-e restarts=N``): the quick
checks of a full preflight, on that node only - it resolves every node of the attempt to the address the cluster
uses, its clock agrees with the others', its shared and local disks have room, and the SSH logins the backend needs
reach it.  The all-reduce test across the attempt's nodes only with ``-e preflight=force`` (``bandwidth_check``).

Pure functions, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.bandwidth import (
    bandwidth_test, bandwidth_verdict, judge_bandwidth)
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.clock import clock_verdicts
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.names import name_verdicts
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.resources import disk_verdicts
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.ssh import ssh_verdicts
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.verdicts import FAIL, verdict

# preflight's own defaults (role preflight): seconds of clock skew, GiB free on the shared and the local disk.
DEFAULTS = {"max_clock_skew": 2.0, "min_free_gib_shared": 5.0, "min_free_gib_local": 5.0}


def _answered(result):
    return bool(result) and not result.get("failed") and not result.get("unreachable") and "time" in result


def replacement_verdicts(job, nodes, probes, ssh_results, settings=None, reference=None):
    """The verdicts on ``nodes`` (those that take a place) for the attempt planned as ``job``.

    ``probes``: node -> its node_probe result (``names``: the attempt's nodes, ``paths``: the shared directory and
    the stack's home); ``ssh_results``: source -> target -> ``{"rc", "stdout", "stderr"}`` (node_probe's ``ssh``
    from each source of the backend's SSH pairs); ``settings``: ``DEFAULTS``' keys; ``reference``: node -> the
    node_probe result of a node of the run that stays (the coordinator), whose clock the new ones must agree with."""
    cfg = dict(DEFAULTS, **dict((k, v) for k, v in (settings or {}).items() if v not in (None, "")))
    out, probed = [], {}
    for node in nodes:
        result = probes.get(node) or {}
        if _answered(result):
            probed[node] = result
        else:
            out.append(verdict("probe", node, FAIL, "the node probe did not run: %s" % str(
                result.get("msg") or "no answer")[:300], "check that %s is up and reachable over SSH" % node))
    expected = dict(job.get("addresses") or {})
    out += name_verdicts(dict((h, r.get("resolved") or {}) for h, r in probed.items()), expected, {})
    clocks = dict((h, r) for h, r in (reference or {}).items() if _answered(r))
    clocks.update(probed)
    out += [v for v in clock_verdicts(clocks, float(cfg["max_clock_skew"])) if v["host"] in probed]
    out += disk_verdicts(probed, {"shared": job["shared_dir"], "local": job["home"]},
                         {"shared": cfg["min_free_gib_shared"], "local": cfg["min_free_gib_local"]})
    required = [tuple(p) for p in (job.get("launch") or {}).get("ssh_pairs") or [] if p[1] in nodes]
    if required:
        out += ssh_verdicts(ssh_results or {}, required, job["backend"])
    return out


def bandwidth_check(job, results, link_gbps=None, fractions=None):
    """The all-reduce test across the attempt's rank nodes (``-e preflight=force``), judged as preflight judges it:
    ``results``: rank node -> ``async_status``'s result of ``multinode_ds.allreduce_perf`` there; ``link_gbps``:
    ``preflight_link_gbps`` (None: unknown, so no threshold - a warning).  One verdict."""
    test = bandwidth_test("recovery", results, job["master"])
    collective = "nccl" if job.get("accelerator") == "cuda" else "gloo"
    judged = judge_bandwidth(test, len(job["rank_hosts"]), job.get("profile") or "tcp", collective, link_gbps,
                             fractions)
    return bandwidth_verdict(judged, job["rank_hosts"], None, True)
