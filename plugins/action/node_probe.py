# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run the node_probe module, bracketing it with the controller's clock (for the clock-skew bound)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("names", "paths", "ssh_targets", "ssh_timeout", "listen_port", "listen_expect",
                             "listen_seconds", "connect_host", "connect_port", "connect_seconds"))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        before = time.time()
        res = self._execute_module(module_name="multinode.deepspeed.node_probe", module_args=self._task.args,
                                   task_vars=task_vars)
        after = time.time()
        result.update(res)
        if not res.get("failed"):
            result["controller_before"] = before
            # The node read its clock before the waits (SSH, the port test): the bracket ends that much earlier.
            result["controller_after"] = max(before, after - float(res.get("elapsed") or 0))
        return result
