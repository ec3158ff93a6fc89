# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Decide on the controller whether a passing preflight stands for this job (module_utils/preflight/evaluate.py)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.multinode.deepspeed.plugins.module_utils.common.flags import flag
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.evaluate import check_settings, reuse_key, reuse_verdict

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("job", "settings", "max_age", "force", "cache_dir"))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = self._task.args
        job = args.get("job") or {}
        max_age = str(args.get("max_age", 3600)).strip()
        if not max_age.isdigit():
            result.update(failed=True, msg="preflight_max_age=%r must be whole seconds (0: never reuse). Fix: -e "
                                           "preflight_max_age=3600" % (args.get("max_age"),))
            return result
        problems = check_settings(args.get("settings") or {})
        if problems:
            result.update(failed=True, msg="Bad preflight setting (inventory or -e): %s. Fix the value that is out of "
                                           "range." % "; ".join(problems))
            return result
        cache_dir = os.path.expanduser(str(args.get("cache_dir") or "~/.cache/multinode-deepspeed/preflight"))
        hostvars = (task_vars or {}).get("hostvars") or {}
        nodes = list(job.get("coordinators") or []) + list(job.get("rank_hosts") or [])
        key = reuse_key(job, dict((h, hostvars[h]) for h in nodes if h in hostvars), args.get("settings"))
        path = os.path.join(cache_dir, key + ".json")
        record = None
        try:
            with open(path) as fh:
                record = json.load(fh)
        except (IOError, OSError, ValueError):
            record = None
        if flag(args.get("force", False)):
            reuse, why = False, "preflight=force: checking again"
        elif int(max_age) == 0:
            reuse, why = False, "preflight_max_age=0: checking every launch"
        else:
            reuse, why = reuse_verdict(record, key, time.time(), int(max_age))
        result.update(changed=False, reuse=reuse, reason=why, key=key, cache_path=path,
                      record=record if reuse else None,
                      result=dict(record, reused=True, reason=why) if reuse else None)
        # Why the checks run or not, in the play's output as the task runs.
        display.display("Preflight %s: %s" % ("reused" if reuse else "runs", why))
        return result
