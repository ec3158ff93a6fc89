# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fabric-aware NCCL settings, chosen from a node's fabric facts.

Pure functions over the ``multinode_fabric`` facts returned by the
``fabric_facts`` module (see module_utils/provision/fabric.py):

* ``node_profile`` picks a node's profile (``ib``, ``roce`` or ``tcp``) and
  the variables NCCL and gloo need for it;
* ``job_profile`` checks that the nodes of one job ended on the same profile
  and splits the variables into those every rank can share (the environment
  DeepSpeed's launcher exports) and those that differ per node (left to each
  node's ``/etc/nccl.conf``).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

PROFILES = ("auto", "ib", "roce", "tcp")
RDMA_PROFILES = ("ib", "roce")
# What may go into a .deepspeed_env: DeepSpeed's runner pastes each value into the remote shell command of its pdsh
# launcher (in double quotes unless it matches its own safe set), so a value is a variable name's and a value
# no shell expands: DeepSpeed's safe characters plus NCCL's list prefixes '^' and '='.
ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_VALUE_RE = re.compile(r"[\w@%+=:,./^-]*")
# A network interface (NCCL_SOCKET_IFNAME's forms: eth0, =eth0, ^docker,lo, ib0:1).
IFNAME_RE = re.compile(r"[=^]?[A-Za-z0-9_.:@-]{1,15}(,[A-Za-z0-9_.:@-]{1,15})*")


class NcclError(Exception):
    """The requested or detected settings cannot work on this node or job."""


def _ports(fabric):
    for dev in fabric.get("rdma") or []:
        for port in dev.get("ports") or []:
            yield dev.get("device"), port


def _port_name(dev, port):
    return "%s:%s" % (dev, port.get("port"))


def _describe_ports(fabric):
    out = []
    for dev, port in _ports(fabric):
        out.append("%s %s %s %s" % (_port_name(dev, port), port.get("link_layer") or "?",
                                    port.get("state") or "?", port.get("rate") or ""))
    return "; ".join(o.strip() for o in out)


def rdma_inventory(fabric):
    """Active InfiniBand ports, active RoCE v2 ports and unusable RDMA ports of a node."""
    ib, roce, unusable = [], [], []
    for dev, port in _ports(fabric):
        active = port.get("state") == "ACTIVE"
        layer = port.get("link_layer")
        if active and layer == "InfiniBand":
            ib.append((dev, port))
        elif active and layer == "Ethernet" and port.get("roce_v2_gid_index") is not None:
            roce.append((dev, port))
        else:
            unusable.append((dev, port))
    return ib, roce, unusable


def check_settings(host, socket_ifname, env):
    """``nccl_socket_ifname`` and ``nccl_env`` as the inventory gives them: they reach every launch's
    ``.deepspeed_env`` and DeepSpeed's remote shell command, so a name must be a variable's and a value plain text
    no shell expands.  Raises NcclError naming the host, the variable and the fix."""
    problems = []
    if socket_ifname and not IFNAME_RE.fullmatch(str(socket_ifname)):
        problems.append("nccl_socket_ifname=%r is not a network interface name (letters, digits, '_.:@-', at most "
                        "15 characters, an optional '=' or '^' prefix, a comma-separated list). Fix: set it to the "
                        "interface of the cluster network (ip -br addr on the node)" % (socket_ifname,))
    if not isinstance(env or {}, dict):
        problems.append("nccl_env must be a mapping of variable names to values. Fix: nccl_env: {NCCL_DEBUG: INFO}")
        env = {}
    for key, value in sorted((env or {}).items(), key=lambda kv: str(kv[0])):
        if not isinstance(key, str) or not ENV_KEY_RE.fullmatch(key):
            problems.append("nccl_env: %r is not a variable name. Fix: letters, digits and '_', not starting with "
                            "a digit" % (key,))
        elif value is not None and (isinstance(value, (dict, list)) or not ENV_VALUE_RE.fullmatch(str(value))):
            problems.append("nccl_env: %s=%r would be pasted into the launcher's remote shell command. Fix: use only "
                            "letters, digits and '@%%+=:,./^_-' in %s, or pass it to the ranks in "
                            "deepspeed_rank_env (it reaches them without a shell)" % (key, value, key))
    if problems:
        raise NcclError("host %s: %s." % (host, "; ".join(problems)))


def _socket_ifname(fabric, host, override):
    if override:
        return override
    name = fabric.get("cluster_interface")
    if not name:
        raise NcclError(
            "host %s: cannot tell which network interface carries its inventory address %s, so NCCL's "
            "socket interface is unknown. Fix: set nccl_socket_ifname for %s (host_vars) to the interface "
            "of the cluster network (ip -br addr on the node lists them)."
            % (host, fabric.get("cluster_address") or "(none)", host))
    return name


def choose_profile(fabric, host, requested, inventory):
    """Which profile a node gets, and why: ``(profile, reason)``.

    ``requested`` is one of ``PROFILES``; ``inventory`` is ``rdma_inventory(fabric)``.
    ``auto`` takes InfiniBand over RoCE v2 over tcp; a requested ``ib`` or ``roce``
    the node has no active port for raises NcclError.
    """
    ib, roce, unusable = inventory
    if requested == "auto":
        if ib:
            return "ib", "%d active InfiniBand port(s)" % len(ib)
        if roce:
            return "roce", "%d active RoCE v2 port(s)" % len(roce)
        return "tcp", "no active RDMA port" if (unusable or fabric.get("rdma")) else "no RDMA device"
    if requested == "ib" and not ib:
        raise NcclError(
            "host %s: nccl_profile=ib but the node has no active InfiniBand port (%s). Fix: bring the "
            "ports up (ibstat), or set nccl_profile=auto (or tcp) for %s."
            % (host, _describe_ports(fabric) or "no RDMA device at all", host))
    if requested == "roce" and not roce:
        raise NcclError(
            "host %s: nccl_profile=roce but the node has no active Ethernet-link-layer RDMA port with a "
            "RoCE v2 GID (%s). Fix: configure RoCE v2 on the port, or set nccl_profile=auto (or tcp) for %s."
            % (host, _describe_ports(fabric) or "no RDMA device at all", host))
    return requested, "set by nccl_profile"


def unused_rdma_warnings(host, profile, inventory):
    """The warning (a list of zero or one) that a tcp node leaves RDMA ports it has unused."""
    ib, roce, unusable = inventory
    if profile != "tcp" or not (unusable or ib or roce):
        return []
    names = ", ".join("%s (%s, %s)" % (_port_name(d, p), p.get("link_layer") or "?", p.get("state") or "?")
                      for d, p in (unusable or ib + roce))
    return ["host %s: RDMA hardware is present but not used: %s. The tcp profile sets NCCL_IB_DISABLE=1; "
            "without it NCCL tries the device and can die with 'Call to ibv_modify_qp failed'."
            % (host, names)]


def _hca_list(ports):
    """NCCL_IB_HCA's value for ``ports``: ``=`` (exact names) and the ports, comma-separated."""
    return "=" + ",".join(_port_name(d, p) for d, p in ports)


def choose_hca(host, profile, inventory):
    """Which RDMA ports NCCL uses under ``profile``: ``(ports, variables, warnings)``.

    ``ib`` and ``roce`` list their active ports in NCCL_IB_HCA (``roce`` adds the
    RoCE v2 GID index, the lowest when the ports differ, with a warning); ``tcp``
    disables the IB transport.
    """
    ib, roce = inventory[:2]
    if profile == "ib":
        return ib, {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": _hca_list(ib)}, []
    if profile != "roce":
        return [], {"NCCL_IB_DISABLE": "1"}, []
    warnings = []
    indexes = sorted(set(p["roce_v2_gid_index"] for d, p in roce))
    if len(indexes) > 1:
        warnings.append("host %s: the RoCE ports use different RoCE v2 GID indexes %s; NCCL takes one. "
                        "Using %s; set nccl_env: {NCCL_IB_GID_INDEX: ...} to choose."
                        % (host, indexes, indexes[0]))
    env = {"NCCL_IB_DISABLE": "0", "NCCL_IB_HCA": _hca_list(roce), "NCCL_IB_GID_INDEX": str(indexes[0])}
    return roce, env, warnings


def _apply_overrides(out, env):
    """``env`` (nccl_env) over ``out``: an empty or None value removes the variable."""
    for key, value in (env or {}).items():
        if value is None or value == "":
            out.pop(key, None)
        else:
            out[str(key)] = str(value)
    return out


def node_profile(fabric, host="this node", requested="auto", socket_ifname=None, env=None):
    """Choose the NCCL profile of one node.

    Returns a dict: profile, requested, reason, env (variables for that node),
    warnings (list of str), rdma_ports (the ports NCCL will use) and
    memlock_unlimited (True for the RDMA profiles).  Raises NcclError with a
    message naming the host, the variable and the fix.
    """
    requested = requested or "auto"
    check_settings(host, socket_ifname, env)
    if requested not in PROFILES:
        raise NcclError("host %s: nccl_profile=%r is not a profile. Fix: set nccl_profile to one of %s."
                        % (host, requested, ", ".join(PROFILES)))
    inventory = rdma_inventory(fabric)
    profile, reason = choose_profile(fabric, host, requested, inventory)
    warnings = unused_rdma_warnings(host, profile, inventory)
    ifname = _socket_ifname(fabric, host, socket_ifname)
    out = {"NCCL_SOCKET_IFNAME": "=" + ifname, "GLOO_SOCKET_IFNAME": ifname}
    ports, hca_env, hca_warnings = choose_hca(host, profile, inventory)
    out.update(hca_env)
    warnings.extend(hca_warnings)
    return {
        "profile": profile,
        "requested": requested,
        "reason": reason,
        "env": _apply_overrides(out, env),
        "warnings": warnings,
        "rdma_ports": [_port_name(d, p) for d, p in ports],
        "memlock_unlimited": profile in RDMA_PROFILES,
    }


def job_profile(per_host):
    """Check that the nodes of one job share a profile and split their variables.

    ``per_host`` maps host name to the result of ``node_profile``.  Returns a
    dict: profile, env (the variables identical on every host: what the
    launcher exports to every rank), node_local (variable name to its value per
    host, for the variables that differ: kept in each node's /etc/nccl.conf),
    hosts.  Raises NcclError when the profiles differ.
    """
    if not per_host:
        raise NcclError("no hosts to choose an NCCL profile for. Fix: put the rank nodes in the group 'workers'.")
    profiles = {}
    for host, res in per_host.items():
        profiles.setdefault(res["profile"], []).append(host)
    if len(profiles) > 1:
        lines = ["the nodes of one job would use different NCCL profiles:"]
        for host in sorted(per_host):
            res = per_host[host]
            lines.append("  %-20s %-5s (%s)" % (host, res["profile"], res["reason"]))
        lines.append("NCCL needs the same transport on every rank. Fix: set nccl_profile to one value for all of "
                     "them in group_vars/workers (tcp works everywhere; ib/roce need active ports on every node), "
                     "or fix the ports of the nodes that differ.")
        raise NcclError("\n".join(lines))
    hosts = sorted(per_host)
    keys = set()
    for res in per_host.values():
        keys.update(res["env"])
    shared, node_local = {}, {}
    for key in sorted(keys):
        values = {h: per_host[h]["env"].get(key) for h in hosts}
        distinct = set(values.values())
        if len(distinct) == 1 and None not in distinct:
            shared[key] = distinct.pop()
        else:
            node_local[key] = values
    return {"profile": list(profiles)[0], "env": shared, "node_local": node_local, "hosts": hosts}


def nccl_conf(env):
    """The text of /etc/nccl.conf for a node's variables (NCCL's own keys only)."""
    lines = ["# Written by multinode.deepspeed (role nccl); NCCL reads it at init.",
             "# Variables in a rank's environment take precedence over this file."]
    for key in sorted(env):
        if key.startswith("NCCL_"):
            lines.append("%s=%s" % (key, env[key]))
    return "\n".join(lines) + "\n"


def env_file(env):
    """KEY=VALUE lines, the format of DeepSpeed's .deepspeed_env."""
    for key, value in env.items():
        if "\n" in str(value) or "=" in str(key) or not str(key):
            raise NcclError("variable %r=%r cannot go into an environment file (one KEY=VALUE per line). "
                            "Fix: correct it in nccl_env." % (key, value))
    return "".join("%s=%s\n" % (k, env[k]) for k in sorted(env))
