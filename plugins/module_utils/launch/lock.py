# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""One run at a time on a checkpoint directory: ``<checkpoint_dir>.lock``, and the run directory's claim.

The lock names the run that holds it (run id, run directory, time, whether the run was handed to the user).  It is
written whole - a temporary file, then a rename - so a reader never sees it empty; a lock that cannot be read is
taken as held (being written, or damaged) until it is older than ``LEASE_ALIVE``.  Taking, taking over and giving
back happen under an exclusive ``flock`` of ``<lock>.guard``, so of two runs that find the same stale lock exactly
one takes it.  A run holds the lock from when it took it until it writes its lease, then while its
controller renews the lease (``control/lease``) and it is neither done nor aborted; a run handed to the user (no
controller) while it is neither done nor aborted and its files move (heartbeats, metrics, logs): once the user
started it, not while it waits to be started.

A run with restarts holds it from its first attempt to its last.  Each attempt (``runs/<id>/attempts/<n>``) takes
it for its own directory; when the attempt ends, its watch gives it back only as far as that attempt goes: the lock
is marked ``between`` attempts and the run keeps it while it waits for its nodes (its ``recover_wait``, plus
``BETWEEN_MARGIN`` for the placement and the next plan), until its next attempt takes it again.  The run gives it
back whole after its last attempt (``release`` with the run id: ``train.yml``'s after_attempts); an attempt that
ended well, or whose end no attempt can follow (Ctrl-C, the run's timeout, a full disk, a controller gone), frees it
at once, and a controller that died between two attempts holds it no longer than that wait.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import contextlib
import errno
import fcntl
import glob
import json
import os
import re
import time

from ansible_collections.multinode.deepspeed.plugins.module_utils.common.lease import lease_timeout

# A run whose controller's lease is younger than this still runs: the age at which its agents give it up (the
# watch's retry window and a margin), so that a run whose controller is retrying an unreachable coordinator keeps
# its checkpoint directory.
LEASE_ALIVE = lease_timeout()
# Seconds a run with restarts keeps the lock between two attempts beyond its recover_wait (the judge, the backend's
# recover step, the node reads, the placement, the next plan and the spares' preflight), and the recover_wait
# assumed when the lock does not say (job_plan's default).
BETWEEN_MARGIN = 180.0
RECOVER_WAIT = 120.0
# The abort reasons after which no attempt follows (module_utils/run/recovery.py's never-retried endings, and a
# controller that went away or stopped watching): the run is over, and so is its hold.
RUN_OVER = re.compile(r"^interrupted|Ctrl-C|KeyboardInterrupt|exceeded its timeout|^disk full|waited in the queue|"
                      r"^the controller")


def make_dirs(path):
    """``path`` and its parents, when missing; another play making them at the same time is no error."""
    if not path:
        return
    try:
        os.makedirs(path)
    except OSError as exc:
        if exc.errno != errno.EEXIST:
            raise


@contextlib.contextmanager
def guarded(path, suffix=".guard"):
    """An exclusive ``flock`` of ``<path><suffix>`` for the block (NFSv4 and local filesystems honour it)."""
    fd = os.open(path + suffix, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def write_whole(path, text, mode=0o644):
    """``text`` into ``path`` through a temporary file of this process and a rename (readers see all or nothing)."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.rename(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read(path):
    """``(state, record, age)``: ``("free", None, None)`` without a lock, ``("unreadable", None, age)`` for one that
    is empty or not a JSON object, else ``("held", record, age)``."""
    try:
        with open(path) as fh:
            text = fh.read()
        age = time.time() - os.stat(path).st_mtime
    except (IOError, OSError) as exc:
        if exc.errno == errno.ENOENT:
            return "free", None, None
        return "unreadable", None, 0.0
    try:
        record = json.loads(text)
    except ValueError:
        record = None
    if not isinstance(record, dict) or not record.get("run_id"):
        return "unreadable", None, age
    return "held", record, age


def _age(path, now):
    try:
        return now - os.stat(path).st_mtime
    except OSError:
        return None


def attempt_of(run_dir):
    """The run directory whose attempt ``run_dir`` is (``<run>/attempts/<n>``), or None (a run without restarts)."""
    path = os.path.normpath(str(run_dir or ""))
    parent = os.path.dirname(path)
    return os.path.dirname(parent) if os.path.basename(parent) == "attempts" and os.path.basename(path) else None


def _abort_reason(control):
    """The reason of the attempt's ABORT record ("" when it has none or cannot be read)."""
    try:
        with open(os.path.join(control, "ABORT")) as fh:
            record = json.load(fh)
    except (IOError, OSError, ValueError):
        return ""
    return str(record.get("reason") or "") if isinstance(record, dict) else ""


def between_alive(record, now):
    """Whether a run with restarts whose attempt (the lock's ``run_dir``) ended still holds the lock: for its
    ``hold`` seconds after the attempt ended (``between``, else its ABORT record's time), unless the abort is one
    no attempt follows (RUN_OVER)."""
    control = os.path.join(record.get("run_dir") or "", "control")
    abort = os.path.join(control, "ABORT")
    if os.path.exists(abort) and RUN_OVER.search(_abort_reason(control)):
        return False
    since = record.get("between") or _age_mtime(abort)
    hold = float(record.get("hold") or RECOVER_WAIT + BETWEEN_MARGIN)
    return since is not None and now - float(since) <= hold


def _age_mtime(path):
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def run_alive(record, now, lease_alive=LEASE_ALIVE):
    """Whether the run a lock names still runs: not done or aborted, and its controller's lease fresh (or just taken)
    - or, handed to the user, its heartbeats, metrics or logs written in the last ``lease_alive`` seconds and its
    ranks not all done.  An attempt of a run with restarts that ended: ``between_alive``."""
    run_dir = record.get("run_dir") or ""
    control = os.path.join(run_dir, "control")
    if os.path.exists(os.path.join(control, "DONE")):
        return False
    if attempt_of(run_dir) and (record.get("between") or os.path.exists(os.path.join(control, "ABORT"))):
        return between_alive(record, now)
    if os.path.exists(os.path.join(control, "ABORT")):
        return False
    if not record.get("handoff"):
        lease = _age(os.path.join(control, "lease"), now)
        if lease is None:
            return now - float(record.get("time") or 0) <= lease_alive  # just taken: the run writes its lease next
        return lease <= lease_alive
    # Handed to the user: alive while its files move (agents' heartbeats; a run without agents, such as a batch
    # script submitted by hand, by its ranks' metrics and logs) and its ranks have not all written their last
    # record.  Not started yet, it does not hold the directory.
    if ranks_done(run_dir):
        return False
    files = [os.path.join(run_dir, "nodes", "*.json"), os.path.join(run_dir, "metrics", "*.jsonl"),
             os.path.join(run_dir, "logs", "*.log")]
    ages = [a for a in (_age(p, now) for pattern in files for p in glob.glob(pattern)) if a is not None]
    return bool(ages) and min(ages) <= lease_alive


def ranks_done(run_dir):
    """Whether the run's ranks all wrote their final record (the bundled trainer's ``done``): there are metrics,
    and every ``metrics/rank*.jsonl`` ends with it."""
    paths = glob.glob(os.path.join(run_dir, "metrics", "rank*.jsonl"))
    for path in paths:
        try:
            with open(path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 4096))
                lines = [x for x in fh.read().decode("utf-8", "replace").splitlines() if x.strip()]
            last = json.loads(lines[-1]) if lines else None
        except (IOError, OSError, ValueError):
            return False
        if not isinstance(last, dict) or last.get("event") != "done":
            return False
    return bool(paths)


def holder(path, run_id, now=None, lease_alive=LEASE_ALIVE):
    """The live run, other than ``run_id``, that holds the lock at ``path`` (a dict with ``run_id`` and
    ``lease_age``), or None."""
    now = time.time() if now is None else now
    state, record, age = read(path)
    if state == "free":
        return None
    if state == "unreadable":
        return {"run_id": "(an unreadable lock, %.0fs old)" % age, "lease_age": age} if age <= lease_alive else None
    if record["run_id"] == run_id or not run_alive(record, now, lease_alive):
        return None
    out = dict(record)
    out["lease_age"] = _age(os.path.join(record.get("run_dir") or "", "control", "lease"), now) or 0.0
    if record.get("between"):
        # Between two attempts: the controller's last word is the end of the attempt.
        out["lease_age"] = max(0.0, now - float(record["between"]))
    return out


def take(path, run_id, run_dir, handoff=False, recover_wait=None):
    """Take the lock for ``run_id`` (replacing a stale one, or the one an earlier attempt of the same run left
    ``between`` attempts); returns the live holder that keeps it, or None.  ``recover_wait``: an attempt of a run
    with restarts keeps it that long (plus BETWEEN_MARGIN) after it ended."""
    make_dirs(os.path.dirname(path))
    with guarded(path):
        live = holder(path, run_id)
        if live is not None:
            return live
        record = {"run_id": run_id, "run_dir": run_dir, "time": time.time(), "handoff": bool(handoff)}
        if attempt_of(run_dir):
            record["hold"] = float(RECOVER_WAIT if recover_wait is None else recover_wait) + BETWEEN_MARGIN
        write_whole(path, json.dumps(record) + "\n")
    return None


def release(path, run_id, run_dir=None):
    """Give the lock back.  ``run_dir`` the directory of the attempt that holds it (``runs/<id>/attempts/<n>``, its
    watch at its end): the run keeps it between attempts (``between``, the time).  Else ``run_id`` the run that
    holds it (after its last attempt), or ``run_dir`` its directory (a run without restarts): removed.  Returns
    whether it did either."""
    if not os.path.exists(path):
        return False
    with guarded(path):
        state, record, _age_ = read(path)
        if state != "held":
            return False
        same_dir = run_dir is not None and os.path.normpath(str(record.get("run_dir") or "")) == os.path.normpath(
            run_dir)
        if same_dir and attempt_of(run_dir):
            if not record.get("between"):
                write_whole(path, json.dumps(dict(record, between=time.time())) + "\n")
            return True
        if record.get("run_id") != run_id and not same_dir:
            return False
        os.unlink(path)
    return True


def claim(run_dir, token, run_id, where):
    """Make the run directory this play's: ``control/claim`` created exclusively with the play's ``token`` (the
    directory one earlier failed preflight left is reused).  Returns None, or the message why another play has it."""
    control = os.path.join(run_dir, "control")
    make_dirs(control)
    path = os.path.join(control, "claim")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as exc:
        if exc.errno != errno.EEXIST:
            raise
        try:
            with open(path) as fh:
                if fh.read().strip() == token:
                    return None
        except (IOError, OSError):
            pass
        return ("run_id=%s is being started by another play (it claimed %s on %s first). Fix: pick another "
                "-e run_id, or leave it out for a new one." % (run_id, run_dir, where))
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return None


def unclaim(run_dir, token):
    """Give the run directory back (``control/claim``) when this play's ``token`` holds it; returns whether it did."""
    path = os.path.join(run_dir, "control", "claim")
    try:
        with open(path) as fh:
            if fh.read().strip() != token:
                return False
        os.unlink(path)
    except (IOError, OSError):
        return False
    return True
