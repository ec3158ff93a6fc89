#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: run_recovery
short_description: Decide whether a failed attempt of a run is retried, where the next one runs, and sum up them all
version_added: "0.6.0"
description:
  - O(step=judge), O(step=verify) and O(step=finish) run on the controller (C(delegate_to) C(localhost)) over a run
    collected there with C(restarts) above 0, whose attempts each have their own directory C(attempts/<n>/) with the
    summary M(multinode.deepspeed.run_summary) wrote. O(step=quarantine), O(step=place), O(step=release) and
    O(step=unquarantine) run on the coordinator, as the run's account, where the quarantine and spares records are
    (O(quarantine_file), O(spares_file)) - every controller that drives the cluster sees the same ones.
  - O(step=judge) reads why the last attempt ended (a node lost or cut off, a rank killed by a signal or exiting
    with an error, a stall, a launcher that died; or a timeout, Ctrl-C, a full disk, a job that waited in the queue
    too long) and decides whether another attempt starts - not after a failure before the first step of the first
    attempt, not after the same failure (rank, step and last error line) twice in a row, not past O(restarts). A
    node that failed twice in the run is to be quarantined (C(quarantined)). The decision is written to
    C(attempts/<n>/recovery.json).
  - O(step=quarantine) writes the judge's O(quarantine) to O(quarantine_file) (a node already there keeps its
    record) and finds the spares free to the next attempt - neither quarantined, nor ranks of the attempt, nor held
    by another run in O(spares_file) - and how long the play waits for the failed nodes (O(check_nodes)).
  - O(step=place) chooses the next attempt's nodes - a failed node that came back (O(checks)) keeps its place, else
    the first free spare that passes its check (O(spare_checks)) and no other run holds takes it, held for this run
    in O(spares_file), else the run goes on with fewer nodes down to O(min_nodes) - and fails, naming the
    fix, when too few are left. After an attempt the watch stopped to grow back (O(kind=grow)), the nodes that
    answered and pass their check (O(checks) - they answer with the run's stack) join the attempt's nodes, in the
    order of O(full_nodes), up to its width; a spare among them is held for this run. For a next attempt on fewer
    nodes than O(full_nodes), it returns what that attempt's watch looks out for (C(grow)) - the nodes it lacks
    (where the backend takes a lost node back, O(reuse_lost)) and the spares another run holds - when a restart
    would be left to grow with.
  - O(step=verify) is the preflight of the nodes that take a failed node's place (O(replaced)) for the attempt
    planned as O(job) - their names, clock and disks (O(probes)) and the SSH logins the backend needs to them
    (O(reference)), and with C(-e preflight=force) the all-reduce test across the attempt's nodes (O(bandwidth));
    it writes C(attempts/<n>/replacement-preflight.json) and fails, naming each
    failed check and its fix, before the attempt starts.
  - O(step=finish) writes the run's C(summary.json) over every attempt (each one's nodes, start and end, why it ended
    and whether it was retried, the step it resumed from, the steps it recomputed, the seconds from the fault to its
    first step) with the C(goodput) - the share of the wall time spent on steps that counted - and C(report.md) with
    C(plots/timeline.png).
  - O(step=release) gives back the spares the run holds in O(spares_file) (C(train.yml) runs it after the last
    attempt, whatever ended the run).
  - O(step=unquarantine) lets the nodes of O(nodes) out of O(quarantine_file) and out of any run's hold in
    O(spares_file) (C(-e unquarantine=), after the plan checked the names).
  - O(quarantine_file) and O(spares_file) are changed only under an exclusive lock of C(<file>.lock), and written
    whole (a temporary file, flushed, then renamed), so two plays - or two controllers - never lose each other's
    changes. They are read without following a link and only when they are regular files of at most 1 MiB. A file
    that cannot be read (a link, empty, not JSON, not the expected object) fails the step, naming the file and the
    fix; it is never taken as empty.
  - The decisions are C(plugins/module_utils/run/recovery.py)'s.
