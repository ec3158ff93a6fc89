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
  - With O(records) (the coordinator), the cluster's quarantine and spares records, which every controller that
    drives the cluster shares - read without following a link, only as regular files of at most 1 MiB; a missing one
    is empty, one that cannot be read is a problem naming the file and the fix (M(multinode.deepspeed.job_plan)
    fails with it).
  - Reads only. Both playbooks run it first, on the coordinator and the workers. It fails only when a job variable
    file exists but cannot be read.
  - Its action plugin runs the read (C(node_read) of the collection's module_utils) in a Python start of its own on
    the node, on the interpreter the module would use, piped as a pipelined module is - without Ansible's module
    wrapper, which takes most of a read-only module's CPU on the node (about 0.14 s against 0.03 s). Without
    pipelining, with C(async), or with a C(~) or C($) in a path, it runs as a module; the facts are the same.
  - The parsers (the collection's C(node) module_utils) are unit-tested; so are the module, the action and the
    read run in a Python without Ansible.
extends_documentation_fragment:
  - multinode.deepspeed.nvidia_smi
  - multinode.deepspeed.attributes
  - multinode.deepspeed.attributes.read_only
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
  records:
    description:
      - Read the quarantine and spares records here (the coordinator, where M(multinode.deepspeed.run_recovery)
        writes them) - returned as C(records).
    type: bool
    default: false
  shared_dir:
    description: The cluster's shared directory (C(shared_dir_path)); the records are in its C(runs/.records/)
      unless O(quarantine_file) and O(spares_file) say otherwise.
    type: path
    default: /srv/multinode-deepspeed
  quarantine_file:
    description: The quarantine record's path here (C(quarantine_file)); unset -
      C(<shared_dir>/runs/.records/quarantine.json).
    type: path
  spares_file:
    description: The spares record's path here (C(spares_file)); unset - C(<shared_dir>/runs/.records/spares.json).
    type: path
attributes:
  diff_mode:
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
        C(stack_fingerprint), C(files) (the job variable files read), C(trackers), with O(user) C(uid), with O(port)
        C(port), C(port_free), C(port_error), and with O(records) C(records).
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
        records:
          description:
            - With O(records), C(quarantine_file) and C(spares_file) (the paths read), C(quarantine) (node -> since,
              reason, run_id), C(spares) (node -> run_id, since, until) and C(problems) (a record that is a link,
              not a regular file, larger than 1 MiB, unreadable or not JSON - named, with the fix; it reads as
              empty).
          returned: with O(records)
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

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.node_read import (
    ARGUMENT_SPEC, NodeReadError, read_node)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        facts = read_node(module.params, module.get_bin_path, module.run_command)
    except NodeReadError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, ansible_facts=facts)


if __name__ == "__main__":
    main()
