# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Network fabric facts: RDMA ports from sysfs, interfaces from ``ip -j addr`` and sysfs.

Pure Python, no Ansible import: unit-tested on the controller against sysfs trees
(tests/fixtures/sysfs).  Every reader takes the sysfs root, so ``/sys`` is only the default.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import ipaddress
import json
import os
import re

ACTIVE = "ACTIVE"
ROCE_V2 = "RoCE v2"

# ARPHRD_* values of /sys/class/net/<name>/type, as ip -j names them in link_type.
_LINK_TYPES = {"1": "ether", "32": "infiniband", "772": "loopback", "768": "ipip", "776": "sit", "65534": "none"}
_RATE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")


def _read(path):
    """A sysfs file's stripped text, or ``None`` when it is missing or unreadable.

    Real sysfs raises OSError (EINVAL) on reading some attributes that are not set,
    such as gid_attrs of unused GID entries or the speed of a link that is down.
    """
    try:
        with open(path) as fh:
            return fh.read().strip()
    except (IOError, OSError, UnicodeDecodeError):
        return None


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except (IOError, OSError):
        return []


def _numeric_entries(path):
    return sorted(int(e) for e in _listdir(path) if e.isdigit())


def _code_and_name(text):
    """``"4: ACTIVE"`` -> ``(4, "ACTIVE")``; ``(None, text)`` without a code."""
    if text is None:
        return None, None
    code, sep, name = text.partition(":")
    if sep and code.strip().isdigit():
        return int(code), name.strip()
    return None, text


def parse_rate(text):
    """``"400 Gb/sec (4X NDR)"`` -> ``400.0``; ``None`` when not a rate."""
    match = _RATE_RE.match(text or "")
    return float(match.group(1)) if match else None


def _is_zero_gid(gid):
    return not gid or set(gid.replace(":", "")) <= set("0")


def _ipv4_mapped(gid):
    try:
        return ipaddress.IPv6Address(gid).ipv4_mapped is not None
    except ValueError:
        return False


def roce_v2_gid_index(port_dir):
    """The GID index NCCL should use on a RoCE port (``NCCL_IB_GID_INDEX``), or ``None``.

    The lowest index whose type is RoCE v2 and whose GID is set, preferring an
    IPv4-mapped GID (``::ffff:a.b.c.d``) over any other (such as the fe80 link-local one).
    """
    fallback = None
    for index in _numeric_entries(os.path.join(port_dir, "gids")):
        if _read(os.path.join(port_dir, "gid_attrs", "types", str(index))) != ROCE_V2:
            continue
        gid = _read(os.path.join(port_dir, "gids", str(index)))
        if _is_zero_gid(gid):
            continue
        if _ipv4_mapped(gid):
            return index
        if fallback is None:
            fallback = index
    return fallback


def _ib_netdev(dev_dir, port):
    """The netdev of an InfiniBand port (IPoIB): the one whose dev_port is port-1, else the first."""
    net_dir = os.path.join(dev_dir, "device", "net")
    names = _listdir(net_dir)
    for name in names:
        if _read(os.path.join(net_dir, name, "dev_port")) == str(port - 1):
            return name
    return names[0] if names else None


def _roce_netdev(port_dir, gid_index):
    ndevs = os.path.join(port_dir, "gid_attrs", "ndevs")
    if gid_index is not None:
        name = _read(os.path.join(ndevs, str(gid_index)))
        if name:
            return name
    for index in _numeric_entries(ndevs):
        name = _read(os.path.join(ndevs, str(index)))
        if name:
            return name
    return None


def read_rdma(sysfs_root="/sys"):
    """RDMA devices and ports under ``<sysfs_root>/class/infiniband``; ``[]`` without any.

    Each device: ``{device, ports: [{port, state, state_code, phys_state, rate, rate_gbps,
    link_layer, netdev, roce_v2_gid_index}]}``, sorted by device name then port.
    ``roce_v2_gid_index`` is only set on Ethernet (RoCE) ports.
    """
    base = os.path.join(sysfs_root, "class", "infiniband")
    devices = []
    for device in _listdir(base):
        dev_dir = os.path.join(base, device)
        ports = []
        for port in _numeric_entries(os.path.join(dev_dir, "ports")):
            port_dir = os.path.join(dev_dir, "ports", str(port))
            state_code, state = _code_and_name(_read(os.path.join(port_dir, "state")))
            phys_state = _code_and_name(_read(os.path.join(port_dir, "phys_state")))[1]
            rate = _read(os.path.join(port_dir, "rate"))
            link_layer = _read(os.path.join(port_dir, "link_layer"))
            gid_index = None
            if link_layer == "Ethernet":
                gid_index = roce_v2_gid_index(port_dir)
                netdev = _roce_netdev(port_dir, gid_index) or _ib_netdev(dev_dir, port)
            else:
                netdev = _ib_netdev(dev_dir, port)
            ports.append({
                "port": port,
                "state": state,
                "state_code": state_code,
                "phys_state": phys_state,
                "rate": rate,
                "rate_gbps": parse_rate(rate),
                "link_layer": link_layer,
                "netdev": netdev,
                "roce_v2_gid_index": gid_index,
            })
        devices.append({"device": device, "ports": ports})
    return devices


