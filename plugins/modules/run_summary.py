#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: run_summary
short_description: Summarize a collected training run into summary.json
version_added: "0.1.0"
description:
  - Reads the per-rank metrics (C(metrics/rank*.jsonl)) of a run directory that was collected to the controller,
    and writes C(summary.json) there with the world size, the hosts and their ranks, the steps,
    the first and last loss, the wall time and the exit status.
  - A run counts as successful only when the launcher exited 0 and every rank wrote its final record;
    DeepSpeed's launcher can exit 0 although ranks died.
  - Reads the per-node agents' records (C(nodes/*.json)) for exit codes and versions, finds the rank that
    failed first, and maps known failure patterns in the logs to their cause and remedy (C(diagnosis)).
  - Writes C(report.md) with PNG plots under C(plots/) (loss, throughput, step time per node).
  - What came back from the cluster was written by rank code - before reading, it removes from O(run_dir) whatever is
    not a regular file or a directory (a symbolic link, a FIFO, a socket, a device); it reads only regular files,
    without following a link or waiting on a FIFO, and writes C(summary.json), C(report.md) and the plots beside
    their place and renames them over it (a link there is replaced, never followed). The names it refused, and the
    ones the pull left behind (O(pull_lines)), are the summary's C(refused_files), named in the report and in
    RV(message).
  - Its action plugin does the work in the controller's own process (no module is started on any host), so the
    run directory is a path on the controller.
extends_documentation_fragment:
  - multinode.deepspeed.report
  - multinode.deepspeed.attributes
  - multinode.deepspeed.attributes.dry_run
