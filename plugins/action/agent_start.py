# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Start a run's agent without Ansible's module wrapper: ``agent_start``'s work is one function of pure module_utils
(``common/spawn.agent_start``), which ``plugin_utils/node_python`` runs in a plain Python start on the node, as the
task's user and on the module's interpreter; each node whose agent starts over SSH (every rank node with ``ssh-free``
and ``slurm``) saves the wrapper's 0.1 s of CPU while its launcher boots.  Without pipelining, with ``async``, in
check mode, or where it gives no result, the module runs as usual."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.multinode.deepspeed.plugins.module_utils.common import spawn
from ansible_collections.multinode.deepspeed.plugins.plugin_utils import node_python


class ActionModule(node_python.DirectAction):
    _VALID_ARGS = frozenset(spawn.AGENT_START_SPEC)
    MODULE = "multinode.deepspeed.agent_start"
    NAME = spawn.__name__
    FUNCTION = "agent_start"
    SPEC = spawn.AGENT_START_SPEC
