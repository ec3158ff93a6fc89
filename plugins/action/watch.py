# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side loop over a running job: progress lines, fail-fast abort, cleanup."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import shlex
import subprocess
import tempfile
import threading
import time

from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.bundle import MAX_BYTES as BUNDLE_BYTES
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.bundle import unpack
from ansible_collections.multinode.deepspeed.plugins.module_utils.run import grow, status
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.pace import Pace
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.stragglers import (
    Stragglers, describe, moved_reason, save_wait, saved_at)
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.summary import lost_nodes
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.watch import (
    FAILED, RUNNING, STATUS_RETRY, STATUS_TIMEOUT, STOPPING, SUCCESS, Interrupted, StatusRetry, abort_for_disk,
    abort_for_pods, abort_for_queue, abort_for_stall, abort_for_straggler, abort_for_timeout, abort_to_grow, decide,
    disk_full, give_up_reason, ignore_signals, interruption_reason, progress_line, queue_state, restore_signals, stalled, start_time,
    stop_overdue, switch_line, switch_keepalive, trap_stop_signals, quiet_nodes, unreachable, watch_options)
from ansible_collections.multinode.deepspeed.plugins.plugin_utils import node_python

display = Display()
DEAD_MAN_REASON = "the controller went away (interrupted or killed)"
# What the watch tells its switch when it ended as it should (success or failure, the run's own records written).
ENDED = "ended"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("run_dir", "nodes", "launchers", "world_size", "total_steps", "poll_interval",
                             "progress_interval", "heartbeat_timeout", "start_timeout", "stop_timeout",
                             "timeout", "stall_timeout", "stall_floor", "stall_ceiling", "startup_timeout",
                             "queue_timeout", "status_retry", "straggler",
                             "status_timeout", "addresses", "lock", "follow", "collect_dir", "bundle_bytes",
                             "grow"))

    _status_timeout = STATUS_TIMEOUT
    # The bundle of the latest status call (run_status's option bundle), kept out of the results.
    _bundle = None
    _bundle_skipped = None

    def _status(self, task_vars, **kw):
        """One run_status call on the coordinator, which must answer within status_timeout seconds (a hung mount
        there must not hang the watch: the call is left behind in its thread); raises StatusFailed."""
        args = dict(run_dir=self._task.args["run_dir"], touch_lease=True)
        args.update(kw)
        box = {}

        def call():
            try:
                # In a Python start of its own on the coordinator (no module wrapper), else as the module.
                res = node_python.call(self, task_vars, status.ARGUMENT_SPEC, status.__name__, "run_status", args=args)
                if res is None:
                    res = self._execute_module(module_name="multinode.deepspeed.run_status", module_args=args,
                                               task_vars=task_vars)
                box["res"] = res
            except Exception as exc:  # pylint: disable=broad-except
                box["exc"] = exc

        worker = threading.Thread(target=call, name="run_status", daemon=True)
        worker.start()
        worker.join(self._status_timeout)
        if worker.is_alive():
            raise StatusFailed("run_status gave no answer within %.0fs" % self._status_timeout)
        if "exc" in box:
            raise StatusFailed("%s: %s" % (type(box["exc"]).__name__, box["exc"]))
        res = box["res"]
        self._bundle, self._bundle_skipped = res.pop("bundle", None), res.pop("bundle_skipped", None)
        if res.get("unreachable"):
            raise StatusFailed("unreachable: %s" % res.get("msg"))
        if res.get("failed"):
            raise StatusFailed("reading the run's status failed: %s" % res.get("msg"))
        return res

    def _poll(self, task_vars, opts, loop, **kw):
        """A status call tried again with backoff for up to status_retry seconds (not past the run's timeout);
        None once the watch gives up (``loop.reason`` says why)."""
        deadline = loop.t0 + opts["timeout"] if opts["timeout"] else None
        while True:
            try:
                res = self._status(task_vars, **kw)
                loop.retry.ok()
                return res
            except StatusFailed as exc:
                wait = loop.retry.failed(time.time(), deadline)
                if wait is None:
                    loop.reason = give_up_reason(exc, time.time() - loop.retry.failed_since, loop.host,
                                                 timed_out=deadline is not None and time.time() + 1 > deadline)
                    return None
                display.warning("watch: reading the run's status on %s failed (%s); trying again in %.0fs"
                                % (loop.host, exc, wait))
                time.sleep(wait)

    def _dead_man_switch(self, run_dir):
        """An SSH session to the watched host whose remote end writes the run's ABORT record when its standard
        input closes, unless the run is already done or aborted.  This process holds that input: however it
        ends (Ctrl-C, Ansible killing its worker, a SIGKILL), the session ends and the run stops at once, not
        when the lease goes stale.  Only over the ssh connection; elsewhere the lease is the fallback."""
        conn = self._connection
        if getattr(conn, "transport", None) != "ssh":
            return None
        try:
            host = conn.get_option("host") or conn._play_context.remote_addr  # pylint: disable=protected-access
            command, password = self._switch_command(run_dir)
            argv = conn._build_command(conn.get_option("ssh_executable"), "ssh",  # pylint: disable=protected-access
                                       host, command)
            # A connection of its own, not a session on Ansible's shared ControlMaster: whatever becomes of that
            # master (its sessions, its persistence), this session lasts as long as this process (ssh keeps the
            # first value of an option, so these win over the ones Ansible built).
            argv = list(argv)
            at = 1 + next((n for n, a in enumerate(argv) if os.path.basename(to_text(a)) in (
                "ssh", os.path.basename(conn.get_option("ssh_executable") or "ssh"))), 0)  # after sshpass ... ssh
            # ServerAlive: ssh gives a silent server up only after the agents' lease would have (ansible.cfg's 3 x 15 s
            # would drop the session in a 45 s outage, and its remote end would take the close for this process's
            # end and abort a run the watch was still retrying).
            own = ["-o", "ControlMaster=no", "-o", "ControlPath=none"] + switch_keepalive(
                float(getattr(getattr(self, "_task", None), "args", {}).get("status_retry") or STATUS_RETRY))
            argv[at:at] = [o.encode() if isinstance(argv[0], bytes) else o for o in own]
            errors = tempfile.TemporaryFile()
            switch = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                      stderr=errors, start_new_session=True)
            switch.errors = errors
            if password:
                switch.stdin.write(password.encode() + b"\n")
                switch.stdin.flush()
            return switch
        except Exception as exc:  # pylint: disable=broad-except
            display.warning("watch: no dead man's switch (%s); the lease stops the run if the controller goes"
                            % exc)
            return None

    def _switch_command(self, run_dir):
        """The switch's remote command, through the task's become (the run's user owns control/: the login
        user may not write there), and the become password to send first, if any."""
        control = shlex.quote(run_dir.rstrip("/") + "/control")
        # The first line of input, if any, is the reason; end of input without one means this process is gone.
        # A dropped connection is end of input too, so no signal stops it half-way.  What fails is said on
        # standard error (the watch shows it as a warning).
        script = ("trap '' HUP PIPE INT TERM; "
                  "IFS= read -r why || why=''; [ \"$why\" = %s ] && exit 0; [ -n \"$why\" ] || why=%s; "
                  "cat >/dev/null; cd %s || exit 3; "
                  "[ -e DONE ] || [ -e ABORT ] || { set -C; "
                  "printf '{\"reason\": \"%%s\", \"host\": \"controller\", \"time\": %%s}\\n' "
                  "\"$why\" \"$(date +%%s)\" > ABORT; } 2>/dev/null || [ -e ABORT ] || "
                  "{ echo \"could not write $PWD/ABORT as $(id -un)\" >&2; exit 4; }"
                  % (ENDED, shlex.quote(DEAD_MAN_REASON), control))
        command = "sh -c %s" % shlex.quote(script)
        become = getattr(self._connection, "become", None)
        if become is None or not self._play_context.become:
            return command, None
        command = become.build_become_command(command, self._connection._shell)  # pylint: disable=protected-access
        password = become.get_option("become_pass", playcontext=self._play_context) if become.prompt else None
        return command, password

    @staticmethod
    def _release_switch(switch, wait=5.0, reason=None):
        """Close the switch's input, with ``reason`` as its one line: the remote end writes ABORT (with it) unless
        the run is done or aborted.  The ssh client is never killed: it may still be connecting (a loaded
        machine), and it ends by itself once it delivered the line (it runs in a session of its own, so this
        process may end first)."""
        if switch is None:
            return
        try:
            if reason:
                switch.stdin.write(reason.encode() + b"\n")
            switch.stdin.close()
            switch.wait(timeout=wait)
        except Exception:  # pylint: disable=broad-except
            pass
        return switch_warning(switch)

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = self._task.args
        opts = watch_options(args)
        self._status_timeout = opts["status_timeout"]
        # What the backend follows beside the heartbeats (a Kubernetes run's pods), from the controller.
        follow = args.get("follow") or None
        follower = backends.get(follow["backend"]).follower(follow) if follow else None
        loop = _Loop(time.time(), task_vars.get("inventory_hostname"), StatusRetry(opts["status_retry"]))
        # The run's pace (its step and save times), learned from every poll: the silence that makes it hung.
        loop.pace = Pace(opts["stall_floor"], opts["stall_ceiling"])
        # Each rank's compute pace against its peers': the node that lags is named, or moved off (on_straggler).
        straggler = args.get("straggler") or None
        loop.stragglers = Stragglers(straggler["threshold"], straggler["steps"]) if straggler else None
        # Ansible's worker dies at once on SIGINT/SIGTERM; catch them so that the run is stopped first.
        previous = trap_stop_signals()
        finished = False
        try:
            self._watch(task_vars, opts, follower, loop)
            finished = True
            collected = self._collect(loop)
        except BaseException as exc:  # Ctrl-C on the controller included: stop the run everywhere.
            ignore_signals(previous)
            self._stop_everywhere(task_vars, follower, loop, interruption_reason(exc))
            raise
        finally:
            # With the verdict in, nothing more to write: "ended" (the watch that gave up asks it to stop the run,
            # if it still can). Reached any other way (an exception that the handler above did not see through),
            # the switch writes ABORT on its own.
            self._warn(loop, self._release_switch(loop.switch or None, reason=(
                switch_line(loop.reason) if loop.gave_up else ENDED) if finished else None))
            if args.get("lock") and not loop.gave_up and not loop.released:
                try:
                    self._status(task_vars, release=args["lock"])
                except Exception:  # pylint: disable=broad-except
                    pass  # a lock whose run's lease went stale is taken over by the next run
            restore_signals(previous)
        result.update(collected)
        status = loop.status
        result.update(changed=True, status=loop.verdict, reason=loop.reason, nodes=status.get("nodes", {}),
                      lost=self._lost(task_vars, loop, opts["addresses"]), abort=status.get("abort"),
                      ranks=status.get("ranks", {}), done_ranks=status.get("done_ranks", []),
                      elapsed=time.time() - loop.t0, follow=follower.record() if follower is not None else None,
                      unreachable=loop.gave_up, cause=loop.cause or (loop.reason if loop.gave_up else None),
                      stragglers=loop.stragglers.record() if loop.stragglers is not None else None)
        if loop.warnings:
            result["warnings"] = list(result.get("warnings") or []) + loop.warnings
        return result

    @staticmethod
    def _warn(loop, message):
        if message:
            display.warning(message)
            loop.warnings.append(message)

    def _watch(self, task_vars, opts, follower, loop):
        """Poll the run until its verdict is in (SUCCESS or FAILED): act on each poll's verdict, show the progress,
        and fail a stop that takes longer than stop_timeout."""
        while True:
            # After the first call, each call waits on the node for up to a poll interval and answers as soon as
            # the run changes (a long poll): the run's end is seen at once, not at the next poll.
            waited = opts["poll_interval"] if loop.status else 0
            if loop.fresh is not None:  # the done call's answer: judged as it is, no call of its own
                status, loop.fresh, waited = loop.fresh, None, 1
            else:
                status = self._poll(task_vars, opts, loop, **(dict(wait=waited, seen=loop.status.get("moment"),
                                                                   **self._finish(opts, loop))
                                                              if waited else {}))
            if status is None:
                loop.verdict, loop.gave_up = FAILED, True
                display.display("[%s] %s" % (loop.host, loop.reason), color="red")
                break
            if status.get("finished_here"):  # the call wrote DONE and gave the lock back itself
                loop.released = True
            loop.status = status
            if loop.switch is None and not loop.status.get("abort"):
                loop.switch = self._dead_man_switch(self._task.args["run_dir"]) or False
            now = loop.status["now"]
            action = self._judge(task_vars, opts, follower, loop, now)
            if action and action[0] in ("abort", "done"):
                if action[0] == "abort":
                    display.display("[%s] stopping the run on every node: %s" % (loop.host, action[1]), color="red")
                # A run that ended well gives its checkpoint lock back in the same call that writes DONE, and
                # that call waits for the watchers' answers to it (their final beats), judged next without a call.
                if action[0] == "abort":
                    kw = dict(abort=action[1], lost=list(action[2]) if len(action) > 2 else [])
                else:
                    kw = dict(done=True, wait=opts["poll_interval"], **self._lock_release(loop))
                    kw.update(self._finish(opts, loop))
                if len(action) > 3:
                    kw["cause"] = action[3]
                status = self._poll(task_vars, opts, loop, **kw)
                if status is None:
                    loop.verdict, loop.gave_up = FAILED, True
                    break
                if action[0] == "abort":
                    loop.status = status
                else:
                    loop.fresh = status
            self._show_progress(loop, now, opts, follower)
            if loop.verdict in (SUCCESS, FAILED):
                break
            if loop.verdict == STOPPING:
                loop.stop_started = loop.stop_started or time.time()
                if time.time() - loop.stop_started > opts["stop_timeout"]:
                    loop.reason = stop_overdue(loop.reason, opts["stop_timeout"])
                    loop.verdict = FAILED
                    break
            if not waited:
                time.sleep(opts["poll_interval"])
            if os.getppid() != loop.ppid:
                # Ansible's main process is gone (killed): this worker runs in a session of its own and would
                # watch on, unseen; stop the run as Ctrl-C does.
                raise Interrupted("the controller's main process went away")

    def _finish(self, opts, loop):
        """A long poll's ``finish`` (and ``bundle``): run_status writes DONE by itself, and gives the run's checkpoint
        lock back (once), as soon as the run ended well, then waits for the watchers' final heartbeats; and it
        packs the run directory then, for the controller to unpack instead of a transfer of its own. None of it
        once the run is stopping."""
        if loop.status.get("abort") or loop.verdict in (STOPPING, FAILED):
            return {}
        lock = self._task.args.get("lock")
        spec = {"nodes": opts["nodes"], "launchers": opts["launchers"], "world_size": opts["world_size"],
                "release": lock if lock and not loop.released else None}
        out = {"finish": spec}
        size = int(self._task.args.get("bundle_bytes", BUNDLE_BYTES) or 0)
        if self._task.args.get("collect_dir") and size > 0:
            out["bundle"] = size
        return out

    def _lock_release(self, loop):
        """The done call's ``release`` argument: the run's checkpoint lock, given back once."""
        lock = self._task.args.get("lock")
        if not lock or loop.released:
            return {}
        loop.released = True
        return {"release": lock}

    def _collect(self, loop):
        """A run that ended well, unpacked from the last call's bundle into ``collect_dir``: ``collected`` says
        whether it was (else the play's collection copies it), ``collected_files`` how many files,
        ``collect_note`` why not."""
        dest = self._task.args.get("collect_dir")
        if not dest:
            return {"collected": False, "collected_files": 0, "collect_note": None}
        if loop.verdict != SUCCESS or not self._bundle:
            note = self._bundle_skipped if loop.verdict == SUCCESS else None
            return {"collected": False, "collected_files": 0, "collect_note": note}
        try:
            limit = int(self._task.args.get("bundle_bytes", BUNDLE_BYTES))
            files = unpack(self._bundle, os.path.expanduser(dest), limit)
        except Exception as exc:  # pylint: disable=broad-except  # a bundle that cannot be unpacked: rsync copies
            self._warn(loop, "watch: the run's files could not be unpacked into %s (%s); the play copies them"
                       % (dest, exc))
            return {"collected": False, "collected_files": 0, "collect_note": str(exc)}
        finally:
            self._bundle = None
        return {"collected": True, "collected_files": files, "collect_note": None}

    def _judge(self, task_vars, opts, follower, loop, now):
        """This poll's verdict and reason (into ``loop``) and its action: the agents' records first, then the
        backend's follower, the run's timeout and a stall."""
        queue = queue_state(loop.status)
        started_at = self._start_clock(loop, follower, now)
        verdict, reason, action = decide(loop.status, opts["nodes"], opts["launchers"], now,
                                         heartbeat_timeout=opts["heartbeat_timeout"],
                                         start_timeout=opts["start_timeout"], started_at=started_at,
                                         world_size=opts["world_size"], gone=self._gone(task_vars, opts, loop, now))
        # A full disk comes before what it causes (heartbeats that cannot be written, a rank that cannot log).
        loop.cause = loop.cause or disk_full(loop.status.get("disk"), loop.host)
        if loop.cause:
            if not loop.status.get("abort"):
                verdict, reason, action = abort_for_disk(loop.cause)
            elif verdict == FAILED:
                reason = loop.cause
        if follower is not None and verdict == RUNNING and not action:
            problems = follower.poll()
            if loop.pods_up is None and follower.running():
                loop.pods_up = time.time()
            if problems:
                verdict, reason, action = abort_for_pods(problems)
        if queue is not None and verdict == RUNNING and not action:
            verdict, reason, action = abort_for_queue(queue, now, opts["queue_timeout"]) or (verdict, reason, action)
        if opts["timeout"] and verdict == RUNNING and time.time() - loop.t0 > opts["timeout"]:
            verdict, reason, action = abort_for_timeout(opts["timeout"])
        stall = stalled(loop.status, now, started_at, opts["stall_timeout"], opts["startup_timeout"],
                        pace=loop.pace) if verdict == RUNNING and not action and queue is None else None
        if stall:
            # Whom to blame: a node the coordinator cannot reach any more comes first.
            probe = (self._poll(task_vars, opts, loop, probe=opts["addresses"]) or {}).get("reachable", {}) \
                if opts["addresses"] else {}
            verdict, reason, action = abort_for_stall(stall, probe)
        if loop.stragglers is not None:
            verdict, reason, action = self._stragglers(task_vars, opts, loop, verdict, reason, action)
        if self._task.args.get("grow") and verdict == RUNNING and not action:
            verdict, reason, action = self._grow(task_vars, opts, loop, verdict, reason, action)
        loop.verdict, loop.reason = verdict, reason
        return action

    def _stragglers(self, task_vars, opts, loop, verdict, reason, action):
        """Learn the ranks' compute pace from this poll; name each new straggler once (the progress line keeps
        naming it). With on_straggler=replace, ask the ranks for a checkpoint (control/SAVE), then stop the running
        run for the straggler once every rank saved it, or after stragglers.save_wait."""
        replace = (self._task.args.get("straggler") or {}).get("action") == "replace"
        for flag in loop.stragglers.see(loop.status.get("ranks")).newly_flagged():
            why = describe(flag)
            display.display("[%s] %s (named at step %s); %s" % (
                loop.host, why, flag["step"], "checkpointing, then moving the run off it (on_straggler=replace)"
                if replace else "the run goes on (on_straggler=warn)"), color="yellow")
            if replace and loop.replacing is None and verdict == RUNNING and not action:
                loop.replacing = {"why": why, "step": loop.stragglers.step + 1, "since": time.time()}
                self._poll(task_vars, opts, loop, save=why)
        if loop.replacing is not None and verdict == RUNNING and not action:
            step, waited, ready = self._checkpoint_asked(loop, loop.replacing)
            if ready:
                verdict, reason, action = abort_for_straggler(moved_reason(loop.replacing["why"], step is not None,
                                                                           step, waited))
        return verdict, reason, action

    @staticmethod
    def _checkpoint_asked(loop, ask):
        """For the checkpoint the watch asked for (``ask``: its first step and when): the step of the one that
        answered (None before it), the seconds waited, and whether the watch stops the run now (answered, or
        stragglers.save_wait passed)."""
        step = saved_at(loop.status, ask["step"])
        waited = time.time() - ask["since"]
        return step, waited, step is not None or waited > save_wait(loop.pace.longest_save)

    def _grow(self, task_vars, opts, loop, verdict, reason, action):
        """A shrunken attempt (module_utils/run/grow.py): every few seconds, do the nodes it lacks answer, or is a
        spare free? Then ask the ranks for a checkpoint (control/SAVE) and stop the attempt once every rank saved it
        (or after stragglers.save_wait), for the next one to grow back to the run's width."""
        spec = self._task.args["grow"]
        # Not before the attempt's first step: the checkpoint it would ask for needs a step to save.
        last = grow.last_step(loop.status.get("ranks"))
        if loop.growing is None and loop.replacing is None and last > 0 \
                and grow.due(loop.grow_looked, time.time(), spec.get("every") or grow.EVERY) \
                and grow.worth_it(last, opts["total_steps"], loop.pace.step_time()):
            loop.grow_looked = time.time()
            # A node that is up answers on the cluster network in milliseconds; one still down must not hold the
            # watch's poll for long every few seconds.
            kw = dict(probe=spec.get("addresses") or {}, probe_timeout=grow.PROBE_TIMEOUT)
            if spec.get("spares_file"):
                kw.update(spares_file=spec["spares_file"], run_id=spec.get("run_id"))
            looked = self._poll(task_vars, opts, loop, **kw) or {}
            held = looked.get("spares_held")
            names = grow.answered(spec, looked.get("reachable"),
                                  spec.get("spares") if held is None else held)
            if names:
                why = grow.asking(names)
                display.display("[%s] %s; checkpointing, then growing the run back to %d nodes" % (
                    loop.host, why, spec["width"]), color="green")
                loop.growing = {"names": names, "step": last + 1, "since": time.time()}
                self._poll(task_vars, opts, loop, save=why)
        if loop.growing:
            step, waited, ready = self._checkpoint_asked(loop, loop.growing)
            if step is not None and opts["total_steps"] and step >= opts["total_steps"]:
                loop.growing = False  # the final checkpoint: the run ends, it does not grow any more
            elif ready:
                verdict, reason, action = abort_to_grow(grow.reason(loop.growing["names"], spec["width"],
                                                                    step is not None, step, waited))
        return verdict, reason, action

    def _gone(self, task_vars, opts, loop, now):
        """During a stop, the nodes quiet for a few seconds that the coordinator cannot reach either: gone, not
        waited for until their heartbeats go stale."""
        quiet = quiet_nodes(loop.status, opts["nodes"], now, stale_after=opts["heartbeat_timeout"])
        probe = dict((h, opts["addresses"][h]) for h in quiet if h in opts["addresses"])
        if not probe:
            return []
        return unreachable((self._poll(task_vars, opts, loop, probe=probe) or {}).get("reachable"))

    @staticmethod
    def _start_clock(loop, follower, now):
        """When the ranks could start, on the node's clock: while the job waits in a queue, now (the wait counts
        toward neither the start nor the startup allowance); else its start from the queue record; else, with a
        follower, when the backend's pods all ran (an image pull may take minutes; a pod that cannot start is
        the follower's to name); else when the watch began."""
        if queue_state(loop.status) is not None:
            return now
        started = start_time(loop.status)
        if started is not None:
            return started
        begun = loop.t0 if follower is None else (loop.pods_up or time.time())
        return now - (time.time() - begun)

    @staticmethod
    def _show_progress(loop, now, opts, follower):
        """The progress line, every progress_interval while it changes, and once more with the verdict."""
        every = opts["progress_interval"]
        line = progress_line(loop.status, now, opts["total_steps"])
        named = loop.stragglers.line() if loop.stragglers is not None else None
        if named:
            line = "%s | %s" % (line, named)
        if follower is not None and loop.verdict in (RUNNING, STOPPING):
            line = "%s; %s" % (line, follower.progress())
        if time.time() - loop.last_print >= every or loop.verdict in (SUCCESS, FAILED):
            if line != loop.last_line or time.time() - loop.last_print >= every:
                display.display("[%s] %s" % (loop.host, line), color="cyan")
                loop.last_print, loop.last_line = time.time(), line

    def _stop_everywhere(self, task_vars, follower, loop, why):
        """The watch was interrupted or failed: the switch writes ABORT at once, the backend's objects go, and the
        ABORT record gets ``why``."""
        # The open session writes ABORT at once; the module call below gives it the real reason when it
        # gets there first (Ansible may end this process before it does).
        self._warn(loop, self._release_switch(loop.switch or None, wait=2.0, reason=switch_line(why)))
        loop.switch = None
        if follower is not None:
            # The play ends here (its last steps do not run on Ctrl-C, and Ansible's main process may be gone
            # before the module call below returns): the backend's objects go first, in a few API calls.
            try:
                deleted = follower.stop()
                display.display("[%s] deleted %s" % (loop.host, ", ".join(deleted) or "nothing (kept)"), color="red")
            except Exception as exc:  # pylint: disable=broad-except
                display.display("[%s] could not delete the run's objects: %s" % (loop.host, exc), color="red")
        try:
            self._status(task_vars, abort=why)
            display.display("[%s] stopped the run on every node: %s" % (loop.host, why), color="red")
        except Exception as exc:  # pylint: disable=broad-except
            # The agents also stop when the controller's lease expires.
            display.warning("watch: could not write the run's ABORT record on %s (%s); the run stops when its "
                            "lease expires" % (loop.host, exc))

    def _lost(self, task_vars, loop, addresses):
        """The nodes the run lost: its abort record's; after a failure, also those the coordinator cannot reach."""
        lost = list((loop.status.get("abort") or {}).get("lost") or [])
        if loop.verdict == FAILED and addresses and not loop.gave_up:
            # A rank that failed because its peer's node went away: the node the coordinator cannot reach is the
            # cause (the summary names it first).
            try:
                probe = self._status(task_vars, probe=addresses)["reachable"]
                lost = lost_nodes(loop.status.get("abort"), unreachable(probe))
            except RuntimeError:
                pass
        return lost


