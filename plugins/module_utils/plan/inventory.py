# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The inventory's shape, checked before anything on the nodes changes: its groups, and the per-host values every
playbook relies on.  Pure Python; the filter ``inventory_problems`` calls it with the play's groups and hostvars."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

NCCL_PROFILES = ("auto", "ib", "roce", "tcp")
SHARED_DIR_PROVIDERS = ("preexisting", "nfs")


def inventory_problems(groups, hostvars):
    """Every problem of the inventory (an empty list when there is none), each naming the group or the host, the
    variable and the fix.  ``groups``: group -> host names; ``hostvars``: host -> its variables (a mapping)."""
    coordinator = list(groups.get("coordinator") or [])
    workers = list(groups.get("workers") or [])
    spares = list(groups.get("spares") or [])
    problems = _group_problems(coordinator, workers, spares)
    for host in coordinator + workers + spares:
        problems += _host_problems(host, hostvars[host], coordinator, workers)
    return problems


def _group_problems(coordinator, workers, spares):
    problems = []
    if len(coordinator) != 1:
        problems.append(
            "The inventory's coordinator group has %d hosts (%s); it needs exactly one. Fix: put the node that "
            "launches runs (a CPU machine is fine) in the group 'coordinator'." % (
                len(coordinator), ", ".join(coordinator) or "none"))
    if not workers:
        problems.append("The inventory's workers group is empty or missing. Fix: put the nodes that run ranks "
                        "(the GPU nodes) in the group 'workers'.")
    both = [h for h in coordinator if h in workers]
    if both:
        problems.append("%s is in both the coordinator and the workers group. Fix: keep the coordinator out of "
                        "'workers'; it launches runs and is never a rank." % ", ".join(both))
    doubled = [h for h in spares if h in coordinator + workers]
    if doubled:
        problems.append("%s is in the spares group and in the coordinator or workers group. Fix: a spare is a node "
                        "of its own that takes a failed worker's place (-e restarts=N); keep it only in "
                        "'spares'." % ", ".join(doubled))
    return problems


def _host_problems(host, hvars, coordinator, workers):
    problems = []
    profile = hvars.get("nccl_profile", "auto")
    if profile not in NCCL_PROFILES:
        problems.append("host %s: nccl_profile=%s is not a profile. Fix: set nccl_profile for %s (host_vars or "
                        "group_vars) to auto, ib, roce or tcp." % (host, profile, host))
    provider = hvars.get("shared_dir_provider", "preexisting")
    if provider not in SHARED_DIR_PROVIDERS:
        problems.append("host %s: shared_dir_provider=%s is not known. Fix: set shared_dir_provider to preexisting "
                        "(a directory already shared) or nfs (the nfs role exports one)." % (host, provider))
    elif provider == "nfs" and coordinator:
        server = hvars.get("nfs_server_host", coordinator[0])
        if server not in coordinator + workers:
            problems.append(
                "host %s: nfs_server_host=%s is not a host of this inventory's coordinator or workers groups. Fix: "
                "set nfs_server_host to the inventory name of the node that exports the shared directory (default: "
                "the coordinator, %s)." % (host, server, coordinator[0]))
    return problems
