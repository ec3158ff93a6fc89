# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What module ``run_status`` does on the coordinator, as one function of its parameters: the controller's records
in the run's control directory, the lock it gives back, and what it reads of the agents' heartbeats and the ranks'
metrics (a long poll with O(wait)).

Pure Python, no Ansible import: the module runs it under ``AnsibleModule``, and the watch (action ``watch``) in a
Python start of its own on the coordinator (``plugin_utils/node_python``), without Ansible's module wrapper.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import glob
import json
import os
import re
import socket
import time

from ansible_collections.multinode.deepspeed.plugins.module_utils.common import records
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import lock
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.summary import read_jsonl
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.bundle import pack
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.watch import (
    ended_well, rank_progress, watchers_finished)


# The module's argument spec (the watch checks its calls' arguments against the same one).
ARGUMENT_SPEC = dict(
    run_dir=dict(type="path", required=True),
    touch_lease=dict(type="bool", default=False),
    abort=dict(type="str"),
    save=dict(type="str"),
    done=dict(type="bool", default=False),
    probe=dict(type="dict", default={}),
    release=dict(type="path"),
    lost=dict(type="list", elements="str", default=[]),
    probe_port=dict(type="int", default=22),
    probe_timeout=dict(type="float", default=2.0),
    cause=dict(type="str"),
    wait=dict(type="float", default=0),
    seen=dict(type="raw"),
    finish=dict(type="dict"),
    bundle=dict(type="int", default=0),
    spares_file=dict(type="path"),
    run_id=dict(type="str"),
)


class StatusError(Exception):
    """A call the module refuses (its message says why)."""


def status(p, check_mode=False):
    """The module's result for its (checked) parameters ``p``; raises StatusError for a bad O(finish)."""
    run_dir = p["run_dir"]
    control = os.path.join(run_dir, "control")
    changed = False
    if not check_mode:
        changed = _write_control(p, control)
    if p["release"] and not check_mode:
        changed = _release_lock(p["release"], run_dir) or changed
    nodes = _read_nodes(run_dir)
    finish = _finish_spec(p["finish"])
    finished_here = False
    if p["wait"] > 0 and not check_mode:
        nodes, finished_here = _wait_for_change(run_dir, control, nodes, p["wait"], p["seen"], finish=finish)
    ranks, done = _read_ranks(run_dir)
    reachable = dict((host, _reach(addr, p["probe_port"], p["probe_timeout"]))
                     for host, addr in sorted(p["probe"].items()))
    bundle, skipped = None, None
    if p["bundle"] > 0 and finish and not check_mode and _all_done(control, nodes, finish):
        bundle, skipped, _files = pack(run_dir, p["bundle"])
    return dict(changed=changed or finished_here, nodes=nodes, abort=_abort_record(control),
                ranks=ranks, done_ranks=sorted(done), now=time.time(), logs_mtime=_logs_mtime(run_dir),
                reachable=reachable, queue=_object(_load(os.path.join(control, "queue.json"))),
                disk=_disk(run_dir), moment=_moment(control, nodes), finished_here=finished_here,
                bundle=bundle, bundle_skipped=skipped, spares_held=_spares_held(p["spares_file"], p["run_id"]),
                saved=_object(_load(os.path.join(control, "SAVED"))))


def _spares_held(path, run_id):
    """The spares another run than ``run_id`` holds now in the spares record at ``path``; None without one, or when
    it cannot be read as one."""
    if not path:
        return None
    try:
        held = records.read(path, "spares")
    except records.RecordError:
        return None
    now = time.time()
    return sorted(n for n, r in held.items() if isinstance(r, dict) and r.get("run_id") != run_id
                  and _number(r.get("until")) > now)


def _number(value):
    try:
        return float(value or 0)
    except (TypeError, ValueError):
        return 0.0


def run_status(p):
    """The module's result on the node without Ansible's module wrapper (``plugin_utils/node_python``)."""
    try:
        return status(p)
    except StatusError as exc:
        return {"failed": True, "msg": str(exc)}