options:
  run_id:
    description: The run's id.
    type: str
    required: true
  world_size:
    description: The world size the hostfile promised.
    type: int
  launcher_rc:
    description:
      - The launchers' exit code.
      - When not given, it is taken from the agents' heartbeats (C(nodes/*.json)) of role C(launcher) - the first one
        that is not 0, else 0; unknown when a launcher never reported one.
    type: int
  wall_time:
    description: Seconds from launch to the end of the run.
    type: float
  coordinator:
    description: The coordinator's host name; a rank there is reported as a problem.
    type: str
  expect_metrics:
    description:
      - Whether the entrypoint writes the bundled trainer's metrics (C(metrics/rank*.jsonl)).
      - A user's own script need not; its run then counts as successful on the launchers' exit codes.
    type: bool
    default: true
  started:
    description: When the run started (seconds since the epoch); sets O(wall_time) when that is not given.
    type: float
  lost:
    description: Nodes the run lost (the watch found them unreachable); named first, before a rank that failed
      because of them.
    type: list
    elements: str
    default: []
  cause:
    description:
      - What the watch found brought the run down beside its ranks and nodes (its C(cause), a full disk); named
        first, and the rank that failed first is recorded as a consequence of it. The abort record's C(cause) is
        used when this is not set.
    type: str
  straggler:
    description:
      - The plan's straggler settings (C(threshold), C(steps)). With them, the summary's C(stragglers) holds each
        node's compute pace over the steps (the C(compute) seconds of the ranks' step records, 1.0 for the fastest
        rank), its last score and the stragglers named, as the watch would see them with every step in view; the
        report names them and draws C(plots/stragglers.png).
    type: dict
  plots_in_background:
    description:
      - Draw the plots in a process of their own that the module does not wait for (C(train.yml) does, so that the
        play does not wait for matplotlib). C(report.md) names them at once and they appear within a second or
        two; RV(plots) lists the paths they will have.
    type: bool
    default: false
  pull_lines:
    description:
      - The output lines of the pull that collected the run (C(ansible.posix.synchronize)'s C(stdout_lines)) - each
        C(skipping non-regular file "<name>") of rsync names a file the run left that was not brought back.
    type: list
    elements: str
    default: []
  addresses:
    description: Node -> address; the addresses in a failed rank's last lines (gloo and NCCL name peers by address)
      get the node's name beside them.
    type: dict
    default: {}
  extra:
    description:
      - More keys to store in the summary. C(train.yml) adds C(model), C(backend), C(entrypoint), C(hostfile) (its
        text), C(master), C(run_dir_on_cluster), C(watch) (the watch's status and reason) and C(preflight) (the
        preflight's outcome, or the reused record).
    type: dict
    default: {}
notes:
  - It reads C(metrics/rank*.jsonl) (a torn last line, from a rank killed while writing, is skipped); C(nodes/*.json),
    the agents' last heartbeats (roles, exit codes, versions); C(nodes/*.launcher.log) and C(logs/*_rank*.log) (the
    last 4 MiB of each); C(hostfile), to map ranks to hosts; C(control/ABORT); C(rank.env) (C(.deepspeed_env) for a
    run from before it); and C(scheduler.json) when the launch backend left one (slurm).
  - The run's C(status) is C(success) only when C(problems) is empty. A problem is recorded when a rank has no
    C(done) record (with O(expect_metrics)); the ranks disagree on the world size; the world size differs from
    O(world_size), or some of the ranks 0 to O(world_size) - 1 wrote no metrics (with O(expect_metrics)); a launcher
    log contains DeepSpeed's C(Unable to find hostfile) (it fell back to the local node); the launchers' exit code is
    unknown (it never finished) or not 0; a rank ran on O(coordinator); a rank exited non-zero; or the run was
    aborted.
  - The cause comes first in C(problems) - O(cause) (a full disk), then a lost node (O(lost), or the abort
    record's), else the rank that failed first (for example V(rank 1 on worker2 exited with -9 (SIGKILL\))), else
    who aborted the run. A rank elsewhere
    that failed after a node was lost is recorded as a consequence of it.
  - The first failure is the first line C(... exits with return code = N) (N not 0) in the launcher logs, the log of
    the node that wrote the abort record being read first. The line gives the host (pdsh prefixes it) and the local
    rank, which the hostfile turns into a global rank. A rank that exited with an error after its collective lost
    its peer (C(Connection closed by peer) in its log) is passed over for another rank's exit that is not such a
    consequence (a rank killed by a signal), whichever node's launcher noticed first.
  - The diagnosis (C(plugins/module_utils/run/diagnose.py)) looks for known patterns in the launcher and rank logs -
    the hostfile fallback, RDMA that cannot initialize, collective and rendezvous timeouts, CUDA out of memory, an
    invalid device ordinal, SSH host key and permission errors, a master port in use, a missing Python module, an
    NCCL version mismatch, a rank killed by a signal - and for versions that differ between the nodes. Each finding
    has an C(id), the C(cause), the C(remedy), and the first C(file) and C(line) that matched.
  - C(report.md) shows the status and problems, what failed (with the last lines of that rank's log), the diagnosis,
    a table of the run (model, backend, entrypoint, world size, steps, losses, tokens/s, wall time, exit status), the
    ranks per host, the versions per host, and the plots. The plots are drawn only when the ranks wrote step records
    - loss and throughput from the lowest rank, step time for every rank labelled with its host, so that a slow node
    stands out.
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Summarize the collected run
  multinode.deepspeed.run_summary:
    run_dir: "runs/{{ run_id }}"
    run_id: "{{ run_id }}"
    world_size: 2
    launcher_rc: 0
  delegate_to: localhost
"""

RETURN = r"""
message:
  description:
    - The outcome in a few lines, which C(train.yml) prints - world size, hosts, loss or the script, time; or why the
      run failed (the first failed rank, its last log lines, the diagnosis with its fix) - and where the report is.
    - 'For a successful run - C(Run <run_id>: world size <W> on <host> ranks [<r>, ...], ...), then
      C(Loss <first> -> <last> in <N> steps, <S> s) (for a user''s script C(<entrypoint> finished on every rank in
      <S> s)), C(Report: <run_dir>/report.md) and C(Summary: <run_dir>/summary.json).'
    - 'For a failed run - C(Run <run_id> failed: <problems, separated by ;>), C(Lost first: <nodes>) when the run lost
      nodes, C(Failed first: rank <R> on <host>, exit code <code>) (C(Then failed) when it failed because of a lost
      node), C(Last lines of <log>:) with its last 15 lines, one V(Diagnosis (<id>\): <cause> Fix: <remedy>) line per
      finding, and C(Report: <run_dir>/report.md).'
    - 'Either way, when C(refused_files) is not empty, a line C(Not brought back (not regular files: ...\): <names>)
      before C(Report:).'
  returned: always
  type: str
summary:
  description: The summary written to C(summary.json) (sorted keys, indented), with the keys of O(extra) added.
  returned: always
  type: dict
  contains:
    run_id:
      description: The run's id.
      type: str
    status:
      description: C(success) or C(failed).
      type: str
    problems:
      description: Why the run counts as failed, the cause first (see the notes).
      type: list
      elements: str
    exit_status:
      description: The launchers' exit code (O(launcher_rc)), or null when unknown.
      type: int
    world_size:
      description: The world size the ranks reported (without O(expect_metrics), O(world_size) as given).
      type: int
    hosts:
      description:
        - 'Host name to the list of its global ranks, for example C({"worker1": [0], "worker2": [1]}); without
          metrics, taken from the rank logs and the hostfile.'
      type: dict
    ranks:
      description: Per rank (as a string) - C(host), C(local_rank), C(world_size), C(steps), C(last_step), C(finished),
        C(mean_step_time).
      type: dict
    steps:
      description: Distinct steps recorded.
      type: int
    last_step:
      description: The last step recorded.
      type: int
    first_loss:
      description: The mean loss at the first step.
      type: float
    last_loss:
      description: The mean loss at the last step.
      type: float
    loss_fell:
      description: Whether the loss fell from the first step to the last.
      type: bool
    mean_tokens_per_sec:
      description: The mean of the per-step tokens/s.
      type: float
    wall_time:
      description: O(wall_time) as given (or from O(started)).
      type: float
    resume:
      description: For a resumed run, C(from_tag) (the checkpoint it loaded), C(start_step) and C(skipped) (torn
        checkpoints it skipped); null for a run from scratch.
      type: dict
    failure:
      description:
        - The first failure - C(host), C(rank), C(local_rank), C(exit_code), C(signal), C(line), and when the rank's
          log exists C(log) and C(last_lines) (its last 15 lines); C(consequence_of) when it failed because of a lost
          node; null when none.
      type: dict
    lost:
      description: The nodes the run lost (O(lost) and the abort record's), sorted.
      type: list
      elements: str
    abort:
      description: The abort record, or null.
      type: dict
    diagnosis:
      description: The findings, each C(id), C(cause), C(remedy), C(file), C(line).
      type: list
      elements: dict
    versions:
      description: Per node, the versions its agent reported (python, torch, deepspeed, transformers, ...).
      type: dict
    nodes:
      description: Per node - C(role), C(state), C(exit_code), C(reason), C(left_pids) (what the run left running
        there, see C(left_pids)).
      type: dict
    left_pids:
      description:
        - Per node that has any, what the run left running there, each C(pid), C(cmd) (its command line, at most 200
          characters; null when unknown) and C(stopped) - the processes still there after the launcher's exit (on a
          watch-only node, after C(DONE)), which the node's agent stopped after a short grace, then any the agent
          did not stop (its last heartbeat's C(pids)). Named in the report, never the run's failure.
      type: dict
    rank_logs:
      description: Per rank - C(host) and C(log) (its path relative to the run directory).
      type: dict
    environment:
      description:
        - The ranks' whole environment (C(rank.env)), with the values of keys containing C(TOKEN), C(SECRET),
          C(PASSWORD), C(PASSWD), C(CREDENTIAL), C(API_KEY), C(ACCESS_KEY) or C(PRIVATE_KEY) replaced by
          C(********), unless the key ends in C(_PATH) or C(_FILE).
      type: dict
    scheduler:
      description: The launch backend's record of the job (slurm - job id, state, exit code, elapsed, nodes).
      returned: when the backend left C(scheduler.json)
      type: dict
    refused_files:
      description:
        - Names (relative to O(run_dir)) of what the run left in its directory that is not a regular file or a
          directory - a symbolic link, a FIFO, a socket, a device - so neither brought back nor read (removed from
          O(run_dir) when the pull brought it); sorted, empty when none.
      type: list
      elements: str
path:
  description: Path of C(summary.json).
  returned: always
  type: str
report:
  description: Path of C(report.md).
  returned: always
  type: str
plots:
  description: Paths of the PNG plots.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.run.collected import (
    ARGUMENT_SPEC, ReportError, report)


def main():
    # The action plugin of the same name does this work in the controller's process; run as a module, the same.
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        module.exit_json(**report(module.params, module.check_mode))
    except ReportError as exc:
        module.fail_json(msg=str(exc))


if __name__ == "__main__":
    main()
