# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Gather what the preflight role left on every node of the job (module_utils/preflight/evaluate.gather), then judge
and write the report on the controller, in this process (module_utils/preflight/report: what the module of
the same name runs), without a module round trip."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

from ansible.plugins.action import ActionBase
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.evaluate import gather
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.verdicts import PreflightError
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.report import judge_and_write


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("data", "job", "settings", "dest", "cache_path", "key"))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = dict(self._task.args)
        job = args.pop("job", None)
        if args.get("data") is None:
            if not job:
                result.update(failed=True, msg="preflight_report needs data or job")
                return result
            task_vars = task_vars or {}
            hostvars = task_vars.get("hostvars") or {}
            nodes = list(job.get("coordinators") or []) + list(job.get("rank_hosts") or [])
            workers = (task_vars.get("groups") or {}).get("workers") or []
            args["data"] = gather(job, dict((h, hostvars[h]) for h in nodes if h in hostvars), workers)
        if not args.get("data"):
            result.update(failed=True, msg="preflight_report needs data (or job)")
            return result
        try:
            dest, cache = [os.path.expanduser(str(x)) if x else None for x in (args.get("dest"), args.get("cache_path"))]
            result.update(judge_and_write(args["data"], args.get("settings") or {}, dest, cache, args.get("key"),
                                          bool(self._task.check_mode)))
        except (PreflightError, KeyError, TypeError, ValueError) as exc:
            result.update(failed=True, msg="cannot judge the preflight data: %s: %s" % (type(exc).__name__, exc))
        return result
