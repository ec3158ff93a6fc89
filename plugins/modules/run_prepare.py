#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: run_prepare
short_description: Check a planned run on the coordinator, then write its directory, in one call
version_added: "0.3.0"
description:
  - Checks first, writing nothing - the run id is new (its directory has no hostfile yet; one a failed preflight left
    is reused), the user's script exists (with a workdir - C(job.workdir) - that C(<shared_dir>/workspaces) can take
    it, and whether this content is there already - RV(workspace_present), marked whole and hashed again to the
    marked content; one that changed since is named in a warning, and the write removes it to be copied again),
    and the bundled trainer's dry run (C(job.dry_run)) accepts the model, data, config and memory.
  - For the bundled trainer, the run's checkpoint directory must not be held by another live run (its
    C(<checkpoint_dir>.lock) names a run that is not done or aborted and whose controller renewed its lease in the
    last minute, or that was handed to the user, whose heartbeats, metrics or logs changed in the last minute and
    whose ranks have not all finished; a lock that cannot be read is held);
    writing takes the lock (the watch gives it back when the run ends). The lock is written whole (a temporary file
    and a rename) under an exclusive C(flock) of C(<lock>.guard), so of two runs only one takes it.
  - Writing first claims the run directory - C(control/claim), created exclusively with the play's token - so the
    same C(-e run_id) from two terminals gets one run, and the other play fails naming it.
  - Then, unless O(write=false), creates the run directory (C(logs/), C(control/), C(nodes/); with a workdir,
    C(work/), where the ranks start, with a link to each top entry of the workspace) and writes the
    hostfile, C(program.json) (the argv each rank becomes, read by C(multinode_ds.rank)), the DeepSpeed config the
    ranks read (C(job.ds_config), the user's C(-e ds_config) with the trackers' monitor sections), C(rank.env) (the
    ranks' whole environment, mode 0600), the C(.deepspeed_env) each node's shell exports before DeepSpeed's launcher
    starts (with pdsh; only the values a shell reads as they are; mode 0600) and the controller's lease (C(control/lease)) the
    agents watch.
  - One call where C(train.yml) had six tasks; C(job) is M(multinode.deepspeed.job_plan)'s result. C(train.yml) runs
    it on the coordinator (C(run_once), as the run's user) - with O(write=false) when a preflight runs first, then
    again with O(check=false) after the preflight.
  - Its action plugin runs the work (C(launch/prepare) of the collection's module_utils) in a Python start of its own
    on the coordinator, as the task's user and on the module's interpreter, without Ansible's module wrapper (about
    0.1 s less of the coordinator's CPU on the way to the first step); in check mode, without pipelining or with
    C(async) it runs as the module. The results and failures are the same.
extends_documentation_fragment:
  - multinode.deepspeed.job
  - multinode.deepspeed.attributes
options:
  write:
    description: Write the run directory after the checks (C(false) - check only, before a preflight).
    type: bool
    default: true
  check:
    description: Run the checks (C(false) - they ran in an earlier call of this run).
    type: bool
    default: true
  agent:
    description:
      - Start this node's agent once the directory is written, as M(multinode.deepspeed.agent_start) would (the same
        keys - V(argv), V(log), V(chdir), V(environment) - and V(node), the inventory name it is started for,
        returned as RV(agent_node)), saving the launch one round trip.
      - Not started when nothing is written (O(write=false), check mode) or when the job's workdir is not on the
        shared directory yet (RV(workspace_present) false - the play copies it, then starts the agent).
      - C(train.yml) passes it when nothing else has to happen on the nodes before the launcher starts (no preflight
        to run, no secrets to install, no backend start step) and the node running it starts an agent over SSH.
    type: dict
attributes:
  check_mode:
    support: full
    description: Checks; writes nothing.
notes:
  - 'Each check fails with the value and the fix - V(run_id=X exists already (<run_dir> on <coordinator>\). Fix: pick
    another -e run_id, or leave it out for a new one.); V(entrypoint=<path> does not exist on <coordinator>. Fix: put
    the script on the shared directory (<shared_dir>\) or at the same path on every node, and pass its absolute
    path.); and, when the dry run (run with C(DS_ACCELERATOR) set) exits non-zero, V(The bundled trainer refuses this
    run (checked on <coordinator>\): <the last line of its stderr>), without the trainer''s C(multinode_ds:) prefix
    (C(exit code N) when stderr is empty).'
  - Every file is written through a temporary file and a rename. The launch backend's own files (C(job.launch.files),
    a batch script for example) are written under the run directory too. It reports C(changed) only when it wrote the
    files.
seealso:
  - module: multinode.deepspeed.job_plan
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Check the run and write its directory
  multinode.deepspeed.run_prepare:
    job: "{{ train_job }}"
"""

RETURN = r"""
run_dir:
  description: The run's directory.
  returned: always
  type: str
workspace_present:
  description: Whether the job's workdir (C(job.workdir)) is on the shared directory already, whole (its marker
    C(workspaces/<id>.json) is there); the play copies it when it is not.
  returned: when the job has a workdir and O(check) is true
  type: bool
dry_run:
  description: The trainer's plan (model, parameters, ZeRO stage, estimated GiB per rank), when it checked one.
  returned: when the job runs the bundled trainer and O(check) is true
  type: dict
written:
  description: The files written.
  returned: always
  type: list
  elements: str
agent_pid:
  description: The process id of the agent O(agent) started.
  returned: when it started the agent
  type: int
agent_node:
  description: O(agent)'s V(node) - whose agent was started, so that the play starts the other nodes' only.
  returned: when it started the agent
  type: str
started:
  description: The controller's clock (seconds since the epoch) as the task began - the run's start, which its summary
    counts from.
  returned: always
  type: float
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.prepare import (
    ARGUMENT_SPEC, PrepareError, prepare)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = prepare(module.params, module.check_mode)
    except PrepareError as exc:
        module.fail_json(msg=str(exc), **exc.extra)
    for warning in result.pop("warnings", []):
        module.warn(warning)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