def _load(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _last_records(path, size=8192):
    """The last complete JSON records of a metrics file (a torn last line is skipped)."""
    with open(path, "rb") as fh:
        fh.seek(0, os.SEEK_END)
        end = fh.tell()
        fh.seek(max(0, end - size))
        chunk = fh.read().decode("utf-8", "replace")
    return read_jsonl("\n".join(chunk.splitlines()[-20:]))


def _finish_spec(finish):
    """O(finish), checked: lists of node names, a world size (or None), a lock path (or None)."""
    if not finish:
        return None
    nodes, launchers = finish.get("nodes"), finish.get("launchers")
    world = finish.get("world_size")
    if not isinstance(nodes, list) or not isinstance(launchers, list) or not launchers \
            or not set(launchers) <= set(nodes) or (world is not None and not str(world).isdigit()):
        raise StatusError("finish needs nodes (a list), launchers (a non-empty list of those nodes) and "
                          "world_size (a whole number or null), got %r" % (finish,))
    return {"nodes": [str(h) for h in nodes], "launchers": [str(h) for h in launchers],
            "world_size": int(world) if world is not None else None, "release": finish.get("release") or None}


def _all_done(control, nodes, finish):
    """DONE is there and every agent of the run wrote its final heartbeat."""
    return os.path.exists(os.path.join(control, "DONE")) and watchers_finished(nodes, finish["nodes"], [])


def _finish_if_ended(run_dir, control, nodes, finish):
    """Write DONE (and give the lock back) when the run ended well as the watch judges it; whether it did."""
    if os.path.exists(os.path.join(control, "ABORT")) or os.path.exists(os.path.join(control, "DONE")):
        return False
    # The launchers first: the ranks' records are read only once they all ended well.
    if not ended_well(nodes, finish["nodes"], finish["launchers"], [], None):
        return False
    if finish["world_size"] is not None and not ended_well(nodes, finish["nodes"], finish["launchers"],
                                                           _read_ranks(run_dir)[1], finish["world_size"]):
        return False
    _put(os.path.join(control, "DONE"), "%f\n" % time.time())
    if finish["release"]:
        _release_lock(finish["release"], run_dir)
    return True


def _wait_for_change(run_dir, control, nodes, wait, seen=None, period=0.1, finish=None):
    """``(nodes, finished_here)``: the agents' heartbeats once the run changed (see O(wait)) from ``seen`` or from
    now, or after ``wait`` seconds. With ``finish``: a run that ended well is marked DONE here (``finished_here``),
    and once DONE is there the call waits for every agent's final heartbeat instead of the next change."""
    finished_here = bool(finish) and _finish_if_ended(run_dir, control, nodes, finish)
    now = _moment(control, nodes)
    first = seen if seen is not None else now
    deadline = time.time() + wait
    while True:
        if finish and os.path.exists(os.path.join(control, "DONE")):
            if _all_done(control, nodes, finish):
                break
        elif _moment(control, nodes) != first:
            break
        if time.time() >= deadline:
            break
        time.sleep(min(period, max(0.0, deadline - time.time())))
        nodes = _read_nodes(run_dir)
        if finish and not finished_here and _finish_if_ended(run_dir, control, nodes, finish):
            finished_here = True
            deadline = max(deadline, time.time() + wait)  # the watchers' final beats follow DONE at once
    return nodes, finished_here


def _moment(control, nodes):
    """What the watch decides on, without the heartbeats' times: each agent's state and exit code, and which of
    the run's records exist (the trainer's answer to a checkpoint asked for, SAVED, too: the watch stops a run it
    moves as soon as the checkpoint is there)."""
    return [sorted([host, beat.get("state"), beat.get("exit_code")] for host, beat in nodes.items())] + [
        os.path.exists(os.path.join(control, name)) for name in ("ABORT", "DONE", "SAVED")]


def _object(value):
    """A record read from a file: a JSON object, else None (a torn or odd file is no record)."""
    return value if isinstance(value, dict) else None


def _logs_mtime(run_dir):
    """The newest write to the run's logs, or None (a log removed while it is read is skipped)."""
    times = []
    for path in glob.glob(os.path.join(run_dir, "logs", "*.log")):
        try:
            times.append(os.path.getmtime(path))
        except OSError:
            pass
    return max(times or [0]) or None


def _write_control(p, control):
    """The controller's records in the run's control directory: its lease, the ABORT record (unless there is one)
    and DONE; returns whether it wrote ABORT or DONE.  A full or failing disk does not fail the call: the lease is
    renewed by its time stamp alone, and a record whose content cannot be written still exists (empty), which is
    what the agents look for."""
    changed = False
    if not os.path.isdir(control):
        os.makedirs(control)
    if p["touch_lease"]:
        lease = os.path.join(control, "lease")
        if os.path.exists(lease):
            os.utime(lease, None)
        else:
            _put(lease, "%f\n" % time.time())
    if p["abort"]:
        # Created exclusively: an ABORT an agent wrote first (it names the real cause) is never overwritten.
        changed = _put(os.path.join(control, "ABORT"), json.dumps({
            "reason": p["abort"], "host": "controller", "time": time.time(), "lost": p["lost"], "cause": p["cause"]}),
            exclusive=True)
    if p["save"]:
        # A checkpoint asked of the ranks (the bundled trainer saves at its next step, once), e.g. before the run
        # moves off a straggler.
        changed = _put(os.path.join(control, "SAVE"), json.dumps({"reason": p["save"], "time": time.time()}),
                       exclusive=True) or changed
    if p["done"] and not os.path.exists(os.path.join(control, "DONE")):
        _put(os.path.join(control, "DONE"), "%f\n" % time.time())
        changed = True
    return changed


def _put(path, text, exclusive=False):
    """Write ``path``; when the disk takes the name but not the content (full), the empty file stays. With
    ``exclusive``, only when nothing is there (O_EXCL: not even a link); returns whether it was written."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC), 0o644)
    except FileExistsError:
        if exclusive:
            return False
        raise
    try:
        os.write(fd, text.encode())
    except OSError:
        pass
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    return True


def _abort_record(control):
    """The abort record; one that exists but cannot be read (written on a full disk, torn) still aborts the run."""
    path = os.path.join(control, "ABORT")
    record = _load(path)
    if isinstance(record, dict):
        return record
    if os.path.exists(path):
        return {"reason": "an abort record that cannot be read (%s is empty or torn: is the disk full?)" % path}
    return None


def _disk(run_dir):
    """Free and total bytes of the run directory's file system (for the account that runs this), or None."""
    try:
        st = os.statvfs(run_dir)
    except OSError:
        return None
    return {"path": run_dir, "free": st.f_bavail * st.f_frsize, "total": st.f_blocks * st.f_frsize}


def _release_lock(path, run_dir):
    """The run's checkpoint lock, given back when it holds this run's id; returns whether it was."""
    return lock.release(path, os.path.basename(run_dir.rstrip("/")), run_dir)


def _read_nodes(run_dir):
    """The agents' last heartbeats, by host."""
    nodes = {}
    for path in glob.glob(os.path.join(run_dir, "nodes", "*.json")):
        beat = _object(_load(path))
        if beat:
            host = beat.get("host")
            nodes[host if isinstance(host, str) and host else os.path.basename(path)[:-5]] = beat
    return nodes


def _read_ranks(run_dir):
    """Each rank's last record (``{"rank": record}``) and the ranks that wrote their done record."""
    ranks = {}
    done = []
    for path in glob.glob(os.path.join(run_dir, "metrics", "rank*.jsonl")):
        found = re.search(r"rank(\d+)\.jsonl$", path)
        if not found:
            continue  # an odd name (rank-old.jsonl, rankx.jsonl): not a rank's metrics
        try:
            records = [r for r in _last_records(path) if isinstance(r, dict)]
        except OSError:
            continue
        rank = int(found.group(1))
        last, finished = rank_progress(records)
        if last is not None:
            ranks[str(rank)] = last
        if finished:
            done.append(rank)
    return ranks, done


def _reach(addr, port, timeout=2.0):
    """Does ``addr:port`` accept a TCP connection from here within ``timeout``?"""
    try:
        sock = socket.create_connection((str(addr), port), timeout=timeout)
        sock.close()
        return {"ok": True, "error": None}
    except (OSError, ValueError) as exc:
        return {"ok": False, "error": str(exc) or type(exc).__name__}
