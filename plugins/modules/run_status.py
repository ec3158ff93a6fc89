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
  - The watch runs its work (C(run/status) of the collection's module_utils) in a Python start of its own on the
    coordinator, as the module's user and on its interpreter, without Ansible's module wrapper (about 0.1 s less of
    the coordinator's CPU per call, every poll interval); in check mode or without pipelining it runs the module.
extends_documentation_fragment:
  - multinode.deepspeed.run_dir
  - multinode.deepspeed.attributes
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
  save:
    description:
      - When set, write C(control/SAVE) with this reason (unless one is there). The bundled trainer's ranks then
        save a checkpoint at their next step, once (rank 0 looks for it at most once a second), as the watch asks
        before it moves a run off a straggler or grows it back; rank 0 answers with C(control/SAVED) once every
        rank saved it (RV(saved)).
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
  probe_timeout:
    description: Seconds O(probe) waits for each node's answer (a grow-back's look, every few seconds while the node
      is still down, waits less).
    type: float
    default: 2.0
  spares_file:
    description:
      - The spares record on this node (M(multinode.deepspeed.run_recovery)'s); RV(spares_held) names the spares
        a run other than O(run_id) holds now (a shrunken run's watch grows back onto a spare only once it is free).
    type: path
  run_id:
    description: The run whose own holds O(spares_file) does not count.
    type: str
  done:
    description: Write C(control/DONE), telling the watching agents that the run ended well.
    type: bool
    default: false
  wait:
    description:
      - Seconds to wait, after the writes, for the run to change before answering (a long poll). The call answers
        as soon as an agent's state or exit code changes, an agent appears, or C(ABORT), C(DONE) or C(SAVED) appears, and
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
saved:
  description: The bundled trainer's answer to C(control/SAVE) - C(step) (the checkpoint's) and C(time) - or null
    before it answered.
  returned: always
  type: dict
spares_held:
  description: The spares of O(spares_file) another run holds now; null without O(spares_file), or when the record
    cannot be read (then no spare counts as free).
  returned: always
  type: list
  elements: str
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

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.status import ARGUMENT_SPEC, StatusError, status


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = status(module.params, module.check_mode)
    except StatusError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
