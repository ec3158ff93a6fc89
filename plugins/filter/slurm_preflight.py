# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: slurm_preflight
short_description: Preflight's verdicts on munge and Slurm's versions across a job's nodes
version_added: "0.5.0"
description:
  - A munge credential made on the controller must decode on every node (one key, munged running, close clocks).
  - Every node must run the controller's Slurm version.
  - The C(backend) role's C(slurm) entry point uses it, which the C(preflight) role includes for a job with
    C(backend=slurm) (C(docs/backends.md)).
positional: _input, munge, versions
options:
  _input:
    description: The controller (inventory name).
    type: str
    required: true
  munge:
    description: Host -> the registered result of C(unmunge) fed the controller's credential (C(rc), C(stderr)).
    type: dict
    required: true
  versions:
    description: Host -> the version text its Slurm reports (C(slurmd -V), C(sinfo --version)), or null.
    type: dict
    required: true
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Judge munge and the versions
  ansible.builtin.set_fact:
    verdicts: "{{ 'coord' | multinode.deepspeed.slurm_preflight({'worker1': {'rc': 0}}, {'coord': 'slurm 22.05.8'}) }}"
"""

RETURN = r"""
_value:
  description: Verdicts (C(check), C(host), C(status), C(detail), C(fix)).
  type: list
  elements: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight import slurm


def slurm_preflight(controller, munge, versions):
    try:
        return slurm.preflight_verdicts(controller, dict(munge or {}), dict(versions or {}))
    except (AttributeError, TypeError, ValueError) as exc:
        raise AnsibleFilterError("slurm_preflight: %s: %s" % (type(exc).__name__, exc))


class FilterModule(object):
    def filters(self):
        return {"slurm_preflight": slurm_preflight}
