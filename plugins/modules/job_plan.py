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
    C(MULTINODE_DS_ATTEMPT); the bundled trainer's later attempts resume from the newest whole checkpoint. A later
    attempt on fewer nodes than the run began with gets O(settings) C(grow) from
    M(multinode.deepspeed.run_recovery)'s place step, and its plan's C(grow) (the nodes and spares its watch looks
    out for, their addresses, the run's width) makes the watch grow the run back at its next checkpoint
    (C(docs/recovery.md#grow-back)).
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
    description:
      - The job's settings, each read from the play's variable of the same name (the C(-e) value of C(train.yml), or
        the inventory's); a value given here wins. These are the C(-e) variables of C(train.yml) that the plan
        reads; C(scripts/gen_docs.py) renders them as the table of C(docs/train.md).
      - A launch backend's own variables (C(slurm_*), C(k8s_*)) are read the same way and described with the backend
        (C(docs/backends.md)).
    type: dict
    default: {}
    suboptions:
      model:
        description:
          - The bundled trainer's model - V(llama-tiny), V(gpt2-tiny) or V(llama) (the Llama 3.1 8B architecture).
            It also names the checkpoint directory, C(<shared_dir_path>/checkpoints/<model>).
        type: str
        default: llama-tiny
      steps:
        description: Training steps (the step to reach when resuming), a whole number of at least 1.
        type: int
        default: 30
      args:
        description:
          - More arguments for the bundled trainer (its flags - C(docs/trainer.md#flags)) or for your own script.
          - 'Split as a shell splits a command line (Python''s C(shlex.split)): quotes group words, and each word
            reaches the program as it is, through no shell. Ansible splits C(-e key=value) pairs on spaces, so quote
            the whole value inside the C(-e) string - C(-e "args=''--micro-batch 8 --seq-len 128''").'
        type: str
      run_id:
        description:
          - The name of the run directory, on the cluster (C(<shared_dir_path>/runs/<run_id>)) and on the controller;
            letters, digits, C(.), C(_) and C(-), and it must not exist yet.
          - Unset - the UTC date and time, milliseconds, four random hex digits and the model, for example
            V(20261122-131500-1234f00d-llama-tiny).
        type: str
      backend:
        description:
          - How the ranks start and stop (C(docs/backends.md)).
          - V(pdsh) - pdsh on the coordinator starts DeepSpeed's launcher on every rank node over SSH.
          - V(ssh-free) - each rank node's agent starts its own launcher; no SSH between the nodes.
          - V(slurm) - the run is a Slurm batch job (C(docs/backends.md#the-slurm-backend)).
          - V(kubernetes) - one pod per rank node from the stack's image (C(docs/kubernetes.md)).
        type: str
        choices: [pdsh, ssh-free, slurm, kubernetes]
        default: pdsh
      entrypoint:
        description:
          - Your own DeepSpeed script instead of the bundled trainer - a path in C(workdir), or an absolute path every
            node can read (C(docs/own-script.md)). Unset - the bundled trainer.
        type: str
      workdir:
        description:
          - A directory on the controller (relative to where C(ansible-playbook) runs), copied to
            C(<shared_dir_path>/workspaces/<hash>/) once per content (its files as git sees them); the ranks run from
            it (C(docs/own-script.md#1-ship-the-code--e-workdir)).
        type: str
      workdir_exclude:
        description: Patterns (comma-separated or a list) left out of the workdir besides C(.gitignore)'s, for example
          V(*.pt,data/raw/,/out).
        type: raw
      workdir_max_mb:
        description: A workdir bigger than this many MB is refused, naming its biggest entries.
        type: int
        default: 512
      workdir_include_secrets:
        description:
          - Patterns (as C(workdir_exclude) takes them) of files named like secrets that ship anyway, for example
            V(certs/ca.pem) (C(docs/own-script.md#what-stays-on-the-controller)).
        type: raw
      workdir_allow_private:
        description: Ship files that only their owner may read on the controller (mode 0600, 0700) instead of
          refusing the workdir.
        type: bool
        default: false
      tracking:
        description:
          - Where the run's metrics go, comma-separated for several - V(tensorboard), V(csv), V(wandb), V(comet)
            (DeepSpeed's monitor, on the ranks) and V(mlflow) (logged from the controller after the collection)
            (C(docs/tracking.md)).
        type: str
      mlflow_tracking_uri:
        description:
          - Where V(mlflow) tracking logs - a path, a C(file://), C(https://), C(http://) or C(sqlite://) URI, or
            V(databricks). Unset - the file store C(mlruns) in the collect directory (C(runs/mlruns)).
        type: str
      hosts:
        description: The workers that take ranks (comma-separated inventory names, or a list), in inventory order,
          for example V(worker1,worker2). Unset - every worker.
        type: raw
      exclude:
        description: Workers (comma-separated, or a list) that take no ranks, for example V(worker2); a worker left
          out may be down.
        type: raw
      resume:
        description: The bundled trainer loads the newest whole checkpoint of C(model) and continues from its step
          (C(docs/recovery.md#checkpoints-and-resuming)).
        type: bool
        default: false
      save_interval:
        description: The bundled trainer also saves a checkpoint every N steps; V(0) - only at the end.
        type: int
        default: 0
      ds_config:
        description:
          - A DeepSpeed JSON config on the controller (or C(--deepspeed_config X) in C(args)), checked by DeepSpeed's
            own config class on a worker at the job's world size before anything starts; merged over the bundled
            trainer's config, or given to your script as C(--deepspeed_config). The DeepSpeed ops it needs are built
            on the rank nodes first (C(docs/own-script.md#2-your-deepspeed-config--e-ds_config-checked-by-deepspeed)).
        type: str
      model_path:
        description: Pretrained weights for the bundled trainer - a directory readable at the same path on every
          node, or a Hugging Face hub id. Unset - random weights.
        type: str
      dataset:
        description: A Hugging Face dataset for the bundled trainer, C(NAME[:SPLIT]); it needs the C(datasets)
          package on every node. Unset - the bundled corpus.
        type: str
      secret_env:
        description:
          - Secret variables for every rank, a mapping (keep it in ansible-vault) - node-local, mode 0600, in no file
            of the run, no log and no command line (C(docs/security.md#secrets)).
        type: dict
      master_port:
        description:
          - The rendezvous port on the master (the first rank host), 1024-65535. Preflight checks it free and
            reachable; when no preflight runs, it is checked free on the master before the launch
            (C(docs/bad-inputs.md#master-port)).
        type: int
        default: 29500
      timeout:
        description: Seconds (at least 10) after which the run is stopped on every node; with C(restarts), for every
          attempt together.
        type: int
        default: 3600
      startup_timeout:
        description: Seconds the ranks get to start and take a first step once they can start (a Slurm job started,
          the pods running); shorter than C(timeout).
        type: int
        default: 300
      queue_timeout:
        description: Seconds a scheduler's job may wait in the queue before the run is given up, naming the job and
          the reason. Unset - only C(timeout) bounds the wait.
        type: int
      stall_timeout:
        description:
          - Seconds without a finished step (for a script without metrics, without a write to the ranks' logs) after
            which the run counts as stalled (hung); shorter than C(timeout). Unset - ten times the step time the run
            has shown (its 90th percentile), within C(stall_floor) and C(stall_ceiling); a checkpoint save under way
            gets three times the longest save so far, at least C(startup_timeout); a script without metrics, 45 s
            or half of C(startup_timeout) (C(docs/agents.md#a-stalled-run)).
        type: int
      stall_floor:
        description: The least number of seconds without a finished step that make a run hung, when C(stall_timeout)
          is unset (a run of 20 ms steps is called hung after this, not after 0.2 s).
        type: int
        default: 10
      stall_ceiling:
        description: The most seconds without a finished step that a run may go before it counts as hung, when
          C(stall_timeout) is unset (a run of ten-minute steps is called hung after this at the latest).
        type: int
        default: 1800
      straggler_threshold:
        description: A node is a straggler when its ranks' compute pace (each step's work outside collectives; the
          bundled trainer's forward passes) stays below this share of the fastest rank's for C(straggler_steps) steps
          - its score, 1.0 for the fastest (C(docs/agents.md#stragglers)). Between 0 and 1.
        type: float
        default: 0.7
      straggler_steps:
        description: Steps in a row a node's score must stay below C(straggler_threshold) before it is named.
        type: int
        default: 10
      on_straggler:
        description:
          - V(warn) - the progress line names the straggler and its score; the summary and the report keep every
            node's score over the steps.
          - V(replace) - also stop the attempt and move the run off the node in the next one (a spare takes its
            place, or the run goes on with fewer nodes down to C(min_nodes)); the node is quarantined with the
            reason. Needs C(restarts).
        type: str
        choices: [warn, replace]
        default: warn
      warm_start:
        description:
          - V(true) - each node's ranks fork from the node's warm process, which imported torch, DeepSpeed and
            transformers once (C(docs/agents.md#warm-ranks)); a rank starts cold, saying why, where there is none or
            it is stale. The pdsh and ssh-free backends; Slurm and Kubernetes ranks always start cold.
          - V(false) - every rank starts a fresh interpreter.
        type: bool
        default: true
      preflight:
        description:
          - V(true) - reuse a passing preflight of the same job, else run it (C(docs/preflight.md)); V(force) -
            always run it; V(false) - skip it. A failed preflight stops the launch.
        type: raw
        default: true
      restarts:
        description:
          - Attempts after the first when a failure is recoverable (a node lost or cut off, a rank killed or failing,
            a stall), 0-100. The run goes on from its newest whole checkpoint on the nodes that came back, on
            C(spares), or on fewer nodes down to C(min_nodes) (C(docs/recovery.md)). Inventory - C(train_restarts).
        type: int
        default: 0
      recover_wait:
        description: Seconds a failed node gets to come back when no spare can take its place. Inventory -
          C(train_recover_wait).
        type: int
        default: 120
      min_nodes:
        description: The fewest rank nodes a run may go on with; more than the job's rank nodes is refused. Unset -
          all the run started with. Inventory - C(train_min_nodes).
        type: int
      unquarantine:
        description:
          - Nodes (comma-separated) let out of quarantine for this and later runs, and spares let out of the hold of
            a run that ended without giving them back; with the slurm backend also resumed in Slurm when a run
            drained them. A name that is no worker or spare of the inventory and not quarantined is refused
            (C(docs/recovery.md#the-quarantine-and-spares-records)).
        type: raw
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
extends_documentation_fragment:
  - multinode.deepspeed.attributes
attributes:
  check_mode:
    support: full
    description: Plans only; nothing changes in either mode.
  diff_mode:
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
