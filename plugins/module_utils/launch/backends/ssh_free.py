# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""ssh-free: Ansible starts DeepSpeed's per-node launcher on every rank node (``deepspeed.launcher.launch --node_rank
<i>``, what ``deepspeed --no_ssh`` runs); no SSH between nodes."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends


class SshFreeBackend(backends.Backend):
    """Every part's defaults: DeepSpeed's per-node launcher on every rank node, started by the play."""
    NAME = "ssh-free"
    DESCRIPTION = "Ansible starts every node, no SSH between nodes"
