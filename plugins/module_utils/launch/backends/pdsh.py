# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""pdsh: DeepSpeed's own launcher on the coordinator reaches every rank node over SSH."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends


class Ranks(backends.Ranks):
    launcher_per_node = False
    over_ssh = True

    def ssh_pairs(self, job):
        """The coordinator reaches every node, itself included (pdsh logs into a local entry like any other); a rank
        node logs in nowhere, so it holds no key (role ssh_mesh)."""
        coords = list(job["coordinators"])
        return [(src, dst) for src in coords for dst in coords + [h for h in job["rank_hosts"] if h not in coords]]


class PdshBackend(backends.Backend):
    NAME = "pdsh"
    DESCRIPTION = "DeepSpeed's launcher on the coordinator, SSH to the workers"
    ranks = Ranks()
    start = backends.Start(launcher="pdsh")
    # DeepSpeed's runner answers SIGTERM with `pdsh ... pkill -f 'python -u -m deepspeed.launcher.launch'` (every run's): KILL it; agents stop the ranks.
    stop = backends.Stop(signal="KILL")