def active_ports(rdma):
    """``["mlx5_0:1", ...]``: the ACTIVE ports, as NCCL_IB_HCA names them."""
    return ["%s:%d" % (d["device"], p["port"]) for d in rdma for p in d["ports"] if p["state"] == ACTIVE]


def parse_ip_addr_json(text):
    """Interfaces from ``ip -j addr``: ``[{name, operstate, mtu, mac, link_type, ipv4, ipv6}]``.

    ``ipv4``/``ipv6`` hold ``address/prefixlen`` strings.  Raises ValueError on text that
    is not ip's JSON list.
    """
    data = json.loads(text or "[]")
    if not isinstance(data, list):
        raise ValueError("ip -j addr did not print a JSON list")
    out = []
    for entry in data:
        if not isinstance(entry, dict) or not entry.get("ifname"):
            continue
        addrs = {"inet": [], "inet6": []}
        for info in entry.get("addr_info") or []:
            if isinstance(info, dict) and info.get("family") in addrs and info.get("local"):
                addrs[info["family"]].append("%s/%s" % (info["local"], info.get("prefixlen")))
        out.append({
            "name": entry["ifname"],
            "operstate": entry.get("operstate"),
            "mtu": entry.get("mtu"),
            "mac": entry.get("address"),
            "link_type": entry.get("link_type"),
            "ipv4": addrs["inet"],
            "ipv6": addrs["inet6"],
        })
    return out


def _int_or_none(text):
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def read_net(sysfs_root="/sys", names=None):
    """``{name: {speed_mbps, operstate, mtu, mac, link_type}}`` from ``<sysfs_root>/class/net``.

    ``names``: the interfaces to read (default: every entry).  ``speed_mbps`` is ``None``
    when sysfs reports -1 or cannot read it (virtual or down links).
    """
    base = os.path.join(sysfs_root, "class", "net")
    if names is None:
        names = _listdir(base)
    out = {}
    for name in names:
        path = os.path.join(base, name)
        if not os.path.isdir(path):
            continue
        speed = _int_or_none(_read(os.path.join(path, "speed")))
        kind = _read(os.path.join(path, "type"))
        out[name] = {
            "speed_mbps": speed if speed is not None and speed > 0 else None,
            "operstate": _read(os.path.join(path, "operstate")),
            "mtu": _int_or_none(_read(os.path.join(path, "mtu"))),
            "mac": _read(os.path.join(path, "address")),
            "link_type": _LINK_TYPES.get(kind, kind),
        }
    return out


def interfaces_from_net(net):
    """Interfaces in ``parse_ip_addr_json``'s shape from ``read_net`` alone (no ``ip``): no addresses."""
    return [{
        "name": name,
        "operstate": (info["operstate"] or "").upper() or None,
        "mtu": info["mtu"],
        "mac": info["mac"],
        "link_type": info["link_type"],
        "ipv4": [],
        "ipv6": [],
    } for name, info in sorted(net.items())]


def _ip(text):
    try:
        return ipaddress.ip_address(str(text).split("%", 1)[0].split("/", 1)[0])
    except ValueError:
        return None


def is_ip(text):
    """Whether ``text`` is an IPv4 or IPv6 address (not a host name)."""
    return text is not None and _ip(text) is not None


def cluster_interface(interfaces, address):
    """The name of the interface that carries ``address`` (an IP, not a name), or ``None``."""
    wanted = _ip(address) if address else None
    if wanted is None:
        return None
    for iface in interfaces:
        for cidr in iface.get("ipv4", []) + iface.get("ipv6", []):
            if _ip(cidr) == wanted:
                return iface["name"]
    return None


def _is_loopback(iface):
    return iface.get("link_type") == "loopback" or iface.get("name") == "lo"


def fabric_facts(rdma, interfaces, net, address=None):
    """The ``multinode_fabric`` facts.

    ``rdma``: ``read_rdma``; ``interfaces``: ``parse_ip_addr_json`` (or ``interfaces_from_net``);
    ``net``: ``read_net``; ``address``: the node's inventory address as an IP (the module
    resolves names).  Loopback interfaces are left out of ``interfaces`` (but can still be the
    cluster interface of a node addressed as 127.0.0.1).
    """
    merged = []
    for iface in interfaces:
        if _is_loopback(iface):
            continue
        item = dict(iface)
        item["speed_mbps"] = (net.get(iface["name"]) or {}).get("speed_mbps")
        merged.append(item)
    cluster = cluster_interface(interfaces, address)
    return {
        "rdma": rdma,
        "rdma_active_ports": active_ports(rdma),
        "interfaces": merged,
        "cluster_interface": cluster,
        "cluster_address": address,
        "cluster_speed_mbps": (net.get(cluster) or {}).get("speed_mbps") if cluster else None,
    }
