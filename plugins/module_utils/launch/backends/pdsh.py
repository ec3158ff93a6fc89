# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""pdsh: DeepSpeed's own launcher on the coordinator reaches every rank node over SSH."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends


class PdshBackend(backends.Backend):
    NAME = "pdsh"
    DESCRIPTION = "DeepSpeed's launcher on the coordinator, SSH to the workers"
    ranks_over_ssh = True
    # DeepSpeed's runner answers SIGTERM with `pdsh ... pkill -f 'python -u -m deepspeed.launcher.launch'`, which
    # kills every run's launchers on the nodes: the agent kills it outright, and each node's agent stops this
    # run's ranks by their marker.
    stop_signal = "KILL"

    def launchers(self, job):
        return list(job["coordinators"][:1])

    def launch_argv(self, job, node):
        return self.deepspeed_argv(job) + ["--launcher", "pdsh", "--force_multi"] + self.rank_program(job)

    def ssh_pairs(self, job):
        """The coordinator reaches every node of the job, itself included; every rank node reaches
        itself (DeepSpeed's launcher and pdsh treat a local entry like any other)."""
        coords = list(job["coordinators"])
        nodes = coords + [h for h in job["rank_hosts"] if h not in coords]
        pairs = [(src, dst) for src in coords for dst in nodes]
        pairs += [(h, h) for h in job["rank_hosts"] if (h, h) not in pairs]
        return pairs
