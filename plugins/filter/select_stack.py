# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: select_stack
short_description: Choose one matched driver, CUDA, PyTorch and DeepSpeed stack for the whole cluster
version_added: "0.2.0"
description:
  - Takes every node's Python version, accelerator and NVIDIA driver (from M(multinode.deepspeed.accelerator_facts))
    and the user's pins, and picks the newest consistent set from the collection's compatibility matrix. One torch
    release everywhere, one CUDA build on every GPU node (the newest that every node's driver runs), the CPU build
    of the same release on CPU nodes, and a DeepSpeed release whose torch and Python ranges fit.
  - Fails with a table naming each node, what it has and what it needs, and one line per problem naming the
    host, the variable and the fix, when no consistent set exists or a pin contradicts a node's driver.
  - The matrix is data (the collection's C(stack_matrix_data) module_utils); O(matrix_extra) extends or overrides it.
positional: _input, pins, matrix_extra
options:
  _input:
    description:
      - Host name to a dict with C(python) (version), C(accelerator) (C(cuda) or C(cpu)), C(cuda_driver_version)
        (the highest CUDA the driver supports, as nvidia-smi prints it) and C(driver_version).
    type: dict
    required: true
  pins:
    description: Keys C(torch), C(cuda), C(deepspeed), C(python); empty values are not pinned.
    type: dict
  matrix_extra:
    description: Merged over the built-in matrix (new releases, builds, drivers); a null value deletes an entry.
    type: dict
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Choose the stack for the play's hosts
  ansible.builtin.set_fact:
    stack_selection: "{{ nodes | multinode.deepspeed.select_stack({'torch': '2.13.0', 'deepspeed': '0.19.8'}) }}"
  run_once: true
"""

RETURN = r"""
_value:
  description:
    - Keys C(torch), C(deepspeed), C(cuda), C(builds), C(packages), C(index_urls), C(cuda_toolkit) (per host),
      C(nccl), C(rows) and C(table) (the rows as a fixed-width text table).
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.stack_matrix import (
    StackError, format_table, load_matrix, select_stack as _select_stack)


def select_stack(nodes, pins=None, matrix_extra=None):
    clean = dict((k, v) for k, v in (pins or {}).items() if v not in (None, ""))
    try:
        matrix = load_matrix(matrix_extra or None)
        result = _select_stack(nodes or {}, clean, matrix)
    except StackError as exc:
        raise AnsibleFilterError(str(exc))
    except ValueError as exc:
        raise AnsibleFilterError("stack_matrix_extra is not valid: %s. Fix: correct stack_matrix_extra." % exc)
    result = dict(result)
    result["table"] = format_table(result["rows"])
    return result


class FilterModule(object):
    def filters(self):
        return {"select_stack": select_stack}
