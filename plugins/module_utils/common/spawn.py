# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Start a run's agent detached from the module that starts it (modules agent_start and run_prepare).

The agent gets a session of its own, standard input from ``/dev/null``, its output appended to its log and none of
the module's other file descriptors (the Ansible connection stays the module's), then the module waits ``settle``
seconds for an early exit: an agent that cannot start says so while the play still holds the node.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import subprocess
import time


def _tail(path, lines=5):
    try:
        with open(path, "rb") as fh:
            text = fh.read()[-2000:].decode("utf-8", "replace")
    except (IOError, OSError):
        return ""
    return " | ".join(text.strip().splitlines()[-lines:])


def start_detached(argv, log, chdir=None, environment=None, settle=0.1):
    """Start ``argv`` detached; ``(pid, None)``, or ``(None, (message, rc))`` when it could not start or exited
    within ``settle`` seconds (the message ends with the last lines of ``log``)."""
    if not argv:
        return None, ("argv is empty", None)
    env = dict(os.environ)
    env.update(dict((str(k), str(v)) for k, v in (environment or {}).items()))
    try:
        log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as exc:
        return None, ("cannot open %s: %s" % (log, exc), None)
    pid = os.fork()
    if pid == 0:  # the agent: a session of its own, its output in the log, nothing of Ansible's connection open
        try:
            os.setsid()
            if chdir:
                os.chdir(chdir)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(log_fd, 1)
            os.dup2(log_fd, 2)
            os.closerange(3, 65536)
            os.execvpe(argv[0], argv, env)
        except OSError as exc:
            os.write(2, ("cannot start %s: %s\n" % (argv[0], exc)).encode("utf-8", "replace"))
        os._exit(127)
    os.close(log_fd)
    deadline = time.time() + settle
    while time.time() < deadline:
        done, code = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(code)
            return None, ("the agent exited at once with code %s: %s" % (status, _tail(log)), status)
        time.sleep(0.02)
    return pid, None


# Module agent_start's argument spec (its action plugin checks a task's arguments against the same one).
AGENT_START_SPEC = dict(argv=dict(type="list", elements="str", required=True),
                        chdir=dict(type="path"),
                        environment=dict(type="dict", default={}),
                        log=dict(type="path", required=True),
                        settle=dict(type="float", default=0.1))


def agent_start(p):
    """Module agent_start's result for its (checked) parameters: the agent started detached, or why not."""
    pid, problem = start_detached(p["argv"], p["log"], p["chdir"], p["environment"], p["settle"])
    if problem is not None:
        msg, rc = problem
        return dict({} if rc is None else {"rc": rc}, failed=True, msg=msg)
    return {"changed": True, "pid": pid}


def run(argv, env=None):
    """``(rc, stdout, stderr)`` of ``argv`` (no shell; ``env``: the whole environment, or this process's), as
    ``AnsibleModule.run_command`` gives them; rc 2 when it cannot start."""
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env)
    except OSError as exc:
        return 2, "", str(exc)
    out, err = proc.communicate()
    return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
