#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: node_facts
short_description: Read in one call what a run needs of a node
version_added: "0.3.0"
description:
  - One call per node instead of C(setup), C(accelerator_facts), a C(slurp) of the job variables and an
    import of torch - what C(train.yml) and C(preflight.yml) read of every node before they plan a job.
  - The accelerators, as M(multinode.deepspeed.accelerator_facts) reads them (C(nvidia-smi)).
  - The job variables provisioning wrote, merged (later files win) - the NCCL profile's
    (C(/etc/multinode-deepspeed/deepspeed_env), role C(nccl)) and the CUDA settings the ops were built with
    (C(/etc/multinode-deepspeed/stack.env), role C(stack)). Missing files are skipped.
  - The node's memory, its default route's interface, its addresses, and the versions its venv holds, read from
    the venv's C(*.dist-info) names without importing anything, with a fingerprint that any changed package
    changes (preflight is reused only while every node's fingerprint is the same).
  - With O(port), whether that TCP port is free here (the master port, checked before a launch).
  - Reads only. Both playbooks run it first, on the coordinator and the workers. It fails only when a job variable
    file exists but cannot be read.
  - The parsers (the collection's C(node) module_utils) are unit-tested; so is the module.
extends_documentation_fragment:
  - multinode.deepspeed.nvidia_smi
options:
  paths:
    description: The job variable files, in order of precedence (later wins).
    type: list
    elements: path
    default: [/etc/multinode-deepspeed/deepspeed_env, /etc/multinode-deepspeed/stack.env]
  venv:
    description: The venv the ranks run (role C(stack)'s C(stack_venv_dir)).
    type: path
    default: /opt/multinode-deepspeed/venv
  trainer_dir:
    description: Where role C(stack) put the bundled trainer, C(multinode_ds) (its version is read from it).
    type: path
    default: /opt/multinode-deepspeed/lib/multinode_ds
  record:
    description:
      - The record role C(stack) wrote when it last provisioned the node (C(stack_record_path)); returned, parsed,
        as C(stack_record) (null when it is missing or not JSON). With the fingerprint, it tells role C(stack)
        that nothing changed since, so that pip, the version import and the ops build need not run.
    type: path
  user:
    description:
      - The account the run runs as (C(ssh_mesh_user)); its uid is returned as C(uid) (V(null) where it does not
        exist). The Kubernetes backend runs its pods as that uid unless told otherwise.
    type: str
  port:
    description:
      - A TCP port to test (bind with C(SO_REUSEADDR), as a rendezvous does) - the master port; the default is
        the job's default master port. An empty value tests none.
      - A value that is not a port (1-65535) is not tested - M(multinode.deepspeed.job_plan) reports it with its fix.
    type: str
    default: "29500"
attributes:
  check_mode:
    support: full
    description: Reads only.
  diff_mode:
    support: none
    description: Changes nothing.
seealso:
  - module: multinode.deepspeed.accelerator_facts
  - module: multinode.deepspeed.job_plan
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Read what the plan needs of every node, and whether the master port is free
  multinode.deepspeed.node_facts:
    port: "{{ master_port | default(29500) }}"
"""

RETURN = r"""
ansible_facts:
  description: The facts C(multinode_accelerators), C(multinode_node_env) and C(multinode_node).
  returned: always
  type: dict
  contains:
    multinode_accelerators:
      description: As M(multinode.deepspeed.accelerator_facts) returns it.
      type: dict
    multinode_node_env:
      description:
        - The job variables provisioning wrote, variable name to value, later files of O(paths) winning - the job's
          NCCL variables (role C(nccl), C(docs/roles/nccl.md)) and the CUDA settings the ops were built with (role
          C(stack)).
        - Blank lines, comments and anything that is not an assignment are skipped, and so are missing files.
          M(multinode.deepspeed.job_plan) takes the master's variables into the ranks' environment.
      type: dict
    multinode_node:
      description: C(memtotal_mb), C(interface) (of the default route), C(ipv4) and C(ipv6) (addresses),
        C(versions) (python, torch, cuda, nccl, deepspeed, transformers, trainer; or C(error)),
        C(stack_fingerprint), C(files) (the job variable files read), C(trackers), with O(user) C(uid), and with O(port)
        C(port), C(port_free), C(port_error).
      type: dict
      sample:
        memtotal_mb: 24036
        interface: eth0
        ipv4: [10.89.0.11]
        ipv6: []
        versions: {python: 3.11.2, torch: 2.13.0+cpu, cuda: none, nccl: none, deepspeed: 0.19.8,
                   transformers: 5.23.0, trainer: 0.1.0}
        stack_fingerprint: 3f2a9c0d1e4b5a67
        port: 29500
        port_free: true
        port_error: ""
      contains:
        memtotal_mb:
          description: C(MemTotal) of C(/proc/meminfo) in MiB.
          type: int
        interface:
          description: The interface of the IPv4 default route (C(/proc/net/route), lowest metric).
          type: str
        ipv4:
          description: The node's IPv4 addresses, from C(ip -j addr) (empty without C(ip)).
          type: list
          elements: str
        ipv6:
          description: The node's IPv6 addresses, from C(ip -j addr) (empty without C(ip)).
          type: list
          elements: str
        versions:
          description:
            - C(python), C(torch), C(cuda), C(nccl), C(deepspeed), C(transformers), C(trainer), read from the venv's
              C(pyvenv.cfg) and its C(*.dist-info) directory names, without importing anything.
            - C(cuda) is torch's CUDA build (V(none) for a CPU build), C(nccl) the version of the NCCL wheel (V(none)
              without one); a missing package is V(missing).
            - 'Without a venv, C({"error": "no venv at <venv> (run site.yml)"}).'
          type: dict
        trackers:
          description:
            - The version of the package each of DeepSpeed's monitors needs in the venv - C(tensorboard)
              (tensorboard), C(wandb) (wandb), C(comet) (comet_ml) - or null; the plan refuses C(-e tracking=) of one
              the master lacks.
          type: dict
        uid:
          description: With O(user), that account's uid here (V(null) where it does not exist).
          type: int
        stack_fingerprint:
          description:
            - A hash of the Python version, every C(*.dist-info) name and the trainer's version - any installed, removed
              or changed package changes it (null without a venv).
          type: str
        stack_record:
          description: With O(record), that record (a dict), or null when it is missing or not JSON.
          returned: with O(record)
          type: dict
        files:
          description: The job variable files that were read.
          type: list
          elements: str
        port:
          description: O(port), as a number.
          returned: with O(port)
          type: int
        port_free:
          description:
            - Whether the port could be bound (with C(SO_REUSEADDR), as a rendezvous binds - C(TIME_WAIT) leftovers do
              not count, a listener does).
          returned: with O(port)
          type: bool
        port_error:
          description: 'Why not, for example V(port 29500 is not free: in use); empty when it is free.'
          returned: with O(port)
          type: str
"""

import json
import os
import pwd

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.accelerator import read_accelerators
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.fabric import parse_ip_addr_json
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.node import (
    MASTER_PORT, default_interface, meminfo_total_mb, parse_env, port_state, read_versions, tracker_packages)


def read_text(path):
    try:
        with open(path) as fh:
            return fh.read()
    except (IOError, OSError):
        return ""


def addresses(module):
    ip = module.get_bin_path("ip", required=False)
    if ip is None:
        return [], []
    rc, out, dummy = module.run_command([ip, "-j", "addr", "show"])
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


def main():
    module = AnsibleModule(argument_spec=dict(
        paths=dict(type="list", elements="path",
                   default=["/etc/multinode-deepspeed/deepspeed_env", "/etc/multinode-deepspeed/stack.env"]),
        venv=dict(type="path", default="/opt/multinode-deepspeed/venv"),
        trainer_dir=dict(type="path", default="/opt/multinode-deepspeed/lib/multinode_ds"),
        nvidia_smi=dict(type="str", default="nvidia-smi"),
        user=dict(type="str"),
        record=dict(type="path"),
        port=dict(type="str", default=str(MASTER_PORT))),
        supports_check_mode=True)
    params = module.params
    env, read = {}, []
    for path in params["paths"]:
        if not os.path.isfile(path):
            continue
        try:
            with open(path) as fh:
                env.update(parse_env(fh.read()))
        except (IOError, OSError) as exc:
            module.fail_json(msg="cannot read %s: %s" % (path, exc))
        read.append(path)
    versions, fingerprint = read_versions(params["venv"], params["trainer_dir"])
    ipv4, ipv6 = addresses(module)
    node = {"memtotal_mb": meminfo_total_mb(read_text("/proc/meminfo")),
            "interface": default_interface(read_text("/proc/net/route")),
            "ipv4": ipv4, "ipv6": ipv6, "versions": versions, "stack_fingerprint": fingerprint, "files": read,
            "trackers": tracker_packages(params["venv"])}
    if params["user"]:
        node["uid"] = user_id(params["user"])
    if params["record"]:
        node["stack_record"] = read_record(params["record"])
    port = (params["port"] or "").strip()
    if port.isdigit() and 0 < int(port) < 65536:
        node["port"] = int(port)
        node["port_free"], node["port_error"] = port_state(int(port))
    accelerators = read_accelerators(params["nvidia_smi"], module.get_bin_path, module.run_command)
    module.exit_json(changed=False, ansible_facts={"multinode_accelerators": accelerators,
                                                   "multinode_node_env": env, "multinode_node": node})


if __name__ == "__main__":
    main()
