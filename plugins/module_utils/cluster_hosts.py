# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The cluster's names in /etc/hosts: every inventory name to the address the cluster uses.

Pure: takes what the inventory and the facts say of each node, returns the lines of the managed
block, or raises ClusterHostsError with one sentence per problem naming the host, the variable and
the fix.  Used by the ``cluster_hosts`` filter (role ``multinode.deepspeed.cluster_hosts``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ipaddress
import re

# What /etc/hosts and the resolver accept as a name: letters, digits, '-', '.' and '_' (not
# RFC 1123, but glibc resolves it, and Ansible inventories use it), no leading '-' or '.'.
NAME_RE = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?$")


class ClusterHostsError(ValueError):
    pass


def _ip(value):
    try:
        return str(ipaddress.ip_address(str(value).strip()))
    except ValueError:
        return None


def _fix_address(host):
    return ("Fix: set cluster_hosts_address: <the IP the other nodes reach it at> for %s in the inventory, "
            "or cluster_hosts_file: false where the site's DNS resolves every inventory name" % host)


def node_address(node):
    """The address the cluster uses for one node, or raise.

    ``node``: ``{"name", "address" (cluster_hosts_address, else the node's resolved cluster address,
    else ansible_host), "fallback" (the node's default IPv4 from its facts, may be empty)}``.
    """
    host = node.get("name")
    given = node.get("address")
    ip = _ip(given) if given not in (None, "") else None
    if ip:
        return ip
    fallback = _ip(node.get("fallback")) if node.get("fallback") else None
    if fallback:
        return fallback
    raise ClusterHostsError(
        "%s: the cluster's address for it is %r, not an IP address, and its facts give no IPv4 address "
        "(ansible_default_ipv4). %s." % (host, given, _fix_address(host)))


def node_from_vars(name, hv):
    """What one host's variables say of it (``hv``: its hostvars, a mapping).

    The address, in order: ``cluster_hosts_address``; the address its fabric facts resolved from
    ``ansible_host`` (``multinode_fabric.cluster_address``, read by site.yml first); ``ansible_host``;
    the inventory name.  The fallback, used when that is not an IP: its default IPv4 from its facts.
    """
    hv = hv or {}
    fabric = hv.get("multinode_fabric") or {}
    facts = hv.get("ansible_facts") or {}
    address = hv.get("cluster_hosts_address") or fabric.get("cluster_address") or hv.get("ansible_host") or name
    aliases = hv.get("cluster_hosts_aliases") or []
    if isinstance(aliases, str):
        aliases = [aliases]
    return {"name": name, "address": address, "fallback": (facts.get("default_ipv4") or {}).get("address") or "",
            "aliases": list(aliases)}


def hosts_lines(nodes):
    """The managed block's lines, one per node in the given order: ``"<address> <name> [alias ...]"``.

    ``nodes``: a list of ``{"name", "address", "fallback", "aliases"}`` (see ``node_address``).
    Refuses names /etc/hosts cannot hold, a name given to two addresses, and nodes without an IP.
    """
    if not nodes:
        raise ClusterHostsError("cluster_hosts_hosts is empty: no node to name. Fix: run the role on the "
                                "cluster's nodes (site.yml runs it on the groups coordinator and workers)")
    problems, lines, seen = [], [], {}
    for node in nodes:
        host = node.get("name")
        names = [host] + [a for a in (node.get("aliases") or []) if a != host]
        bad = [n for n in names if not isinstance(n, str) or not NAME_RE.match(n)]
        if bad:
            problems.append("%s: %s cannot stand in /etc/hosts (letters, digits, '-', '.' and '_' only, no spaces). "
                            "Fix: rename the host in the inventory, or correct cluster_hosts_aliases for %s"
                            % (host, ", ".join(repr(b) for b in bad), host))
            continue
        try:
            addr = node_address(node)
        except ClusterHostsError as exc:
            problems.append(str(exc))
            continue
        for name in names:
            other = seen.get(name.lower())
            if other and other[1] != addr:
                problems.append("%s: the name %s is given to %s (by %s) and to %s (by %s). Fix: one address per "
                                "name: correct cluster_hosts_address or cluster_hosts_aliases"
                                % (host, name, other[1], other[0], addr, host))
            seen[name.lower()] = (host, addr)
        lines.append(" ".join([addr] + names))
    if problems:
        raise ClusterHostsError("cluster_hosts: " + "; ".join(problems))
    return lines
