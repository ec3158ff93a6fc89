#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: watch
short_description: Watch a running job, print its progress, and stop it everywhere when anything fails
version_added: "0.1.0"
description:
  - An action plugin that runs on the controller against the host that can read the run directory
    (normally the coordinator). It polls M(multinode.deepspeed.run_status) every O(poll_interval) seconds,
    prints a progress line (step/total, loss, tokens/s, samples/s, ETA and every node's heartbeat) every
    O(progress_interval) seconds, and renews the controller's lease. C(train.yml) runs it right after starting the
    agents.
  - When a rank exits non-zero, a node's heartbeat stops for O(heartbeat_timeout) seconds, no rank makes
    progress for O(stall_timeout) seconds, the run outlives O(timeout), the run directory's disk is full (less
    than 1 MiB free), or the controller is interrupted (Ctrl-C), it writes the abort record that makes
    every node's agent kill the run's processes, and waits until every node reports it stopped.
  - The task never fails by itself; it returns C(status) (C(success) or C(failed)) and the reason, so that
    the play can collect the run's logs before it fails.
extends_documentation_fragment:
  - multinode.deepspeed.run_dir
  - multinode.deepspeed.progress
  - multinode.deepspeed.attributes
options:
  nodes:
    description: Every host that runs an agent for this run.
    type: list
    elements: str
    required: true
  launchers:
    description: The hosts whose agent runs a DeepSpeed launcher (the others only watch their node).
    type: list
    elements: str
    required: true
  world_size:
    description: Ranks expected to finish (C(train.yml) sets it for the bundled trainer only).
    type: int
  total_steps:
    description: Steps of the run, for the progress line.
    type: int
  heartbeat_timeout:
    description: A node whose agent has not written its heartbeat for this long counts as lost.
    type: float
    default: 20
  start_timeout:
    description: Seconds for every agent to start.
    type: float
    default: 120
  stop_timeout:
    description: Seconds for every node to stop after an abort.
    type: float
    default: 60
  timeout:
    description: Abort the run after this many seconds (0 means no limit).
    type: float
    default: 0
  stall_timeout:
    description:
      - Abort the run when no rank finished a step for this many seconds. Unset, it is ten times the step time the
        run has shown so far (the 90th percentile of the step times the watch has seen), within O(stall_floor) and
        O(stall_ceiling); a checkpoint save under way gets three times the longest save so far, at least
        O(startup_timeout). Without metrics (a user's script), the signal is the newest write to the ranks' logs
        (at least 45 s, or half of O(startup_timeout)).
      - The abort names the rank processes the nodes' agents see stopped (state T, e.g. SIGSTOP) or in an
        uninterruptible wait (state D), else the ranks that are behind.
    type: float
  stall_floor:
    description: The least seconds without a finished step that make the run hung, when O(stall_timeout) is unset.
    type: float
    default: 10
  stall_ceiling:
    description: The most seconds without a finished step before the run counts as hung, when O(stall_timeout) is
      unset.
    type: float
    default: 1800
  straggler:
    description:
      - When a node is a straggler (module_utils/run/stragglers.py), from the plan (C(straggler)) - C(threshold) (a
        score between 0 and 1), C(steps) (steps in a row below it) and C(action) (C(warn) or C(replace)). Each rank's
        score is the fastest rank's compute pace over its own (the C(compute) seconds of its step records, the
        bundled trainer's forward passes; the median of its last samples); a node's score is its slowest rank's.
      - A straggler is named in the progress line and in RV(stragglers); with C(action=replace) the watch also stops
        the run with a reason that starts C(<node> is a straggler), which the recovery judges as that node's fault.
      - Unset (a script that records no steps) - no scores.
    type: dict
  grow:
    description:
      - A shrunken attempt's grow-back, from its plan (C(grow)) - C(nodes) (the lost nodes it lacks), C(spares)
        (spares another run held when it was placed), C(addresses), C(width) (the run's full width), C(missing)
        (how many nodes it lacks), and with spares C(spares_file) and C(run_id).
      - From the attempt's first step, every 5 seconds the watch tries the candidates' SSH port from the coordinator,
        and reads the spares record.
        Once a node answers (a spare, once no other run holds it), the ranks are asked for a checkpoint
        (C(control/SAVE)); when every rank saved it (or after 60 s, or 3x the longest save), the run stops with a
        reason that starts C(grow back:), and the recovery places the next attempt back on the run's width
        (C(docs/recovery.md#grow-back)).
    type: dict
  startup_timeout:
    description:
      - Seconds allowed before the first step (model load, DeepSpeed's init, the first collective), counted from
        when the ranks can start - a scheduler's job from its start, not its submission (the time it waits in the
        queue counts toward neither this nor O(start_timeout)); a backend's pods from when they all run.
    type: float
    default: 300
  queue_timeout:
    description:
      - 'Seconds the run''s job may wait in a scheduler''s queue (the backend''s job agent reports it in
        C(control/queue.json); the progress line then reads "queued: PENDING (Resources) 2m10s"). Past it, the
        watch stops the run, naming the job, the scheduler''s reason and what to do about it.'
      - Unset or null, the wait is bounded only by O(timeout).
    type: float
  status_retry:
    description:
      - Seconds for which a failed status call (the coordinator unreachable, SSH exit code 255, the module's error,
        no answer within O(status_timeout)) is tried again, with a backoff of 1, 2, 4, 8, then 10 s, before the
        watch gives up. A call that succeeds starts the count over. Retries never go past O(timeout).
      - When the watch gives up it still returns a result (C(status) V(failed), RV(unreachable) true, a reason that
        names the coordinator), so that the play collects the logs and writes the summary; the run's lease (and
        the dead man's switch, if it still can) stops the run.
      - The agents' lease (their C(--lease-timeout), which the plan passes) is derived from the defaults of this
        option, O(status_timeout) and O(poll_interval) (C(module_utils/common/lease.lease_timeout)) - the longest the
        watch can go without renewing the lease while it retries, and a margin - so that a coordinator the watch
        still retries is never given up by its agents first. A longer O(status_retry) than the default outlives
        the lease.
    type: float
    default: 60
  status_timeout:
    description:
      - Seconds one status call may take (a hung mount on the coordinator must not stop the run's O(timeout) from
        firing); a call that takes longer counts as a failed one.
    type: float
    default: 30
  addresses:
    description:
      - Rank node -> its address. When the run stalls, the watched host tries each one's SSH port, and the nodes
        that do not answer are named first (a cut network or a lost node).
    type: dict
  lock:
    description: The run's checkpoint lock (M(multinode.deepspeed.run_prepare) took it), given back when the watch ends.
    type: path
  follow:
    description:
      - What the launch backend follows beside the agents' heartbeats, from its plan (C(launch.follow)), e.g. a
        Kubernetes run's pods. The watch reads it from the controller every poll; a pod that cannot be scheduled,
        cannot start, restarts, or whose node stops reporting stops the run at once, naming the pod and the node.
      - On Ctrl-C, the watch deletes what the backend created (unless the plan keeps it), since the play's last
        steps do not run then.
    type: dict
  collect_dir:
    description:
      - A directory on the controller. When the run ends well, the status call that sees its end also packs the
        run directory (what C(train.yml)'s rsync would copy - every directory and regular file except
        C(checkpoints/) and C(attempts/), with modes and times - up to O(bundle_bytes)), and the watch writes it
        here; RV(collected) says whether it did. A run directory with a symbolic link or another special file,
        more bytes than O(bundle_bytes), or a run that failed is not packed, and the play's collection copies it.
      - Names are checked before anything is written (relative, no C(..)); no directory on the way may be a
        symbolic link, and files are renamed into place (a link already there is replaced, never followed).
    type: path
  bundle_bytes:
    description: The most bytes of files that O(collect_dir) takes from the status call; V(0) never packs.
    type: int
    default: 16777216
notes:
  - 'The progress line reads C([<host>] step <n>/<total> | loss <loss> | <t> tok/s | <s> samples/s | eta <s>s |
    nodes: <host> <state> <age>s, ...), taken from the rank that is furthest behind, or C(starting | nodes: ...)
    before any rank has written a step.'
  - It also writes the abort record when an agent has not started within O(start_timeout), or when the launchers
    exited 0 but some of the O(world_size) ranks never finished. After an abort, from whoever wrote it, it waits until
    every node with a fresh heartbeat reports C(aborted) or C(finished), at most O(stop_timeout) seconds.
  - C(control/DONE) is written when every launcher has finished with exit code 0 (and all O(world_size) ranks
    finished) while watch-only agents still run, so that they stop too - by the status call that sees it (its
    long poll checks for it ten times a second), which then waits for the watchers' final heartbeats before it
    answers, so the verdict needs no call of its own.
  - On Ctrl-C it writes the abort record, then lets the interrupt end the play. Besides the module call, a
    session of its own to the watched host (the dead man's switch) writes it as soon as the watch's process goes;
    it runs through the task's become (the run's user owns C(control/), the login user may not write there), and
    when it cannot write the record the watch shows why as a warning (and in the result's C(warnings)).
author:
  - multinode.deepspeed developers (@multinode)
attributes:
  check_mode:
    support: none
    description: Not supported.
"""

EXAMPLES = r"""
- name: Watch the run until it ends
  multinode.deepspeed.watch:
    run_dir: /shared/runs/20261122-130000-llama-tiny
    nodes: [coord, worker1, worker2]
    launchers: [coord]
    world_size: 2
    total_steps: 30
  register: watched
"""

RETURN = r"""
status:
  description: C(success) or C(failed).
  returned: always
  type: str
reason:
  description: Why the run failed (null on success).
  returned: always
  type: str
follow:
  description: What the backend followed, as last seen (a Kubernetes run's pods, their nodes and states), or null.
  returned: always
  type: dict
lost:
  description: The rank nodes the run lost - the watch's abort named them, or, when the run failed, the coordinator
    could not reach them (O(addresses)).
  returned: always
  type: list
  elements: str
nodes:
  description: The last heartbeat of every node's agent.
  returned: always
  type: dict
abort:
  description: The abort record (which node asked, and why), or null.
  returned: always
  type: dict
ranks:
  description: The last metrics record of every rank.
  returned: always
  type: dict
done_ranks:
  description: Ranks that finished.
  returned: always
  type: list
  elements: int
cause:
  description:
    - What brought the run down when it was neither a rank nor a node - the run directory's disk full (less than 1
      MiB free on the coordinator's view of it; the watch then stops the run on every node at once) - as a sentence
      that starts with C(disk full on) and the coordinator's name, or null. The summary names it first.
    - When the watch gave up on the coordinator (RV(unreachable)), its reason, which the summary (written with what
      the play could collect) names first.
  returned: always
  type: str
unreachable:
  description: True when the watch gave up because the coordinator could not be reached or read for O(status_retry)
    seconds (C(reason) says so); the run may then still be going there until its lease stops it.
  returned: always
  type: bool
collected:
  description: Whether the run's files were written into O(collect_dir) from the status call (see there).
  returned: always
  type: bool
collected_files:
  description: How many files were written into O(collect_dir) (0 when RV(collected) is false).
  returned: always
  type: int
collect_note:
  description: Why a run that ended well was not written into O(collect_dir) (a symbolic link in it, too many
    bytes, a name refused), or null.
  returned: always
  type: str
stragglers:
  description: With O(straggler) - the settings, each node's last score, the stragglers named (node, step, score,
    since_step) and every node's score over the steps (a list of C({step, scores}) where they changed); else null.
  returned: always
  type: dict
elapsed:
  description: Seconds the watch lasted.
  returned: always
  type: float
"""
