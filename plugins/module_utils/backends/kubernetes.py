# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kubernetes (issue 14, WIP): the run is one headless Service and one StatefulSet (module_utils/k8s.py).

Where ranks start: one pod per rank host of the plan; the pod's ordinal is DeepSpeed's node rank, its agent
starts ``deepspeed --no_ssh --node_rank=<ordinal>`` with pod 0's stable DNS name as the master
(``multinode_ds.k8s pod``).  What watches them: the same agents' heartbeats on the shared directory, and the pods'
status.  How a run stops: the agents' ABORT and lease, then the StatefulSet deleted (not yet wired: see
docs/wip-kubernetes.md).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

from ansible_collections.multinode.deepspeed.plugins.module_utils import backends, k8s

OBJECTS_FILE = "k8s/objects.json"
AGENTS_FILE = "k8s/agents.json"


class KubernetesBackend(backends.Backend):
    NAME = "kubernetes"
    DESCRIPTION = "a StatefulSet and a headless Service per run, one pod per rank node (kubernetes.core)"
    checks = "kubernetes"
    SETTINGS = {"k8s_namespace": "default", "k8s_kubeconfig": None, "k8s_context": None, "k8s_image": None,
                "k8s_fabric": "tcp", "k8s_rdma_resource": "rdma/rdma_shared_device_a", "k8s_host_network": False,
                "k8s_shared_volume": "", "k8s_shm_size": None, "k8s_apply": True, "k8s_keep": False,
                "k8s_cluster_domain": "cluster.local"}

    def options(self, settings, problems):
        opts = dict((k[len("k8s_"):], settings.get(k) if settings.get(k) is not None else v)
                    for k, v in self.SETTINGS.items())
        for key in ("host_network", "apply", "keep"):
            opts[key] = backends.flag(opts[key])
        opts["volume"] = k8s.parse_volume(opts.pop("shared_volume"))
        return opts

    def check(self, job):
        return k8s.check(job, job["backend_options"])

    def launchers(self, job):
        return list(job["rank_hosts"])

    def launch_argv(self, job, node):
        opts = job["backend_options"]
        master = k8s.master_dns(k8s.object_name(job["run_id"]), opts["namespace"], opts["cluster_domain"])
        argv = self.deepspeed_argv(job)
        argv[argv.index("--master_addr") + 1] = master
        return argv + ["--no_ssh", "--node_rank", str(list(job["rank_hosts"]).index(node))] + self.rank_program(job)

    def files(self, job):
        agents = self.describe_agents(job)
        return {
            OBJECTS_FILE: json.dumps(k8s.objects(job, job["backend_options"]), indent=1, sort_keys=True) + "\n",
            AGENTS_FILE: json.dumps(agents) + "\n",
        }

    def describe_agents(self, job):
        """One agent argv per pod ordinal (the plan's rank order)."""
        return [self.agent_argv(job, host, self.launch_argv(job, host)) for host in job["rank_hosts"]]

    def start(self, job):
        return job["backend_options"]["apply"]

    def handoff(self, job):
        path = "%s/%s" % (job["run_dir"], OBJECTS_FILE)
        return ("The run's Service and StatefulSet are written: %s (k8s_apply=false). Apply them with: kubectl "
                "apply -f %s ; delete them with kubectl delete -f %s when the run ends." % (path, path, path))
