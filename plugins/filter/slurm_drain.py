# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: slurm_drain
short_description: The scontrol commands that keep a run's lost nodes out of Slurm, or give them back
version_added: "0.6.0"
description:
  - With a list of the job's failed nodes (inventory names) and O(why) - one C(scontrol update NodeName=...
    State=DRAIN Reason=multinode-deepspeed ...) argv (Slurm's node names, the reason one line of safe text).
  - With O(release) - the lines of C(sinfo -h -N -o '%N|%E') - one C(scontrol update ... State=RESUME) argv for each
    node of the job's C(unquarantine) that this collection drained (its reason starts with C(multinode-deepspeed));
    a node someone else drained stays drained.
  - The C(backend) role's C(slurm) tasks (step C(recover) and C(release)) run them on the Slurm controller.
positional: _input, job
options:
  _input:
    description: The failed nodes (inventory names), or the sinfo lines with O(release).
    type: list
    elements: str
    required: true
  job:
    description: The job, as M(multinode.deepspeed.job_plan) returns it (its C(scheduler_names) and
      C(unquarantine_names)).
    type: dict
    required: true
  why:
    description: Why the nodes are drained (without O(release)).
    type: str
    default: lost in a run
  release:
    description: Whether the input is sinfo's lines and the nodes let out of quarantine are resumed.
    type: bool
    default: false
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Drain the node lost in the run
  ansible.builtin.command:
    argv: "{{ item }}"
  loop: "{{ ['worker2'] | multinode.deepspeed.slurm_drain(job, why='lost in run r1 (attempt 1)') }}"
"""

RETURN = r"""
_value:
  description: The scontrol argvs (a list of lists of strings).
  type: list
  elements: list
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends.slurm import drain


def slurm_drain(nodes, job, why="lost in a run", release=False):
    if not isinstance(job, dict):
        raise AnsibleFilterError("slurm_drain: job must be the job plan (a dict), got %s" % type(job).__name__)
    if release:
        return drain.resume_argvs(job, nodes or [])
    return drain.drain_argvs(job, list(nodes or []), str(why))


class FilterModule(object):
    def filters(self):
        return {"slurm_drain": slurm_drain}
