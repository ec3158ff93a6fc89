#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: job_plan
short_description: Plan a DeepSpeed job once - ranks, master, environment, program and what the launch backend does
version_added: "0.3.0"
description:
  - An action plugin; it runs on the controller and changes nothing anywhere.
  - Reads the run's settings from the play's variables (the C(-e) values C(model), C(steps), C(args), C(backend),
    C(entrypoint), C(resume), C(save_interval), C(ds_config), C(model_path), C(dataset), C(master_port), C(timeout),
    C(run_id), C(hosts), C(exclude), the inventory's C(deepspeed_rank_env), C(shared_dir_path), C(stack_venv_dir),
    C(stack_home), C(stack_torch_extensions_dir), and whether C(hf_token) is set), overridden by O(settings).
  - Reads each worker's facts from C(hostvars) - C(deepspeed_slots), the GPU count (C(multinode_accelerators)),
    C(deepspeed_accelerator), C(ansible_host), memory and default interface (from C(multinode_node) of
    M(multinode.deepspeed.node_facts), else from Ansible's facts), and C(multinode_node_env) (the job's NCCL and stack
    variables, when a task recorded them).
  - A run's recovery settings are planned too - C(restarts) (inventory C(train_restarts); attempts after the first,
    0-100, default 0), C(recover_wait) (C(train_recover_wait); seconds a failed node gets to come back, default 120)
    and C(min_nodes) (C(train_min_nodes); the fewest rank nodes the run may go on with). With C(restarts) above 0 each
    attempt has its own directory, C(runs/<run_id>/attempts/<n>) (C(attempt_path)), and its ranks get
    C(MULTINODE_DS_ATTEMPT); the bundled trainer's later attempts resume from the newest whole checkpoint.
  - The nodes quarantined (a node that failed twice in one run) take no ranks, and each is named in a warning;
    C(-e unquarantine=worker2) lets one out again. The quarantine and spares records are files on the coordinator,
    in the shared directory (C(<shared_dir_path>/runs/.records/quarantine.json) and C(spares.json), or the absolute
    paths there C(quarantine_file) and C(spares_file) name), so every controller that drives the cluster sees the
    same ones; the plan takes them from the coordinator's M(multinode.deepspeed.node_facts) with C(records) (none
    where it did not read them), and fails naming a record that cannot be read and the fix. It writes nothing -
    C(train.yml) lets the nodes of C(-e unquarantine=) out on the coordinator after the plan (its C(checks.yml),
    M(multinode.deepspeed.run_recovery) C(step=unquarantine)).
  - Reads what the user brings from the controller, where C(ansible-playbook) runs (C(plugins/module_utils/plan/usercode.py))
    - C(workdir) (with C(workdir_exclude) and C(workdir_max_mb); its files as git sees them, hashed, the file list kept
    under C(~/.cache/multinode-deepspeed/workspaces/) for rsync), C(ds_config) or a C(--deepspeed_config) in C(args)
    (a JSON object, read there), C(tracking) and C(mlflow_tracking_uri). A later attempt's plan gets the first one's
    (O(settings) C(user_inputs)), so it runs the same workdir content.
  - 'What of the workdir stays on the controller: files whose names say they hold secrets are left out, git tracked or
    not, and named in a warning - C(.env), C(.env.*) (not C(.env.example), C(.env.sample), C(.env.template),
    C(.env.dist)), C(.envrc), C(*.pem), C(*.key), C(*.p12), C(*.pfx), C(*.jks), C(*.keystore), C(*.ppk), C(*.kdbx),
    C(id_rsa*), C(id_dsa*), C(id_ecdsa*), C(id_ed25519*), the directories C(.ssh/), C(.gnupg/), C(.aws/), C(.azure/),
    C(.kube/), C(.docker/), and C(.netrc), C(_netrc), C(.git-credentials), C(.pypirc), C(.npmrc), C(.pgpass),
    C(.my.cnf), C(.vault_pass*), C(credentials.json), C(kubeconfig). C(workdir_include_secrets) (patterns as
    C(workdir_exclude) takes them, comma-separated or a list) ships the ones it names, e.g.
    C(-e workdir_include_secrets=certs/ca.pem).'
  - 'Refused at once, before a file is listed: C(workdir=/), the controller user''s home directory or a directory
    above it, and a directory with C(.ssh/) at its top. Refused after the listing: a shipped file or directory that
    neither the group nor others may read on the controller (mode 0600, 0700), unless C(workdir_allow_private=true).
    The workspace on the shared directory is readable by the run''s account only, and read-only once it is marked
    whole (directories 0500, files 0400 or 0500); the ranks start in their attempt''s C(work/), where a link to each
    top entry of the workspace reads it as on the controller and what they write is collected with the run.'
  - C(min_nodes) above the job's rank nodes, a C(-e unquarantine) name that is no worker or spare of the inventory
    and not quarantined, and a C(quarantine_file) or C(spares_file) that is not an absolute path are refused (the
    records are left as they were).
  - Checks every value and returns the whole job (see RETURN), or fails with one sentence per problem, each with
    its fix, before anything on the nodes changes. The logic is C(plugins/module_utils/plan/job.py) and the launch
    backends are C(plugins/module_utils/launch/backends/) (C(docs/backends.md)).
