# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side loop over a running job: progress lines, fail-fast abort, cleanup."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.multinode.deepspeed.plugins.module_utils.watch import (
    FAILED, RUNNING, STOPPING, SUCCESS, Interrupted, decide, ignore_signals, progress_line, restore_signals,
    trap_stop_signals)

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("run_dir", "nodes", "launchers", "world_size", "total_steps", "poll_interval",
                             "progress_interval", "heartbeat_timeout", "start_timeout", "stop_timeout",
                             "timeout"))

    def _status(self, task_vars, **kw):
        args = dict(run_dir=self._task.args["run_dir"], touch_lease=True)
        args.update(kw)
        res = self._execute_module(module_name="multinode.deepspeed.run_status", module_args=args,
                                   task_vars=task_vars)
        if res.get("failed"):
            raise RuntimeError("reading the run's status failed: %s" % res.get("msg"))
        return res

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = self._task.args
        nodes = list(args["nodes"])
        launchers = list(args["launchers"])
        world_size = args.get("world_size")
        world_size = int(world_size) if world_size not in (None, "") else None
        total = args.get("total_steps")
        poll = float(args.get("poll_interval", 2))
        every = float(args.get("progress_interval", 10))
        hb_timeout = float(args.get("heartbeat_timeout", 20))
        start_timeout = float(args.get("start_timeout", 120))
        stop_timeout = float(args.get("stop_timeout", 60))
        timeout = float(args.get("timeout", 0) or 0)
        t0 = time.time()
        last_print = 0.0
        last_line = None
        stop_started = None
        reason = None
        verdict = RUNNING
        status = {}
        host = task_vars.get("inventory_hostname")
        # Ansible's worker dies at once on SIGINT/SIGTERM; catch them so that the run is stopped first.
        previous = trap_stop_signals()
        try:
            while True:
                status = self._status(task_vars)
                now = status["now"]
                verdict, reason, action = decide(status, nodes, launchers, now, heartbeat_timeout=hb_timeout,
                                                 start_timeout=start_timeout, started_at=now - (time.time() - t0),
                                                 world_size=world_size)
                if timeout and verdict == RUNNING and time.time() - t0 > timeout:
                    reason = "the run exceeded its timeout of %.0fs" % timeout
                    action = ("abort", reason)
                    verdict = STOPPING
                if action and action[0] == "abort":
                    display.display("[%s] stopping the run on every node: %s" % (host, action[1]), color="red")
                    status = self._status(task_vars, abort=action[1])
                elif action and action[0] == "done":
                    self._status(task_vars, done=True)
                line = progress_line(status, now, total)
                if time.time() - last_print >= every or verdict in (SUCCESS, FAILED):
                    if line != last_line or time.time() - last_print >= every:
                        display.display("[%s] %s" % (host, line), color="cyan")
                        last_print, last_line = time.time(), line
                if verdict in (SUCCESS, FAILED):
                    break
                if verdict == STOPPING:
                    stop_started = stop_started or time.time()
                    if time.time() - stop_started > stop_timeout:
                        reason = "%s; nodes still not stopped after %.0fs" % (reason, stop_timeout)
                        verdict = FAILED
                        break
                time.sleep(poll)
        except BaseException as exc:  # Ctrl-C on the controller included: stop the run everywhere.
            ignore_signals(previous)
            why = ("interrupted on the controller" if isinstance(exc, (KeyboardInterrupt, Interrupted))
                   else "the controller's watch failed: %s" % exc)
            try:
                self._status(task_vars, abort=why)
                display.display("[%s] stopped the run on every node: %s" % (host, why), color="red")
            except Exception:  # pylint: disable=broad-except
                pass  # the agents also stop when the controller's lease expires
            raise
        finally:
            restore_signals(previous)
        result.update(changed=True, status=verdict, reason=reason, nodes=status.get("nodes", {}),
                      abort=status.get("abort"), ranks=status.get("ranks", {}),
                      done_ranks=status.get("done_ranks", []), elapsed=time.time() - t0)
        return result
