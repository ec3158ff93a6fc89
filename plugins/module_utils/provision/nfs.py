# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The NFS export's settings judged by what they mean, not by how they are spelled.

``export_problems`` reads the clients, export options and mount options the ``nfs`` role would write and returns
one sentence per problem, each with its fix (an empty list: safe).  A client is an IP address, a network or a host
name; a network wider than a /16 (IPv4) or a /48 (IPv6), a wildcard, a netgroup or anything the exports file would
read as more than a client is refused unless ``allow_wide`` says the export is meant that wide.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ipaddress
import re

HOSTNAME_RE = re.compile(r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                         r"[A-Za-z0-9])?)*\.?")
# A host pattern or a netgroup, as exports(5) reads them (nothing else: no space, no parenthesis).
PATTERN_RE = re.compile(r"[A-Za-z0-9.*?\[\]-]+|@[A-Za-z0-9_.-]+")
OPTION_RE = re.compile(r"[a-z_]+(=[A-Za-z0-9_.:/@-]+)?")
# The largest id anonuid=/anongid= may give: 2**32 - 1 is the invalid id, and nfs-utils keeps ids modulo 2**32.
MAX_ANON_ID = 2 ** 32 - 2
# The widest network an export may name without allow_wide (addresses in it: 65536 for IPv4).
WIDEST_PREFIX = {4: 16, 6: 48}
REFUSED_OPTIONS = {
    "no_root_squash": "root on every client would be root on the export",
    "insecure": "any local user of a client could mount it from an unprivileged port",
    "async": "the server would answer before data is on disk (a checkpoint can be lost in a crash)",
    "no_auth_nlm": "locks would be taken without checking who asks",
    "insecure_locks": "locks would be taken without checking who asks",
}


def _client_problem(client, allow_wide):
    text = str(client).strip()
    try:
        net = ipaddress.ip_network(text, strict=False)
    except ValueError:
        net = None
    if net is not None:
        if net.prefixlen < WIDEST_PREFIX[net.version] and not allow_wide:
            return ("nfs_export_clients: %s is %s (%d addresses), wider than the cluster. Fix: name the nodes' "
                    "addresses or their subnet (at most a /%d), or set nfs_export_allow_wide: true if it is meant"
                    % (text, net, net.num_addresses, WIDEST_PREFIX[net.version]))
        return None
    if PATTERN_RE.fullmatch(text) and (any(c in text for c in "*?[]") or text.startswith("@")):
        if allow_wide:
            return None
        return ("nfs_export_clients: %s names hosts by a pattern or netgroup (any host whose name matches could mount "
                "it). Fix: list the nodes' addresses, or set nfs_export_allow_wide: true if it is meant" % text)
    if not HOSTNAME_RE.fullmatch(text):
        return ("nfs_export_clients: %r is not an address, a network or a host name (the exports file would read "
                "more into it). Fix: give an address such as 10.0.0.11, a network such as 10.0.0.0/24, or a host "
                "name" % (client,))
    return None


def _anon_id(value):
    """``value`` of anonuid=/anongid= as the id nfs-utils would map squashed users to, or None when that is not a
    plain decimal id of a non-root account: a sign, an empty value, 0 or anything from 2**32 - 1 up (kept modulo 2**32
    by the kernel's 32-bit id, so 4294967296 is root and 4294967295 is the invalid id) is refused."""
    if not value or not value.isdigit():
        return None
    number = int(value)
    return number if 0 < number <= MAX_ANON_ID else None


def _option_problems(options):
    problems, seen = [], {}
    for option in options:
        text = str(option).strip().lower()
        if not OPTION_RE.fullmatch(text):
            problems.append("nfs_export_options: %r is not an export option. Fix: e.g. rw, sync, root_squash" % option)
            continue
        key, _sep, value = text.partition("=")
        seen[key] = value
        if key in REFUSED_OPTIONS:
            problems.append("nfs_export_options: %s - %s. Fix: leave %s out" % (key, REFUSED_OPTIONS[key], key))
        elif key in ("anonuid", "anongid") and _anon_id(value) is None:
            problems.append("nfs_export_options: %s=%s is not a plain id from 1 to %d (nfs-utils reads it with "
                            "strtol into a 32-bit id, so 0, -0 and 4294967296 all become root's id, which undoes "
                            "root_squash). Fix: leave %s out (nobody) or give a non-root id such as 65534"
                            % (key, value, MAX_ANON_ID, key))
    if "sync" not in seen:
        problems.append("nfs_export_options: no sync. Fix: add sync (the default), so a write is on disk when the "
                        "server says so")
    if "root_squash" not in seen and "all_squash" not in seen:
        problems.append("nfs_export_options: neither root_squash nor all_squash. Fix: add root_squash (the default)")
    return problems


def _mount_problems(mount_options):
    keys = set(str(o).strip().lower().partition("=")[0] for o in mount_options)
    problems = []
    if "soft" in keys or "hard" not in keys:
        problems.append("nfs_mount_options: %s. Fix: mount with hard (a soft mount returns I/O errors to a rank "
                        "writing a checkpoint when the server is slow)" % ("soft" if "soft" in keys else "no hard"))
    if "_netdev" not in keys:
        problems.append("nfs_mount_options: no _netdev. Fix: add _netdev, so boot waits for the network")
    return problems


def export_problems(settings):
    """``settings``: clients (list), options (list), mount_options (list), owner, allow_wide (bool) -> a list of
    problems, each with its fix."""
    clients = list(settings.get("clients") or [])
    allow_wide = bool(settings.get("allow_wide"))
    problems = [] if clients else ["nfs_export_clients: no client to export to. Fix: list the nodes' addresses"]
    problems += [p for p in (_client_problem(c, allow_wide) for c in clients) if p]
    problems += _option_problems(list(settings.get("options") or []))
    problems += _mount_problems(list(settings.get("mount_options") or []))
    if str(settings.get("owner") or "root") == "root":
        problems.append("nfs_export_owner: root; with root_squash, root on the clients writes as nobody. Fix: run "
                        "DeepSpeed as a non-root ssh_mesh_user with the same uid on every node (the default, "
                        "deepspeed), which nfs_export_owner defaults to")
    return problems
