#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: agent_start
short_description: Start a run's agent on a node, detached, in one round trip
version_added: "0.3.0"
description:
  - Starts O(argv) (the node's C(multinode_ds.agent), C(job.launch.agent_argv) of M(multinode.deepspeed.job_plan)) in
    a session of its own, with its output in O(log), and returns at once; the agent then starts the node's launcher,
    beats into the run directory, and stops the run's processes on abort or when the controller's lease goes stale.
  - Unlike C(async) + C(poll=0), which cannot use pipelining (it copies a wrapper to the node first), one SSH round
    trip per node - the launch starts that much sooner.
  - Fails when the command cannot start, or when the agent exits within O(settle) seconds (it could not start) -
    C(the agent exited at once with code N) with the last lines of O(log). Always reports C(changed) otherwise.
  - Its action plugin starts the agent from a Python start of its own on the node (C(common/spawn) of the collection's
    module_utils), as the task's user and on the module's interpreter, without Ansible's module wrapper; without
    pipelining or with C(async) it runs as the module.
  - C(train.yml) runs it on every node where the launch backend starts an agent over SSH (C(job.launch.ssh_agents)),
    as the run's user (C(docs/agents.md)).
options:
  argv:
    description: The agent's command line.
    type: list
    elements: str
    required: true
  chdir:
    description: The directory to start it in.
    type: path
  environment:
    description: Variables set over the module's environment.
    type: dict
    default: {}
  log:
    description: The file its standard output and error go to (appended).
    type: path
    required: true
  settle:
    description: Seconds to wait for an early exit.
    type: float
    default: 0.1
extends_documentation_fragment:
  - multinode.deepspeed.attributes
attributes:
  check_mode:
    support: none
    description: Starts a process.
seealso:
  - module: multinode.deepspeed.job_plan
  - module: multinode.deepspeed.watch
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Start the agent where the backend says
  multinode.deepspeed.agent_start:
    argv: "{{ train_job.launch.agent_argv[inventory_hostname] }}"
    chdir: "{{ train_job.run_dir }}"
    log: "{{ train_job.run_dir }}/nodes/{{ inventory_hostname }}.agent.log"
  when: inventory_hostname in train_job.launch.agents
"""

RETURN = r"""
pid:
  description: The agent's process id on the node.
  returned: success
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.common.spawn import AGENT_START_SPEC, agent_start


def main():
    module = AnsibleModule(argument_spec=AGENT_START_SPEC)
    result = agent_start(module.params)
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
