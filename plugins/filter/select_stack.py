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
  - The C(stack) role uses it; the rules, the matrix, the error table and examples are in C(docs/roles/stack.md).
positional: _input, pins, matrix_extra
options:
  _input:
    description:
      - Host name to a dict with C(python) (version), C(accelerator) (C(cuda) or C(cpu)), C(cuda_driver_version)
        (the highest CUDA the driver supports, as nvidia-smi prints it) and C(driver_version); a C(cuda) node needs
        one of the two versions.
    type: dict
    required: true
  pins:
    description: Keys C(torch), C(cuda), C(deepspeed), C(python); empty or missing values are not pinned.
    type: dict
  matrix_extra:
    description:
      - Merged over the built-in matrix (new releases, builds, drivers); a null value deletes an entry (the role's
        C(stack_matrix_extra)).
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
    - C(torch) and C(deepspeed) are the chosen versions (such as V(2.13.0), V(0.19.8)); C(cuda) the GPU nodes' CUDA
      (such as V(13.0)), or null without GPU nodes.
    - Per host - C(builds) (V(cu130), ... or V(cpu)), C(packages) (the requirements, for example
      C([torch==2.13.0+cu130, deepspeed==0.19.8])), C(index_urls) (for example
      C(https://download.pytorch.org/whl/cu130), or null for CPU nodes unless the matrix has a C(cpu_index_url)) and
      C(cuda_toolkit) (the toolkit package suffix such as V(13-0), or null).
    - C(nccl) is the NCCL that build bundles (from the matrix, informational), or null; C(rows) has one row per host.
  type: dict
"""

from ansible.errors import AnsibleFilterError
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.stack_matrix import StackError, load_matrix
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.stack_select import (
    select_stack as _select_stack)
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.stack_table import format_table


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