options:
  run_dir:
    description: The run's directory on the controller (C(runs/<run_id>)), with C(attempts/<n>/summary.json). Required
      by O(step=judge), O(step=verify) and O(step=finish).
    type: path
  run_id:
    description: The run's id.
    type: str
    required: true
  step:
    description: What to do (see the description).
    type: str
    choices: [finish, judge, place, quarantine, release, unquarantine, verify]
    required: true
  attempt:
    description: The number of the attempt that just ended (from 1). Required by O(step=judge), O(step=place),
      O(step=verify) and O(step=finish).
    type: int
  restarts:
    description: The attempts after the first the run may make.
    type: int
    default: 0
  nodes:
    description: The rank nodes of the attempt that ended, in order (O(step=place), O(step=quarantine)); with
      O(step=unquarantine), the nodes let out.
    type: list
    elements: str
    default: []
  failed_nodes:
    description: The nodes that failed in it (O(step=place); O(step=judge) returns them).
    type: list
    elements: str
    default: []
  check_nodes:
    description: The failed nodes the play waits for (O(step=judge) returns them) - O(step=quarantine) returns how
      long.
    type: list
    elements: str
    default: []
  spares:
    description: The inventory's spare nodes (group C(spares)), in order.
    type: list
    elements: str
    default: []
  min_nodes:
    description: The fewest rank nodes the run may go on with; unset - as many as it started with.
    type: int
  recover_wait:
    description: Seconds a failed node gets to come back when no spare can take its place (O(step=quarantine)
      returns the wait).
    type: int
    default: 120
  checks:
    description: The play's reads (M(multinode.deepspeed.node_facts), in a loop over the failed nodes that answered)
      - a node is back when it answered and its stack fingerprint is the one in O(fingerprints) (O(step=place)).
    type: list
    elements: dict
    default: []
  fingerprints:
    description: Node -> its stack fingerprint before the failure.
    type: dict
    default: {}
  quarantine:
    description: Node -> why, the nodes to quarantine (O(step=quarantine); O(step=judge) returns them as
      C(quarantined)).
    type: dict
    default: {}
  kind:
    description: How the attempt that ended ended (O(step=judge) returns it) - O(step=quarantine) waits only a
      moment for the nodes of a grow-back, and O(step=place) adds them (V(grow)).
    type: str
  full_nodes:
    description: The run's rank nodes at its start, in order - its full width, which a shrunken attempt grows back
      to (O(step=place)).
    type: list
    elements: str
    default: []
  why:
    description: Why the attempt ended and why it is retried (O(step=judge)'s C(why)) - said in the line of
      O(step=place).
    type: str
  shared_dir:
    description: The cluster's shared directory on the coordinator (C(shared_dir_path)); the records are in its
      C(runs/.records/) unless O(quarantine_file) and O(spares_file) say otherwise.
    type: path
    default: /srv/multinode-deepspeed
  quarantine_file:
    description: The file of quarantined nodes on the coordinator (JSON) - a node stays there until
      C(-e unquarantine=) lets it out (O(step=unquarantine)). Unset - C(<shared_dir>/runs/.records/quarantine.json).
    type: path
  spares_file:
    description: The file of the spares that runs hold, on the coordinator (JSON, written under an exclusive lock) -
      a spare one run took is not free to another until that run ends (O(step=release) gives its spares back) or
      its O(timeout) passes (a day without one); C(-e unquarantine=<spare>) lets one out. Unset -
      C(<shared_dir>/runs/.records/spares.json).
    type: path
  spare_checks:
    description: The play's reads of the free spares (M(multinode.deepspeed.node_facts) in a loop, as O(checks)) -
      the replacement's preflight; a spare takes a place only when it answered and its stack fingerprint is the
      run's (O(step=place)). Unset - every free spare in O(spares) is taken as ready.
    type: list
    elements: dict
  replaced:
    description: Failed node -> the node that takes its place (O(step=verify); O(step=place) returns it).
    type: dict
    default: {}
  job:
    description: The next attempt's plan (M(multinode.deepspeed.job_plan)'s C(job)) (O(step=verify)).
    type: dict
    default: {}
  probes:
    description: M(multinode.deepspeed.node_probe)'s results on the nodes of O(replaced), in a loop (O(step=verify)).
    type: list
    elements: dict
    default: []
  reference:
    description: Node of the run that stays (the coordinator) -> its M(multinode.deepspeed.node_probe)'s result - the
      clock the new nodes must agree with, and its C(ssh) to them when the backend logs in from there
      (O(step=verify)).
    type: dict
    default: {}
  settings:
    description: The preflight's limits as role C(preflight) hands them (its C(preflight_settings)) -
      C(max_clock_skew), C(min_free_gib_shared), C(min_free_gib_local) (unset - that role's defaults), and
      C(link_gbps) and C(bandwidth_fraction) for O(bandwidth) (O(step=verify)).
    type: dict
    default: {}
  bandwidth:
    description: With C(-e preflight=force) - C(async_status)'s results, in a loop over the attempt's rank nodes, of
      the all-reduce test across them (preflight's test with the attempt's layout), judged as preflight judges it
      (O(step=verify)); unset - no bandwidth test.
    type: list
    elements: dict
  reuse_lost:
    description: Whether a node lost, cut off or stalled may take ranks again once it answers (the backend's
      C(launch.reuse_lost)); false - the backend's scheduler keeps it out (Slurm drains it) and O(step=judge)
      returns it in C(drain_nodes), not C(check_nodes).
    type: bool
    default: true
  started:
    description: When the first attempt started (seconds since the epoch). O(step=judge) - the run's O(timeout) runs
      from it; O(step=finish) - the wall time runs from it when the attempts' records do not say.
    type: float
  timeout:
    description: The run's timeout in seconds, which covers every attempt (O(step=judge) returns what is left; none
      is retried when less than 10 s is).
    type: int
