# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""pdsh: pdsh on the coordinator reaches every rank node over SSH and starts DeepSpeed's per-node launcher there."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import shlex

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends


class Ranks(backends.Ranks):
    launcher_per_node = False
    over_ssh = True
    # Each rank node's shell starts the node's agent before DeepSpeed's launcher: one module run less per node.
    agents_by_launcher = True

    def ssh_pairs(self, job):
        """The coordinator reaches every node, itself included (pdsh logs into a local entry like any other); a rank
        node logs in nowhere, so it holds no key (role ssh_mesh)."""
        coords = list(job["coordinators"])
        return [(src, dst) for src in coords for dst in coords + [h for h in job["rank_hosts"] if h not in coords]]


class Start(backends.Start):
    """The coordinator's agent runs pdsh with the command DeepSpeed's runner (``deepspeed --launcher pdsh``) gives it
    (``PDSHRunner.get_cmd``).  The runner in front of pdsh only computes that command, after a Python start that
    imports DeepSpeed and torch and an SSH login to the first node (its check that SSH works, which preflight has
    made).  Two differences, both narrower: each node's shell reads the variables from the run's ``.deepspeed_env``
    on the shared disk, so no value is on pdsh's command line; and every word is quoted for that shell."""

    def argv(self, job, node):
        return pdsh_argv(job)


def pdsh_argv(job):
    """pdsh over SSH (``-R ssh``: the runner's ``PDSH_RCMD_TYPE=ssh``) to every rank node at once (its fan-out), the
    largest of the nodes' exit codes as its own (``-S``); on each node ``deepspeed.launcher.launch`` with
    ``--node_rank=%n``, pdsh's index of the node in ``-w``, the hostfile's order, after the node's agent has
    started (``backends.agent_shell``)."""
    run_dir = shlex.quote(job["run_dir"])
    launch = backends.launch_argv(job, "%n", sep="=") + Start.rank_program(job)
    on_node = "cd %s && set -a && . %s/.deepspeed_env && set +a && %sexec %s" % (
        run_dir, run_dir, backends.agent_shell(PdshBackend(), job, "%n"), " ".join(shlex.quote(a) for a in launch))
    return ["pdsh", "-S", "-R", "ssh", "-f", "1024", "-w", ",".join(job["rank_hosts"]), on_node]


class PdshBackend(backends.Backend):
    NAME = "pdsh"
    DESCRIPTION = "pdsh on the coordinator starts DeepSpeed's launcher on every worker over SSH"
    ranks = Ranks()
    start = Start()
