#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: run_status
short_description: Read (and steer) a running job through its shared run directory
version_added: "0.1.0"
description:
  - Reads the heartbeats that the per-node agents write to C(nodes/<host>.json), the abort record
    C(control/ABORT), and the last metrics record of every rank from a run directory on shared storage (only the
    end of each C(metrics/rank*.jsonl) is read; a torn last line is skipped).
  - Touches the controller's lease C(control/lease), so that the agents stop the run when the controller
    stops watching; can ask every node to stop (O(abort)) or mark the run done (O(done)).
  - The M(multinode.deepspeed.watch) action calls it in a loop on the coordinator; it is a module of its own so that
    a person can look at a run by hand too (C(docs/agents.md), "Looking at a run by hand").
extends_documentation_fragment:
  - multinode.deepspeed.run_dir
options:
  touch_lease:
    description: Renew the controller's lease.
    type: bool
    default: false
  abort:
    description:
      - When set, write C(control/ABORT) with this reason and C(host) V(controller) (unless an abort is already
        recorded); every node's agent then stops the run's processes.
    type: str
  probe:
    description:
      - Nodes to try from here, name -> address; each answers in RV(reachable) whether its O(probe_port) accepts a
        TCP connection within 2 seconds (the watch asks when a run stalls, to name a node cut off the network).
    type: dict
    default: {}
  lost:
    description: With O(abort), the nodes the run lost (no heartbeat, or unreachable); the summary names them first.
    type: list
    elements: str
    default: []
  release:
    description: A checkpoint lock to give back (removed when it names this run).
    type: path
  probe_port:
    description: The port O(probe) tries (sshd's).
    type: int
    default: 22
  done:
    description: Write C(control/DONE), telling the watching agents that the run ended well.
    type: bool
    default: false
  wait:
    description:
      - Seconds to wait, after the writes, for the run to change before answering (a long poll). The call answers
        as soon as an agent's state or exit code changes, an agent appears, or C(ABORT) or C(DONE) appears, and
        after O(wait) seconds at the latest. V(0) answers at once.
      - The M(multinode.deepspeed.watch) action waits its poll interval in each call, so that the end of a run is
        seen within a fraction of a second instead of at its next poll.
    type: float
    default: 0
  seen:
    description:
      - With O(wait), the RV(moment) the caller saw last. The call answers at once when the run is already past
        it (a change between two calls is not waited through).
    type: raw
  cause:
    description:
      - With O(abort), what brought the run down when it is not a rank or a node (a full disk); the abort record
        keeps it as C(cause) and the summary names it first.
    type: str
  finish:
    description:
      - With O(wait), what the watch expects of a run that ends well - C(nodes) (every agent), C(launchers) (the
        agents that run a launcher), C(world_size) (ranks that must write their done record, or null) and
        C(release) (the run's checkpoint lock, or null). When, during the wait, every launcher finished with
        exit code 0 and every rank wrote its done record (what the watch would judge a run that ended well), the
        call writes C(control/DONE) and gives the lock back itself, instead of answering and waiting for the
        watch's next call to do it.
      - Once C(control/DONE) is there (written by this call or an earlier one), the call waits, up to O(wait)
        seconds more, for every other agent's final heartbeat before it answers.
    type: dict
  bundle:
    description:
      - With O(finish), the most bytes of files to return as RV(bundle) once the run is done and every agent of
        C(finish.nodes) wrote its final heartbeat; V(0) returns none. The watch unpacks it on the controller, so a
        run that ended well needs no transfer of its own.
    type: int
    default: 0
notes:
  - Creates C(control/) when it is missing. Reports C(changed) only when it wrote C(control/ABORT) or
    C(control/DONE), or gave back O(release); renewing the lease is not a change.
  - A full disk does not fail the call - the lease is renewed by its time stamp, and C(ABORT) or C(DONE) stays
    even when only its name could be written (an empty C(ABORT) is read as an abort).
author:
  - multinode.deepspeed developers (@multinode)
attributes:
  check_mode:
    support: full
    description: Reads only; writes nothing in check mode.
  diff_mode:
    support: none
    description: Shows no diff.
"""

EXAMPLES = r"""
- name: Look at a run
  multinode.deepspeed.run_status:
    run_dir: /shared/runs/20261122-130000-llama-tiny
  register: status

- name: Stop a run on every node
  multinode.deepspeed.run_status:
    run_dir: /shared/runs/20261122-130000-llama-tiny
    abort: stopped by hand
"""

RETURN = r"""
nodes:
  description: Heartbeat of every node's agent, by host (its fields are in C(docs/agents.md), C(nodes/<host>.json)).
  returned: always
  type: dict
abort:
  description: The abort record, or null.
  returned: always
  type: dict
ranks:
  description:
    - The last metrics record of every rank, by rank (as a string) - its last C(step) record, or its last record of
      any kind when it has no step yet.
  returned: always
  type: dict
logs_mtime:
  description: The newest write to the run's logs (C(logs/*.log)), as a Unix time, or null.
  returned: always
  type: float
reachable:
  description: Per node of O(probe), C(ok) and C(error).
  returned: always
  type: dict
done_ranks:
  description: Ranks that wrote their final record (C(done)), sorted.
  returned: always
  type: list
  elements: int
queue:
  description:
    - The backend's record of the run's job in a scheduler's queue (C(control/queue.json), written by the backend's
      job agent), or null when the backend has no queue. C(state) is V(queued) while the job waits (with C(label),
      C(reason), C(job_id), C(since) and C(fix)) and V(started) once it runs (C(started), the node's time).
  returned: always
  type: dict
disk:
  description:
    - The run directory's file system as the calling account sees it - C(path), C(free) (bytes it may still
      write) and C(total) - or null when it cannot be read. The watch stops a run whose disk is full.
  returned: always
  type: dict
now:
  description: The node's clock when it read the files; the watch compares the heartbeats' times with it.
  returned: always
  type: float
finished_here:
  description: Whether this call wrote C(control/DONE) by itself (O(finish)).
  returned: always
  type: bool
bundle:
  description:
    - The run directory as the collection copies it (every directory and regular file but C(checkpoints/) and
      C(attempts/), with modes and times), compressed JSON in base64, when O(bundle) asked for it and the run is
      done; null otherwise (RV(bundle_skipped) says why when it could not be made).
  returned: always
  type: str
bundle_skipped:
  description: Why O(bundle) was asked for and none came back (a symbolic link, too many bytes), or null.
  returned: always
  type: str
moment:
  description:
    - What a long poll (O(wait)) compares - each agent's host, state and exit code, and whether C(ABORT) and
      C(DONE) exist - for the next call's O(seen).
  returned: always
  type: list
  elements: raw
"""

import glob
import json
import os
import socket
import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.run import lock
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.summary import read_jsonl
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.bundle import pack
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.watch import (
    ended_well, rank_progress, watchers_finished)


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


def main():
    module = AnsibleModule(
        argument_spec=dict(
            run_dir=dict(type="path", required=True),
            touch_lease=dict(type="bool", default=False),
            abort=dict(type="str"),
            done=dict(type="bool", default=False),
            probe=dict(type="dict", default={}),
            release=dict(type="path"),
            lost=dict(type="list", elements="str", default=[]),
            probe_port=dict(type="int", default=22),
            cause=dict(type="str"),
            wait=dict(type="float", default=0),
            seen=dict(type="raw"),
            finish=dict(type="dict"),
            bundle=dict(type="int", default=0),
        ),
        supports_check_mode=True,
    )
    p = module.params
    run_dir = p["run_dir"]
    control = os.path.join(run_dir, "control")
    changed = False
    if not module.check_mode:
        changed = _write_control(p, control)
    if p["release"] and not module.check_mode:
        changed = _release_lock(p["release"], run_dir) or changed
    nodes = _read_nodes(run_dir)
    finish = _finish_spec(module, p["finish"])
    finished_here = False
    if p["wait"] > 0 and not module.check_mode:
        nodes, finished_here = _wait_for_change(run_dir, control, nodes, p["wait"], p["seen"], finish=finish)
    ranks, done = _read_ranks(run_dir)
    reachable = dict((host, _reach(addr, p["probe_port"])) for host, addr in sorted(p["probe"].items()))
    bundle, skipped = None, None
    if p["bundle"] > 0 and finish and not module.check_mode and _all_done(control, nodes, finish):
        bundle, skipped, _files = pack(run_dir, p["bundle"])
    module.exit_json(changed=changed or finished_here, nodes=nodes, abort=_abort_record(control),
                     ranks=ranks, done_ranks=sorted(done), now=time.time(), logs_mtime=_logs_mtime(run_dir),
                     reachable=reachable, queue=_object(_load(os.path.join(control, "queue.json"))),
                     disk=_disk(run_dir), moment=_moment(control, nodes), finished_here=finished_here,
                     bundle=bundle, bundle_skipped=skipped)


def _finish_spec(module, finish):
    """O(finish), checked: lists of node names, a world size (or None), a lock path (or None)."""
    if not finish:
        return None
    nodes, launchers = finish.get("nodes"), finish.get("launchers")
    world = finish.get("world_size")
    if not isinstance(nodes, list) or not isinstance(launchers, list) or not launchers \
            or not set(launchers) <= set(nodes) or (world is not None and not str(world).isdigit()):
        module.fail_json(msg="finish needs nodes (a list), launchers (a non-empty list of those nodes) and "
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
    the run's records exist."""
    return [sorted([host, beat.get("state"), beat.get("exit_code")] for host, beat in nodes.items()),
            os.path.exists(os.path.join(control, "ABORT")), os.path.exists(os.path.join(control, "DONE"))]


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
    abort_path = os.path.join(control, "ABORT")
    if p["abort"] and not os.path.exists(abort_path):
        _put(abort_path, json.dumps({"reason": p["abort"], "host": "controller", "time": time.time(),
                                     "lost": p["lost"], "cause": p["cause"]}))
        changed = True
    if p["done"] and not os.path.exists(os.path.join(control, "DONE")):
        _put(os.path.join(control, "DONE"), "%f\n" % time.time())
        changed = True
    return changed


def _put(path, text):
    """Write ``path``; when the disk takes the name but not the content (full), the empty file stays."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, text.encode())
    except OSError:
        pass
    finally:
        try:
            os.close(fd)
        except OSError:
            pass


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


if __name__ == "__main__":
    main()
