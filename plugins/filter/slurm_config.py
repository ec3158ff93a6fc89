# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: slurm_config
short_description: Slurm's files (slurm.conf, gres.conf, slurmdbd.conf) from the role's settings and the nodes' facts
version_added: "0.5.0"
description:
  - Checks the settings first; returns every problem (naming the host, the variable and the fix) instead of files
    when there is one, so that the role fails before anything on the nodes changes.
  - One C(NodeName) line per worker (CPUs, RealMemory at 95% of the kernel's total, C(Gres=gpu:N) for GPUs), one
    partition (every worker, or the C(partition_nodes) of O(_input)).
  - The C(slurm) role uses it (C(docs/roles/slurm.md)).
positional: _input, controller, nodes
options:
  _input:
    description:
      - The settings, keys C(cluster_name), C(partition), C(partition_nodes), C(slurmd_timeout), C(kill_wait), C(batch_sched_delay),
        C(backfill_interval), C(accounting) (C(slurmdbd) or C(none)), C(proctrack), C(task_plugin), C(select_parameters), C(extra).
    type: dict
    required: true
  controller:
    description: The coordinator, C(name) (inventory), C(hostname) (its own) and C(addr).
    type: dict
    required: true
  nodes:
    description: The workers, each C(name), C(hostname), C(addr), C(cpus), C(memtotal_mb), C(gpus).
    type: list
    elements: dict
    required: true
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Compute Slurm's files
  ansible.builtin.set_fact:
    slurm_files: "{{ slurm_settings | multinode.deepspeed.slurm_config(controller, nodes) }}"
"""

RETURN = r"""
_value:
  description: C(problems) (list of sentences, empty when the settings are good), C(slurm.conf), C(gres.conf),
    C(slurmdbd.conf) (texts, absent when there are problems).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import slurm_conf


def slurm_config(settings, controller, nodes):
    try:
        conf_nodes = slurm_conf.conf_nodes(nodes or [])
        problems = slurm_conf.conf_problems(settings or {}, (controller or {}).get("name"), conf_nodes)
        if problems:
            return {"problems": problems}
        return {"problems": [], "slurm.conf": slurm_conf.render_conf(settings, controller, conf_nodes),
                "gres.conf": slurm_conf.render_gres(conf_nodes),
                "slurmdbd.conf": slurm_conf.render_dbd(controller["hostname"])}
    except (KeyError, TypeError, ValueError) as exc:
        raise AnsibleFilterError("slurm_config: %s: %s" % (type(exc).__name__, exc))


class FilterModule(object):
    def filters(self):
        return {"slurm_config": slurm_config}
