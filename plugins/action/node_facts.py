# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read a node without Ansible's module wrapper: ``node_facts``' work is one function of pure module_utils
(``provision/node_read.node_facts``), which ``plugin_utils/node_python`` runs in a plain Python start on the node,
on the interpreter and with the environment the module would get, its script piped to it as a pipelined module's.
That takes about 0.03 s of the node's CPU instead of 0.14 s: with every node of a cluster read before each launch,
the difference grows with the cluster.  Where that cannot be done as the module would (no pipelining, ``async``,
an argument the module's own check must judge, a ``~`` or ``$`` in a path the node must expand) or it does not
answer with a result, the module runs as usual and gives the same facts."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import node_read
from ansible_collections.multinode.deepspeed.plugins.plugin_utils import node_python


class ActionModule(node_python.DirectAction):
    _VALID_ARGS = frozenset(node_read.ARGUMENT_SPEC)
    MODULE = "multinode.deepspeed.node_facts"
    NAME = node_read.__name__
    FUNCTION = "node_facts"
    SPEC = node_read.ARGUMENT_SPEC
    READ_ONLY = True