author:
  - multinode.deepspeed developers (@multinode)
extends_documentation_fragment:
  - multinode.deepspeed.attributes
attributes:
  check_mode:
    support: full
    description: Decides; writes neither the decision nor the quarantine or spares file nor the summary.
"""

EXAMPLES = r"""
- name: Is the failed attempt retried? (on the controller)
  multinode.deepspeed.run_recovery:
    run_dir: "{{ runs_dir }}/{{ run_id }}"
    run_id: "{{ run_id }}"
    step: judge
    attempt: 1
    restarts: 2
  delegate_to: localhost
  register: recovery

- name: Quarantine the nodes that failed twice, find the free spares (on the coordinator, as the run's account)
  multinode.deepspeed.run_recovery:
    run_id: "{{ run_id }}"
    step: quarantine
    quarantine: "{{ recovery.quarantined }}"
    nodes: [worker1, worker2]
    check_nodes: "{{ recovery.check_nodes }}"
    spares: [worker3]
  register: free

- name: Where does the next attempt run? (on the coordinator)
  multinode.deepspeed.run_recovery:
    run_id: "{{ run_id }}"
    step: place
    attempt: 1
    why: "{{ recovery.why }}"
    nodes: [worker1, worker2]
    failed_nodes: [worker2]
    checks: "{{ node_reads.results }}"
    fingerprints: {worker2: 3f2a9c0d1e4b5a67}
    spares: [worker3]

- name: Let worker2 out of quarantine (on the coordinator)
  multinode.deepspeed.run_recovery:
    run_id: "{{ run_id }}"
    step: unquarantine
    nodes: [worker2]
"""

RETURN = r"""
retry:
  description: Whether another attempt starts (O(step=judge)).
  returned: step is judge
  type: bool
why:
  description: Why the attempt ended, and why it is (or is not) retried.
  returned: step is judge
  type: str
  sample: "worker2 lost (node worker2 stopped answering (no heartbeat for 21s)); lost: retried (attempt 2 of at most 3)"
failed_nodes:
  description: The nodes that failed in the attempt.
  returned: step is judge
  type: list
  elements: str
check_nodes:
  description: The failed nodes the play waits for and checks before they take ranks again.
  returned: step is judge
  type: list
  elements: str
drain_nodes:
  description: The failed nodes the backend's scheduler is told to keep out (O(reuse_lost) false).
  returned: step is judge
  type: list
  elements: str
scheduler_nodes:
  description: The scheduler's own nodes behind a lost attempt (Kubernetes Nodes that stopped reporting) - the next
    attempt's pods are kept off them.
  returned: step is judge
  type: list
  elements: str
spares_held:
  description: The spares another run holds now (not free to this one).
  returned: step is quarantine
  type: list
  elements: str
spares_free:
  description: The spares neither quarantined, nor ranks of the attempt, nor held by another run.
  returned: step is quarantine
  type: list
  elements: str
timeout_left:
  description: Seconds of the run's O(timeout) left for the next attempt (null without O(timeout)).
  returned: step is judge
  type: int
wait:
  description: Seconds the play waits for the failed nodes to answer - a quick look when free spares can take their
    places, else O(recover_wait).
  returned: step is quarantine
  type: int
quarantined:
  description: The nodes that failed twice in the run and that no earlier decision of the run quarantined, with why
    (O(step=judge)); the nodes O(step=quarantine) was given.
  returned: step is judge or quarantine
  type: dict
nodes:
  description: The next attempt's rank nodes (O(step=place)).
  returned: step is place
  type: list
  elements: str
replaced:
  description: Failed node -> the spare that takes its place.
  returned: step is place
  type: dict
verify:
  description: The nodes new to the next attempt, whose preflight runs before it starts - failed node -> the spare
    that takes its place, and each node a grow-back adds -> itself.
  returned: step is place
  type: dict
grown:
  description: The nodes a grow-back adds to the attempt's (O(kind=grow)).
  returned: step is place
  type: list
  elements: str
grow:
  description: What the next attempt's watch looks out for to grow back - C(nodes) (lost nodes that may take ranks
    again), C(spares) (spares another run holds now) and C(width) (the run's full width); null when the next
    attempt is at full width, or no restart would be left.
  returned: step is place
  type: dict
notes:
  description: Why a failed node or a spare was not used (O(step=place)).
  returned: step is place
  type: list
  elements: str
line:
  description: The line the play shows as the next attempt starts (O(step=place)), or the replacements' preflight
    in one line (O(step=verify)).
  returned: step is place or verify
  type: str
  sample: "attempt 2/3 on worker1, worker3 (worker2 lost (node worker2 stopped answering (no heartbeat for 21s)))"
verdicts:
  description: The preflight verdicts of the nodes that take a place (O(step=verify)).
  returned: step is verify
  type: list
  elements: dict
summary:
  description: The run's summary over its attempts (O(step=finish)), as written to C(summary.json).
  returned: step is finish
  type: dict
message:
  description: How the run went, over its attempts.
  returned: step is finish
  type: str
released:
  description: The spares the run held that O(step=release) gave back, or the spares O(step=unquarantine) let out
    of another run's hold.
  returned: step is release or unquarantine
  type: list
  elements: str
unquarantined:
  description: The nodes of O(nodes) that O(step=unquarantine) let out of quarantine.
  returned: step is unquarantine
  type: list
  elements: str
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.common import files, records
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.replacement import (
    bandwidth_check, replacement_verdicts)
from ansible_collections.multinode.deepspeed.plugins.module_utils.run import grow, recovery
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.report import attempts_markdown, plot_timeline
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.summary import read_jsonl


def _run_json(p, path, default=None):
    """A record in the run's directory, read without following a link (common/files.py); ``default`` when it is
    missing or is not a regular file."""
    value = files.read_json(path, p["run_dir"])
    return default if value is None else value


def _attempt_dir(p, n):
    return os.path.join(p["run_dir"], "attempts", str(n))


def _endings(p):
    """Every attempt's ending up to this one, from its summary.json."""
    out = []
    for n in range(1, p["attempt"] + 1):
        end = recovery.ending(_run_json(p, os.path.join(_attempt_dir(p, n), "summary.json"), {}))
        end["attempt"] = n
        out.append(end)
    return out


def _quarantined_before(p):
    """The nodes the earlier decisions of this run quarantined (their ``recovery.json``)."""
    out = set()
    for n in range(1, p["attempt"]):
        out.update((_run_json(p, os.path.join(_attempt_dir(p, n), "recovery.json"), {}) or {}).get("quarantined") or {})
    return out


def judge(module, p):
    endings = _endings(p)
    retry, why = recovery.judge(endings, p["restarts"])
    last = endings[-1]
    left = recovery.timeout_left(p["timeout"], p["started"], time.time()) if p["timeout"] and p["started"] else None
    if retry and p["timeout"] and p["started"] and left is None:
        retry, why = False, "the run's timeout of %ds covers every attempt and is spent; not retried" % p["timeout"]
    before = _quarantined_before(p)
    add = dict((n, r) for n, r in recovery.to_quarantine(endings).items() if n not in before)
    decision = {"retry": retry, "why": "%s; %s" % (last["why"], why) if last["why"] else why,
                "kind": last["kind"], "failed_nodes": last["nodes"], "quarantined": add, "timeout_left": left,
                "check_nodes": recovery.nodes_to_check(last, p["reuse_lost"]),
                "drain_nodes": recovery.nodes_to_drain(last, p["reuse_lost"]),
                "scheduler_nodes": last.get("scheduler_nodes") or []}
    if not module.check_mode:
        files.write_json(os.path.join(_attempt_dir(p, p["attempt"]), "recovery.json"), decision, p["run_dir"])
    module.exit_json(changed=not module.check_mode, **decision)


def quarantine(module, p):
    """On the coordinator: the judge's O(quarantine) written to the quarantine file, and the spares free to the next
    attempt."""
    add = p["quarantine"] or {}

    def change(nodes):
        # Under the file's lock: a node another run quarantined (or let out) meanwhile is kept as it is now.
        new = recovery.quarantine(nodes, dict((n, r) for n, r in add.items() if n not in nodes), p["run_id"])
        return new, new

    if add and not module.check_mode:
        held = recovery.update_quarantine(p["quarantine_file"], change)
    else:
        held = recovery.load_quarantine(p["quarantine_file"])
    out = _spares_free(p, set(held) | set(add))
    module.exit_json(changed=bool(add) and not module.check_mode, quarantined=add, **out)


def _spares_free(p, quarantined):
    """The spares free to this run (neither quarantined, nor its ranks, nor held by another run), those another run
    holds, and the play's wait for the failed nodes (O(check_nodes))."""
    held = recovery.spares_held(_held_spares(p), p["run_id"], time.time())
    free = [s for s in p["spares"] if s not in quarantined and s not in p["nodes"] and s not in held]
    return {"spares_free": free, "spares_held": [s for s in p["spares"] if s in held],
            "wait": recovery.wait_seconds(p["check_nodes"], free, p["recover_wait"], p["kind"])}


def _held_spares(p):
    return recovery.load_spares(p["spares_file"])


def place(module, p):
    quarantine = recovery.load_quarantine(p["quarantine_file"])
    fingerprint = recovery.run_fingerprint(p["nodes"], p["failed_nodes"], p["fingerprints"])
    back, notes = recovery.came_back(p["checks"], p["fingerprints"], fingerprint)
    ready = p["spares"]
    if p["spare_checks"] is not None:
        ready, spare_notes = recovery.spares_ready(p["spare_checks"], fingerprint)
        notes += spare_notes
    now = time.time()
    growing = p["kind"] == recovery.GROW

    def take(held):
        """The placement, with the spares it takes held for this run (never two runs on one spare)."""
        others = recovery.spares_held(held, p["run_id"], now)
        if growing:
            out = grow_nodes(p, back, others)
        else:
            out = recovery.next_nodes(p["nodes"], p["failed_nodes"], back, [s for s in ready if s not in others],
                                      quarantine, p["min_nodes"])
            out["grown"] = []
        out["held_elsewhere"] = [s for s in ready if s in others]
        if "error" in out:
            return held, out
        # What the next attempt's watch looks out for, when it runs on fewer nodes than the run began with (a node
        # whose grow-back check failed just now is not looked for again).
        out["grow"] = grow.candidates(p["full_nodes"] or p["nodes"], out["nodes"], set(quarantine) | set(
            p["failed_nodes"] if growing else ()), p["reuse_lost"], p["spares"], others, p["attempt"], p["restarts"])
        taken = list(out["replaced"].values()) + [n for n in out["grown"] if n in p["spares"]]
        return recovery.hold_spares(held, taken, p["run_id"], now, p["timeout"]), out

    out = take(_held_spares(p))[1] if module.check_mode else recovery.update_spares(p["spares_file"], take)
    holds = _held_spares(p)
    notes += [recovery.held_note(s, holds.get(s) or {}) for s in out.pop("held_elsewhere")]
    out["notes"] = notes
    # The nodes new to the attempt, for their preflight: each spare (by the node it replaces) and each node grown back.
    out["verify"] = dict(out.get("replaced") or {}, **dict((n, n) for n in out.get("grown") or []))
    if "error" in out:
        module.fail_json(msg="The run cannot go on: %s%s." % (out["error"], "".join("; " + n for n in notes)), **out)
    line = recovery.progress_line(p["attempt"] + 1, p["restarts"], out["nodes"], {"why": p["why"] or "failed"})
    module.exit_json(changed=bool(out["replaced"] or out["grown"]) and not module.check_mode, line=line, **out)


def grow_nodes(p, back, others):
    """A grow-back's placement: the attempt's nodes with those of O(failed_nodes) (the ones the watch saw answer)
    that passed their check and no other run holds, up to the run's width."""
    ready = [n for n in back if n not in others]
    nodes = grow.grown(p["nodes"], ready, p["full_nodes"] or p["nodes"], len(p["full_nodes"] or p["nodes"]))
    return {"nodes": nodes, "replaced": {}, "dropped": [], "grown": [n for n in nodes if n not in p["nodes"]]}


def verify(module, p):
    nodes = list((p["replaced"] or {}).values())
    probes = dict((r.get("item"), r) for r in p["probes"])
    reference = p["reference"] or {}
    ssh = dict((host, (r or {}).get("ssh") or {}) for host, r in reference.items())
    verdicts = replacement_verdicts(p["job"], nodes, probes, ssh, p["settings"], reference)
    if p["bandwidth"] is not None:
        # async_status in a loop over the started tests: each result's item is the start's, whose item is the node.
        results = dict((r["item"]["item"], r) for r in p["bandwidth"])
        settings = p["settings"] or {}
        verdicts.append(bandwidth_check(p["job"], results, settings.get("link_gbps") or None,
                                        settings.get("bandwidth_fraction") or None))
    failed = [v for v in verdicts if v["status"] == "fail"]
    directory = _attempt_dir(p, p["attempt"])
    if not module.check_mode:
        files.write_json(os.path.join(directory, "replacement-preflight.json"), {"nodes": nodes, "verdicts": verdicts},
                         p["run_dir"])
    if failed:
        module.fail_json(msg="The node(s) taking a place failed their preflight, so attempt %d does not start: %s" % (
            p["attempt"], "; ".join("%s %s: %s%s" % (v["check"], v["host"], v["detail"], ". Fix: %s" % v["fix"]
                                                     if v.get("fix") else "") for v in failed)), verdicts=verdicts)
    module.exit_json(changed=not module.check_mode, verdicts=verdicts, line="preflight of %s: %d checks passed" % (
        ", ".join(nodes), len(verdicts)))


def finish(module, p):
    records, retries = [], []
    for n in range(1, p["attempt"] + 1):
        directory = _attempt_dir(p, n)
        summary = _run_json(p, os.path.join(directory, "summary.json"), {}) or {}
        rank0 = files.read_text(os.path.join(directory, "metrics", "rank0.jsonl"), p["run_dir"]) or ""
        records.append(recovery.attempt_record(n, summary, read_jsonl(rank0), summary.get("started")))
        decision = _run_json(p, os.path.join(directory, "recovery.json"), {}) or {}
        if not decision and n == p["attempt"]:
            # The last attempt, never judged (no restart was left to loop over): why it is the last.
            end = _endings(p)
            retried, why = recovery.judge(end, p["restarts"])
            decision = {"retry": False, "why": why if end[-1]["kind"] == recovery.SUCCESS else
                        "%s; %s" % (end[-1]["why"], why) if end[-1]["why"] else why}
        retries.append((bool(decision.get("retry")), decision.get("why") or records[-1]["why"]))
    last = _run_json(p, os.path.join(_attempt_dir(p, p["attempt"]), "summary.json"), {}) or {}
    summary = dict(last, run_id=p["run_id"])
    # From the first attempt's start to the last one's end (now, when the records do not say).
    first = records[0].get("started") or p["started"]
    wall_time = (records[-1].get("ended") or time.time()) - first if first else None
    summary.update(recovery.run_summary(records, retries, wall_time), wall_time=wall_time)
    timeline = os.path.join(p["run_dir"], "plots", "timeline.png")
    message = "%s after %d attempt(s): %s" % (summary["status"], p["attempt"], "; ".join(
        "attempt %d: %s" % (a["attempt"], a["retry_reason"]) for a in summary["attempts"]))
    summary["message"] = message
    if not module.check_mode:
        plot_timeline(records, [r["losses"] for r in records], timeline, p["run_dir"])
        files.write_json(os.path.join(p["run_dir"], "summary.json"), summary, p["run_dir"])
        files.write_text(os.path.join(p["run_dir"], "report.md"), attempts_markdown(summary, "plots/timeline.png"),
                         p["run_dir"])
    module.exit_json(changed=not module.check_mode, summary=summary, message=message)


def release(module, p):
    """The spares the run held, given back (after its last attempt, whatever ended it)."""
    def mine(held):
        return sorted(n for n, r in held.items() if r.get("run_id") == p["run_id"])

    gone = mine(_held_spares(p))
    if gone and not module.check_mode:
        gone = recovery.update_spares(p["spares_file"], lambda held: (recovery.release_spares(held, p["run_id"]),
                                                                      mine(held)))
    module.exit_json(changed=bool(gone), released=gone)


def unquarantine(module, p):
    """``-e unquarantine=``: O(nodes) let out of the quarantine file and out of any run's spare hold."""
    names = set(p["nodes"])
    if module.check_mode:
        out = {"quarantine": sorted(n for n in recovery.load_quarantine(p["quarantine_file"]) if n in names),
               "spares": sorted(n for n in _held_spares(p) if n in names)}
    else:
        out = recovery.let_out(p["quarantine_file"], p["spares_file"], names)
    module.exit_json(changed=bool(out["quarantine"] or out["spares"]) and not module.check_mode,
                     released=out["spares"], unquarantined=out["quarantine"])


STEPS = {"judge": judge, "quarantine": quarantine, "place": place, "verify": verify, "finish": finish,
         "release": release, "unquarantine": unquarantine}
# The steps that read or write the run's directory on the controller (the others run on the coordinator, where the
# records are).
ON_CONTROLLER = ("judge", "verify", "finish")


def main():
    module = AnsibleModule(
        argument_spec=dict(
            run_dir=dict(type="path"), run_id=dict(type="str", required=True),
            step=dict(type="str", required=True, choices=sorted(STEPS)),
            attempt=dict(type="int"), restarts=dict(type="int", default=0),
            nodes=dict(type="list", elements="str", default=[]),
            failed_nodes=dict(type="list", elements="str", default=[]),
            check_nodes=dict(type="list", elements="str", default=[]),
            spares=dict(type="list", elements="str", default=[]), min_nodes=dict(type="int"),
            started=dict(type="float"), recover_wait=dict(type="int", default=120), timeout=dict(type="int"),
            checks=dict(type="list", elements="dict", default=[]), fingerprints=dict(type="dict", default={}),
            quarantine=dict(type="dict", default={}), why=dict(type="str"),
            shared_dir=dict(type="path", default=records.SHARED_DIR),
            quarantine_file=dict(type="path"), spares_file=dict(type="path"),
            spare_checks=dict(type="list", elements="dict"), reuse_lost=dict(type="bool", default=True),
            replaced=dict(type="dict", default={}), job=dict(type="dict", default={}),
            probes=dict(type="list", elements="dict", default=[]), reference=dict(type="dict", default={}),
            settings=dict(type="dict", default={}), bandwidth=dict(type="list", elements="dict"),
            kind=dict(type="str"), full_nodes=dict(type="list", elements="str", default=[]),
        ),
        required_if=[("step", step, ["run_dir", "attempt"]) for step in ON_CONTROLLER] + [
            ("step", "place", ["attempt"])],
        supports_check_mode=True,
    )
    p = module.params
    p.update(records.record_paths(p["shared_dir"], p["quarantine_file"], p["spares_file"]))
    try:
        STEPS[p["step"]](module, p)
    except recovery.RecordError as exc:
        module.fail_json(msg="run_recovery (%s): %s" % (p["step"], exc))
    except (OSError, ValueError) as exc:
        module.fail_json(msg="run_recovery (%s) could not read or write %s: %s" % (
            p["step"], p["run_dir"] if p["step"] in ON_CONTROLLER else "the records on the coordinator (%s, %s)" % (
                p["quarantine_file"], p["spares_file"]), exc))


if __name__ == "__main__":
    main()
