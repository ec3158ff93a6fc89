# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side wait for the benchmark driver's async job, printing its progress file."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json
import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.multinode.deepspeed.plugins.module_utils.run.watch import (
    ignore_signals, restore_signals, trap_stop_signals)

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("jid", "progress_file", "timeout", "poll_interval", "progress_interval", "stop_pattern"))

    def _module(self, name, args, task_vars):
        return self._execute_module(module_name=name, module_args=args, task_vars=task_vars)

    def _progress(self, path, task_vars):
        res = self._module("ansible.builtin.slurp", {"src": path}, task_vars)
        if res.get("failed") or "content" not in res:
            return None
        try:
            return json.loads(base64.b64decode(res["content"]).decode("utf-8"))
        except ValueError:
            return None

    def _stop(self, pattern, task_vars):
        self._module("ansible.builtin.command", {"argv": ["pkill", "-TERM", "-f", pattern]}, task_vars)

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = self._task.args
        jid = str(args["jid"])
        path = args.get("progress_file")
        timeout = float(args.get("timeout") or 0)
        poll = float(args.get("poll_interval", 2))
        every = float(args.get("progress_interval", 10))
        # The driver's command line carries its run id; a TERM makes it close the workers' sessions.
        pattern = args.get("stop_pattern") or "[m]ultinode_ds.bench run"
        async_dir = self._connection._shell.get_option("async_dir")
        host = task_vars.get("inventory_hostname")
        t0 = time.time()
        last_print, last_line = 0.0, None
        previous = trap_stop_signals()
        try:
            while True:
                job = self._module("ansible.builtin.async_status", {"jid": jid, "_async_dir": async_dir}, task_vars)
                if job.get("failed") and not job.get("finished"):
                    raise RuntimeError("the benchmark's job %s cannot be read: %s" % (jid, job.get("msg")))
                finished = bool(job.get("finished"))
                now = time.time()
                if path and (finished or now - last_print >= every):
                    progress = self._progress(path, task_vars)
                    line = progress.get("line") if progress else "starting the driver"
                    if line != last_line or now - last_print >= every:
                        display.display("[%s] %s" % (host, line), color="cyan")
                        last_print, last_line = now, line
                if finished:
                    break
                if timeout and now - t0 > timeout:
                    self._stop(pattern, task_vars)
                    result.update(failed=True, msg="the benchmark did not finish within %.0f s; it was stopped" % timeout)
                    return result
                time.sleep(poll)
        except BaseException as exc:  # Ctrl-C included: stop the driver, which stops the workers.
            ignore_signals(previous)
            try:
                self._stop(pattern, task_vars)
                display.display("[%s] stopped the benchmark: %s" % (host, exc or type(exc).__name__), color="red")
            except Exception:  # pylint: disable=broad-except
                pass
            raise
        finally:
            restore_signals(previous)
        for key in ("rc", "stdout", "stderr", "stdout_lines", "stderr_lines", "cmd"):
            if key in job:
                result[key] = job[key]
        if job.get("failed") and job.get("msg"):  # the command itself did not run (no such file, ...)
            result["job_msg"] = job["msg"]
        result.update(changed=True, elapsed=time.time() - t0)
        return result
