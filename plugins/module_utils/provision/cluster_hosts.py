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
NAME_RE = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?")
# Only these characters may make up an address (no zone ids, no spaces, no newlines).
ADDRESS_RE = re.compile(r"[0-9A-Fa-f.:]+")


class ClusterHostsError(ValueError):
    pass


def _parse(value):
    """(ip, why it cannot be a node's address) for one candidate; ip is None when it is not an IP."""
    text = str(value).strip() if value is not None else ""
    if not text or not ADDRESS_RE.fullmatch(text):
        return None, None
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None, None
    if ip.is_loopback or ip.is_unspecified or ip.is_multicast or ip.is_link_local:
        kind = ("a loopback" if ip.is_loopback else "the unspecified" if ip.is_unspecified
                else "a multicast" if ip.is_multicast else "a link-local")
        return None, "%s is %s address, which the other nodes cannot reach it at" % (ip, kind)
    return str(ip), None


def _fix_address(host):
    return ("Fix: set cluster_hosts_address: <the IP the other nodes reach it at> for %s in the inventory, "
            "or cluster_hosts_file: false where the site's DNS resolves every inventory name" % host)


def node_address(node):
    """The address the cluster uses for one node, or raise.

    ``node``: ``{"name", "explicit" (cluster_hosts_address, or None), "candidates" (in order: the
    address the fabric facts resolved, ansible_host, the name), "fallback" (its default IPv4 from
    its facts)}``.  An explicit address must be usable; otherwise the first usable candidate wins
    (a fabric address that resolved to loopback, say Debian's 127.0.1.1, is passed over).
    """
    host = node.get("name")
    if node.get("explicit") not in (None, ""):
        ip, why = _parse(node["explicit"])
        if ip:
            return ip
        raise ClusterHostsError("%s: cluster_hosts_address=%r %s. Fix: set it to the IP the other nodes reach %s at"
                                % (host, node["explicit"], why or "is not an IP address", host))
    seen = []
    for value in list(node.get("candidates") or []) + [node.get("fallback")]:
        if value in (None, ""):
            continue
        ip, why = _parse(value)
        if ip:
            return ip
        seen.append(why or "%r is not an IP address" % (value,))
    raise ClusterHostsError("%s: no address for it that the other nodes can use (%s; its facts give no other "
                            "IPv4 address). %s." % (host, "; ".join(seen) or "nothing is set", _fix_address(host)))


def node_from_vars(name, hv):
    """What one host's variables say of it (``hv``: its hostvars, a mapping).

    The address, in order: ``cluster_hosts_address`` (must be usable); the address its fabric facts
    resolved from ``ansible_host`` (``multinode_fabric.cluster_address``, read by site.yml first);
    ``ansible_host``; the inventory name; its default IPv4 from its facts.
    """
    hv = hv or {}
    fabric = hv.get("multinode_fabric") or {}
    facts = hv.get("ansible_facts") or {}
    aliases = hv.get("cluster_hosts_aliases") or []
    if isinstance(aliases, str):
        aliases = [aliases]
    return {"name": name, "explicit": hv.get("cluster_hosts_address"),
            "candidates": [fabric.get("cluster_address"), hv.get("ansible_host"), name],
            "fallback": (facts.get("default_ipv4") or {}).get("address") or "", "aliases": list(aliases)}


def hosts_lines(nodes):
    """The managed block's lines, one per node in the given order: ``"<address> <name> [alias ...]"``.

    ``nodes``: a list of ``node_from_vars`` results.  Refuses names /etc/hosts cannot hold, a name
    given to two addresses, and nodes without a usable IP.
    """
    if not nodes:
        raise ClusterHostsError("cluster_hosts_hosts is empty: no node to name. Fix: run the role on the "
                                "cluster's nodes (site.yml runs it on the groups coordinator and workers)")
    problems, lines, seen = [], [], {}
    for node in nodes:
        host = node.get("name")
        names = [host] + [a for a in (node.get("aliases") or []) if a != host]
        bad = [n for n in names if not isinstance(n, str) or not NAME_RE.fullmatch(n)]
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
