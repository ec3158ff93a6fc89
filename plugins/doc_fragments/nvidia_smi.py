# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    """Where nvidia-smi is (accelerator_facts, node_facts)."""

    DOCUMENTATION = r"""
options:
  nvidia_smi:
    description:
      - The C(nvidia-smi) executable, a name looked up in E(PATH) (and the sbin directories) or an absolute path.
      - A node without it has no NVIDIA accelerators (C(multinode_accelerators.status) is V(absent)), which is normal
        for a CPU node.
    type: str
    default: nvidia-smi
"""
