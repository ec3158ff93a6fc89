# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Prepare a run on the coordinator without Ansible's module wrapper: ``run_prepare``'s work is one function of
pure module_utils (``launch/prepare.run_prepare``), which ``plugin_utils/node_python`` runs in a plain Python start
there, on the interpreter, as the user and with the environment the module would get.  It is on the way to every
launch's first step.  In check mode, without pipelining, with ``async``, or where it gives no result, the module
runs as usual."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import prepare
from ansible_collections.multinode.deepspeed.plugins.plugin_utils import node_python


class ActionModule(node_python.DirectAction):
    _VALID_ARGS = frozenset(prepare.ARGUMENT_SPEC)
    MODULE = "multinode.deepspeed.run_prepare"
    NAME = prepare.__name__
    FUNCTION = "run_prepare"
    SPEC = prepare.ARGUMENT_SPEC

    def run(self, tmp=None, task_vars=None):
        # The run's start on the controller's clock (what the summary counts from), taken as its preparation begins.
        started = time.time()
        result = super(ActionModule, self).run(tmp, task_vars)
        result["started"] = started
        return result
