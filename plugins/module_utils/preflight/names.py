# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight: does every node resolve every job node's name to the address the cluster uses?

The first address getaddrinfo gives decides (it is the one a connection uses); a node's own name on
loopback or on another of that node's addresses only warns.  The fix depends on who writes the names:
role cluster_hosts (/etc/hosts, the default) or the site's DNS (``cluster_hosts_file: false``).
Pure functions, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ipaddress

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.verdicts import FAIL, PASS, WARN, verdict


def _is_loopback(addr):
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False


def _names_fix(src, wanted, hosts_file_off):
    """One fix for every name ``src`` gets wrong; ``wanted``: [(name, address)]."""
    entries = ", ".join("%s %s" % (want, name) for name, want in wanted)
    names = ", ".join(pair[0] for pair in wanted)
    if src in hosts_file_off:
        return ("cluster_hosts_file is false for %s, so the site's DNS must resolve %s: add them to DNS (%s), or "
                "set cluster_hosts_file: true (the default) and run site.yml, which writes every inventory name "
                "into /etc/hosts on every node (role multinode.deepspeed.cluster_hosts)" % (src, names, entries))
    return ("run site.yml: with cluster_hosts_file: true (the default) its cluster_hosts role writes every "
            "inventory name into /etc/hosts on %s (%s); or add %s to the site's DNS and set cluster_hosts_file: "
            "false" % (src, entries, names))


def name_verdicts(resolved, expected, own_addresses, hosts_file_off=()):
    """Every node resolves every job node's name to the address the cluster uses.

    ``resolved``: source -> name -> ``{"addresses": [...]} or {"error": "..."}`` (getaddrinfo,
    in its order); ``expected``: name -> the address the cluster uses for it (the inventory
    address); ``own_addresses``: name -> every address of that node; ``hosts_file_off``: the
    nodes whose inventory says ``cluster_hosts_file: false`` (the site's DNS names them).
    """
    hosts_file_off = set(hosts_file_off or ())
    out = []
    for src in sorted(resolved):
        problems, notes, wrong = [], [], []
        for name in sorted(expected):
            res = resolved[src].get(name)
            want = expected[name]
            if want is None:
                notes.append("%s: the address the cluster uses for it is unknown, not compared" % name)
                continue
            if res is None:
                problems.append(("%s: not looked up" % name, None))
                continue
            addrs = res.get("addresses") or []
            if not addrs:
                problems.append(("%s does not resolve (%s)" % (name, res.get("error") or "no address"), None))
                wrong.append((name, want))
                continue
            first = addrs[0]
            mine = set(own_addresses.get(name) or [])
            if first == want:
                continue
            if name == src and _is_loopback(first):
                notes.append("its own name resolves to %s (loopback; NCCL and gloo use the interface set for "
                             "them, not this name)" % first)
            elif first in mine:
                notes.append("%s resolves to %s, another address of %s (the cluster uses %s)"
                             % (name, first, name, want))
            else:
                problems.append(("%s resolves to %s, not %s (the address the cluster uses)" % (name, first, want),
                                 "fix the entry for %s in /etc/hosts or DNS on %s (it should be %s)"
                                 % (name, src, want)))
                wrong.append((name, want))
        if wrong:
            problems.append(("", _names_fix(src, wrong, hosts_file_off)))
        if problems:
            out.append(verdict("names", src, FAIL, "; ".join(pr[0] for pr in problems if pr[0]),
                               "; ".join(pr[1] for pr in problems if pr[1]) or None))
        elif notes:
            out.append(verdict("names", src, WARN, "; ".join(notes)))
        else:
            out.append(verdict("names", src, PASS, "resolves %s" % ", ".join(sorted(expected))))
    return out