options:
  settings:
    description: Settings that win over the play's variables (same names).
    type: dict
    default: {}
  workers:
    description: The candidate rank hosts, in order (default the group C(workers)).
    type: list
    elements: str
  coordinators:
    description: The hosts that run the launcher (default the group C(coordinator)).
    type: list
    elements: str
notes:
  - 'Any bad value fails the task, before anything changes, with one sentence per problem and its fix, for example
    V(The job cannot start: steps=''0'' must be a whole number >= 1. Fix: -e steps=<steps>; backend=mpi is not a
    launch backend. Fix: -e backend=pdsh or -e backend=ssh-free ...).'
  - 'A worker of the play that was targeted but failed or was unreachable (it is not in C(ansible_play_hosts), for
    example because M(multinode.deepspeed.node_facts) failed there) cannot take ranks. When such a worker is a rank
    node of the job, the plan fails naming it - V(The job cannot start: worker2 did not answer (unreachable, or
    reading it failed: the error is above\), so a job on worker1, worker2 cannot start. Fix: repair worker2, or leave
    it out with -e exclude=worker2.) A worker left out of the job (C(hosts), C(exclude)) may be down.'
attributes:
  check_mode:
    support: full
    description: Plans only; nothing changes in either mode.
  diff_mode:
    support: none
    description: Nothing changes, so there is no diff.
author:
  - multinode.deepspeed developers (@multinode)
"""

EXAMPLES = r"""
- name: Plan the job (fails naming the value and the fix)
  multinode.deepspeed.job_plan:
  register: train_plan

- name: Plan a job on two workers with the ssh-free backend
  multinode.deepspeed.job_plan:
    settings:
      backend: ssh-free
      hosts: [gpu-a1, gpu-a2]
  register: train_plan
"""

RETURN = r"""
records:
  description:
    - Where the quarantine and spares records are on the coordinator, C(quarantine_file) and C(spares_file) - the
      paths its M(multinode.deepspeed.node_facts) read, else C(quarantine_file) and C(spares_file), else their
      place in the shared directory. The recovery's steps on the coordinator
      (M(multinode.deepspeed.run_recovery)) read and write them there.
  returned: success
  type: dict
  sample: {quarantine_file: /srv/multinode-deepspeed/runs/.records/quarantine.json,
           spares_file: /srv/multinode-deepspeed/runs/.records/spares.json}
