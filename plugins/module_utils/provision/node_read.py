# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What module ``node_facts`` reads of a node, as one function of its parameters.

Pure Python, no Ansible import: the module runs it under ``AnsibleModule``, and the ``node_facts`` action plugin
runs it in a Python start of its own on the node (``plugin_utils/node_python``), without Ansible's module wrapper.
``get_bin_path(name, required=False)`` and ``run_command(argv) -> (rc, out, err)`` are the two ways it reaches
the system: ``AnsibleModule``'s, or :func:`which` and :func:`run`.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import pwd

from ansible_collections.multinode.deepspeed.plugins.module_utils.common.records import SHARED_DIR, read_all
from ansible_collections.multinode.deepspeed.plugins.module_utils.common.spawn import run
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.accelerator import read_accelerators
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.fabric import parse_ip_addr_json
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.node import (
    MASTER_PORT, default_interface, meminfo_total_mb, parse_env, port_state, read_versions, tracker_packages)

# The module's argument spec (the action plugin checks a task's arguments against the same one).
ARGUMENT_SPEC = dict(
    paths=dict(type="list", elements="path",
               default=["/etc/multinode-deepspeed/deepspeed_env", "/etc/multinode-deepspeed/stack.env"]),
    venv=dict(type="path", default="/opt/multinode-deepspeed/venv"),
    trainer_dir=dict(type="path", default="/opt/multinode-deepspeed/lib/multinode_ds"),
    nvidia_smi=dict(type="str", default="nvidia-smi"),
    user=dict(type="str"),
    record=dict(type="path"),
    port=dict(type="str", default=str(MASTER_PORT)),
    # The coordinator: the cluster's quarantine and spares records (common/records.py).
    records=dict(type="bool", default=False),
    shared_dir=dict(type="path", default=SHARED_DIR),
    quarantine_file=dict(type="path"),
    spares_file=dict(type="path"))
# Where a command is looked up besides PATH, as AnsibleModule.get_bin_path does.
SBIN = ["/sbin", "/usr/sbin", "/usr/local/sbin"]


class NodeReadError(Exception):
    """A job variable file exists but cannot be read (the module fails with this message)."""


def which(name, required=False):
    """``name`` on PATH or in the sbin directories (None when it is nowhere), as ``AnsibleModule.get_bin_path``."""
    dirs = os.environ.get("PATH", "").split(os.pathsep) + SBIN
    for directory in dirs:
        path = os.path.join(directory, name)
        if directory and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def read_text(path):
    try:
        with open(path) as fh:
            return fh.read()
    except (IOError, OSError):
        return ""


def addresses(get_bin_path, run_command):
    """The node's IPv4 and IPv6 addresses from ``ip -j addr show`` (none without ``ip``)."""
    ip = get_bin_path("ip", required=False)
    if ip is None:
        return [], []
    rc, out, dummy = run_command([ip, "-j", "addr", "show"])
    try:
        interfaces = parse_ip_addr_json(out) if rc == 0 else []
    except ValueError:
        interfaces = []
    return ([a.split("/")[0] for i in interfaces for a in i["ipv4"]],
            [a.split("/")[0] for i in interfaces for a in i["ipv6"]])


def user_id(name):
    """The uid of account ``name``, or None where it does not exist."""
    try:
        return pwd.getpwnam(name).pw_uid
    except KeyError:
        return None


def read_record(path):
    """A JSON object from ``path``; None when it is missing, unreadable or not an object."""
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (IOError, OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_node(params, get_bin_path, run_command):
    """The facts ``node_facts`` returns, for its (checked) parameters; raises NodeReadError for an unreadable file."""
    env, read = {}, []
    for path in params["paths"]:
        if not os.path.isfile(path):
            continue
        try:
            with open(path) as fh:
                env.update(parse_env(fh.read()))
        except (IOError, OSError) as exc:
            raise NodeReadError("cannot read %s: %s" % (path, exc))
        read.append(path)
    versions, fingerprint = read_versions(params["venv"], params["trainer_dir"])
    ipv4, ipv6 = addresses(get_bin_path, run_command)
    node = {"memtotal_mb": meminfo_total_mb(read_text("/proc/meminfo")),
            "interface": default_interface(read_text("/proc/net/route")),
            "ipv4": ipv4, "ipv6": ipv6, "versions": versions, "stack_fingerprint": fingerprint, "files": read,
            "trackers": tracker_packages(params["venv"])}
    if params["user"]:
        node["uid"] = user_id(params["user"])
    if params["record"]:
        node["stack_record"] = read_record(params["record"])
    if params.get("records"):
        node["records"] = read_all(params["shared_dir"], params["quarantine_file"], params["spares_file"])
    port = (params["port"] or "").strip()
    if port.isdigit() and 0 < int(port) < 65536:
        node["port"] = int(port)
        node["port_free"], node["port_error"] = port_state(int(port))
    accelerators = read_accelerators(params["nvidia_smi"], get_bin_path, run_command)
    return {"multinode_accelerators": accelerators, "multinode_node_env": env, "multinode_node": node}


def node_facts(params):
    """The module's result, run on the node without Ansible's module wrapper (the action plugin's way)."""
    try:
        facts = read_node(params, which, run)
    except NodeReadError as exc:
        return {"failed": True, "msg": str(exc)}
    return {"changed": False, "ansible_facts": facts}