class StatusFailed(RuntimeError):
    """A status call that failed: the coordinator unreachable, the module's error, no answer in time."""


def switch_warning(switch):
    """What the dead man's switch said went wrong (its ssh or its remote end), or None."""
    if switch is None or switch.returncode in (0, None):
        return None
    try:
        switch.errors.seek(0)
        said = to_text(switch.errors.read()).strip().splitlines()
    except Exception:  # pylint: disable=broad-except
        said = []
    said = [line for line in said if "BECOME-SUCCESS" not in line and not line.startswith("Warning: Permanently")]
    return "watch: the dead man's switch failed (exit code %s): %s" % (
        switch.returncode, "; ".join(said[-3:]) or "no message")


class _Loop(object):
    """What the watch carries from one poll to the next, and to its result."""

    def __init__(self, t0, host, retry=None):
        self.t0 = t0
        self.host = host
        self.retry = retry or StatusRetry()
        self.gave_up = False
        self.warnings = []
        self.ppid = os.getppid()
        self.pods_up = None
        self.last_print = 0.0
        self.last_line = None
        self.stop_started = None
        self.reason = None
        self.cause = None
        self.verdict = RUNNING
        self.status = {}
        self.switch = None
        self.released = False
        self.fresh = None  # a status to judge before the next call (the done call's)
        self.pace = None
        self.stragglers = None
        self.replacing = None  # on_straggler=replace: the checkpoint asked for before the run moves off a straggler
        self.growing = None  # a grow-back: the checkpoint asked for before the run grows back to its width
        self.grow_looked = None  # when the watch last looked for the nodes a shrunken attempt lacks
