# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""run_summary in the controller's own process: the run is already on the controller, so no module is started
(module_utils/run/collected.py does the work; the module runs the same code)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.plugins.action import ActionBase
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.collected import (
    ARGUMENT_SPEC, ReportError, report)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        _spec, params = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        try:
            result.update(report(params, self._task.check_mode))
        except ReportError as exc:
            result.update(failed=True, msg=str(exc))
        return result