user_inputs:
  description:
    - What was read on the controller - C(workdir) (the workdir's plan, without its file list), C(ds_config) (the
      user's config), C(ds_config_source), C(args) (without C(--deepspeed_config)), C(tracking), C(mlflow_uri). Passed
      back as O(settings) C(user_inputs), a later attempt's plan reads nothing again.
  returned: success
  type: dict
job:
  description:
    - The job. Keys include C(run_id), C(run_dir), C(checkpoint_dir), C(backend), C(rank_hosts), C(slots),
      C(first_ranks), C(world_size), C(hostfile), C(ranks), C(master), C(master_addr), C(master_port),
      C(accelerator), C(env) (the ranks' environment), C(program) (the argv after DeepSpeed's options), C(metrics)
      (the bundled trainer writes metrics), C(rank_memory_gib), C(dry_run) (the bundled trainer's check, for
      M(multinode.deepspeed.run_prepare); none for a user's script), C(allreduce) (preflight's all-reduce test per rank
      node), and C(launch) - the backend's C(launchers), C(agents), C(argv) per launcher, C(agent_argv) per agent
      (M(multinode.deepspeed.agent_start)), C(ssh_agents) (the agents the play starts over SSH), C(secret_hosts) (the
      rank nodes the play writes the run's secrets to), C(ssh_pairs), C(ssh_targets) per source node,
      C(ranks_over_ssh) and C(stop).
    - With C(workdir), C(workdir) - C(id), C(hash), C(root), C(dest) (C(<shared_dir>/workspaces/<id>)), C(marker),
      C(count), C(bytes), C(git) (C(commit), C(dirty), C(branch)), C(entrypoint), C(files_from_path),
      C(secrets_left_out) (the files left out because their names say they hold secrets), C(top) (its top entries,
      the links of the ranks' C(work/)). Always C(pull_opts) (the rsync options of the run directory's pull). With a
      C(ds_config) or a monitor tracker, C(ds_config) - C(source), C(path) (in the run directory), C(text), C(kept)
      (the monitor keys the user set otherwise), C(user); for a user's script with a config, C(ds_check) (the argv of
      M(multinode.deepspeed.ds_config_check)). Always C(tracking) (the names) and C(mlflow) (C(uri), C(env), or none).
    - Fails when a rank node of the job did not answer in this play (unreachable, or reading it failed), naming it and
      C(-e exclude).
  returned: success
  type: dict
  contains:
    workdir:
      description: Where the user's workdir goes and what it is; none without C(workdir).
      type: dict
    ds_config:
      description: The DeepSpeed config the ranks read, written by M(multinode.deepspeed.run_prepare); none without one.
      type: dict
    dry_run:
      description:
        - The bundled trainer's check, C(<venv>/bin/python -m multinode_ds.train --dry-run --world-size W
          [--memory-gib G] <program arguments>); null for a user's script. M(multinode.deepspeed.run_prepare) runs it.
      type: list
      elements: str
    allreduce:
      description:
        - Per rank node, the argv of preflight's all-reduce test (C(multinode_ds.allreduce_perf)) with the job's master
          address and port, world size, first rank, slots and backend (C(nccl) on C(cuda), else C(gloo)); the
          C(preflight) role adds C(--label), C(--out), C(--max-bytes) and C(--timeout).
      type: dict
    launch:
      description:
        - What the launch backend does - C(launchers) (the nodes that run a launcher), C(agents) (the nodes that run
          an agent), C(argv) (the launcher's argv per launcher), C(agent_argv) (per agent node,
          C(<venv>/bin/python -m multinode_ds.agent --run-dir D --host H --max-time T [-- <launcher argv>])),
          C(ssh_agents) (the agents M(multinode.deepspeed.agent_start) starts; with pdsh the coordinator's only,
          pdsh's command starts the rank nodes'), C(secret_hosts), C(ssh_pairs) and C(ssh_targets) (the SSH logins
          the launch needs, as pairs and as the targets per source node; preflight tries them from there).
      type: dict
"""
