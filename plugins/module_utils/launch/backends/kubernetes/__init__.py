# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""kubernetes: the run is one headless Service and one Pod per rank node (``objects``), applied from the controller
with kubernetes.core.k8s; the Service owns the pods and the run's Secret.

The backend is this package: its classes here, and its modules

* ``objects``: what the run's Kubernetes objects are (names, labels, the pods' spec, the options' checks);
* ``pods``: the pods read back from the API (their state, why they will not run, the runs left over);
* ``api``: the watch's client of the API (``Api``).

Preflight's verdicts on the cluster are ``module_utils/preflight/kubernetes.py`` (the filter ``k8s_preflight``);
the nodes' side of a pod is ``multinode_ds/k8s.py``.

Where ranks start: one pod per rank host of the plan; the pod's ordinal is DeepSpeed's node rank, its agent
starts DeepSpeed's per-node launcher (``deepspeed.launcher.launch --node_rank <ordinal>``) with pod 0's stable DNS
name as the master (``multinode_ds.k8s pod``).  The play starts no agent over SSH.
What watches them: the agents' heartbeats on the shared directory (the pods mount it), and the pods' status from
the API (``follower``: a pod that cannot be scheduled, cannot start, restarts or whose node stops reporting
stops the run at once, naming it).
How a run stops: the agents' ABORT and lease, as everywhere (a pod ends with its agent: ``restartPolicy: Never``,
so a controller that dies leaves no pod holding GPUs); then the Service, the pods and the Secret are deleted
(role ``backend``'s step ``kubernetes/finish`` at the end of each attempt, the watch itself on Ctrl-C), unless
``k8s_keep``.
Preflight and the start check the cluster first (the API answers, the namespace, allocatable GPUs and the RDMA
resource, the claim): role ``backend``, steps ``kubernetes/preflight`` and ``kubernetes/check``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import time

from ansible_collections.multinode.deepspeed.plugins.module_utils.common.flags import flag
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import registry
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends.kubernetes import objects as k8s
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends.kubernetes import pods as k8s_pods
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends.kubernetes.api import Api

OBJECTS_FILE = "k8s/objects.json"
AGENTS_FILE = "k8s/agents.json"


class Options(backends.Options):
    """The namespace, the image, the fabric, the shared volume, whether to apply the objects and keep them."""

    defaults = {"k8s_namespace": "default", "k8s_kubeconfig": None, "k8s_context": None, "k8s_image": None,
                "k8s_fabric": "tcp", "k8s_rdma_resource": "rdma/rdma_shared_device_a", "k8s_host_network": False,
                "k8s_shared_volume": "", "k8s_shm_size": None, "k8s_apply": True, "k8s_keep": False,
                "k8s_cluster_domain": "cluster.local", "k8s_run_as_user": None, "k8s_fs_group": None,
                # The image: k8s_image, else image.yml's image of the workers' stack in image_registry (checked
                # there, with its label, unless k8s_image_check=false).
                "k8s_image_check": True, "image_registry": "", "image_name": "multinode-deepspeed",
                "image_registry_insecure": False, "image_auth_file": ""}

    def read(self, settings, problems):
        opts = dict((k[len("k8s_"):] if k.startswith("k8s_") else k,
                     settings.get(k) if settings.get(k) is not None else v)
                    for k, v in self.defaults.items())
        for key in ("host_network", "apply", "keep", "image_check", "image_registry_insecure"):
            opts[key] = flag(opts[key])
        opts["image_default"] = not opts["image"]
        # Unset: the pods run as the run's account (its uid on the coordinator), which owns the run directory;
        # with every capability dropped, root in a pod could not write there.
        if opts["run_as_user"] in (None, "") and settings.get("run_uid"):
            opts["run_as_user"] = settings["run_uid"]
        opts["volume"] = k8s.parse_volume(opts.pop("shared_volume"))
        # The controller's kubeconfig, as kubectl finds it (the plan is made on the controller).
        config = opts["kubeconfig"] or (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0] or "~/.kube/config"
        opts["kubeconfig"] = os.path.abspath(os.path.expanduser(str(config)))
        return opts

    def check(self, job):
        opts = job["backend_options"]
        problems = []
        if opts["image_default"]:
            # image.yml's image of the stack the rank nodes hold (their fingerprint is its tag).
            opts["image"], problem = registry.stack_image(opts["image_registry"], opts["image_name"],
                                                          job.get("stack_fingerprints") or {}, job["venv"])
            problems += [problem] if problem else []
        problems += k8s.check(job, opts)
        for node in job.get("avoid_scheduler_nodes") or []:
            if not k8s.NODE_NAME_RE.fullmatch(str(node)):
                problems.append("avoid_scheduler_nodes: %r is not a Kubernetes node name. Fix: leave it to the play"
                                % (node,))
        return problems


class Start(backends.Start):
    """Every pod starts DeepSpeed for its ordinal with pod 0's stable DNS name as the master; the play applies the
    objects (or writes them and stops).  Ranks start cold: a pod is new for every run, so no process of the node
    outlives one to stay warm in it."""

    warm = False

    def argv(self, job, node):
        opts = job["backend_options"]
        argv = super(Start, self).argv(job, node)
        argv[argv.index("--master_addr") + 1] = k8s.master_dns(k8s.run_name(job), opts["namespace"],
                                                               opts["cluster_domain"])
        return argv

    def files(self, job):
        # One agent argv per pod ordinal (the plan's rank order).
        agents = [KubernetesBackend.stop.agent_argv(job, host, self.argv(job, host)) for host in job["rank_hosts"]]
        return {
            OBJECTS_FILE: json.dumps(k8s.objects(job, job["backend_options"]), indent=1, sort_keys=True) + "\n",
            AGENTS_FILE: json.dumps(agents) + "\n",
        }

    def now(self, job):
        return job["backend_options"]["apply"]

    def handoff(self, job):
        path = "%s/%s" % (job["run_dir"], OBJECTS_FILE)
        return ("The run's Service and Pods are written: %s (k8s_apply=false). Apply them with: kubectl "
                "apply -f %s ; delete them with kubectl delete -f %s when the run ends." % (path, path, path))


class Tasks(backends.Tasks):
    """Role ``backend``'s kubernetes/ steps check the cluster (preflight, check), apply the objects (start), and
    collect the pods and delete the objects (finish)."""

    folder = "kubernetes"
    steps = ("preflight", "check", "start", "finish")

    def extra(self, job):
        opts = job["backend_options"]
        objects, secret = k8s.objects(job, opts), k8s.secret_name(k8s.run_name(job))
        return {"objects": objects, "name": k8s.run_name(job), "secret": secret,
                "delete": k8s.deletion(objects, secret),
                "per_pod": k8s.per_pod_resources(job, opts), "pods": len(job["rank_hosts"]),
                "owner": k8s.owner_reference(k8s.run_name(job), None)}


class Watch(backends.Watch):
    """The pods, as the API sees them (``Follower``); no SSH probe of the nodes."""

    probe_nodes = False

    def follow(self, job):
        opts = job["backend_options"]
        return {"backend": KubernetesBackend.NAME, "kubeconfig": opts["kubeconfig"], "context": opts["context"],
                "namespace": opts["namespace"], "name": k8s.run_name(job),
                "hosts": list(job["rank_hosts"]), "keep": opts["keep"]}

    def follower(self, spec):
        return Follower(spec)


class KubernetesBackend(backends.Backend):
    NAME = "kubernetes"
    DESCRIPTION = "a headless Service and one pod per rank node per run (kubernetes.core)"
    ranks = backends.Ranks(agents_over_ssh=False)
    options = Options()
    start = Start()
    tasks = Tasks()
    watch = Watch()


class Follower(object):
    """The run's pods as the API sees them, followed from the controller by the watch."""

    # Consecutive failed reads of the API before the run is stopped for it.
    API_FAILURES = 5

    def __init__(self, spec, api=None):
        self.spec = spec
        self.api = api
        self.pods = []
        self.failures = 0
        self.created = None
        self.error = None

    def _api(self):
        if self.api is None:
            self.api = Api(self.spec.get("kubeconfig"), self.spec.get("context"))
        return self.api

    def poll(self, now=None):
        """Problems that stop the run: ``[(rank host, message, lost)]``."""
        now = time.time() if now is None else now
        spec = self.spec
        try:
            api = self._api()
            pods = api.pods(spec["namespace"], spec["name"])
            nodes = api.nodes()
            owner = api.service(spec["namespace"], spec["name"])
            events = api.events(spec["namespace"], spec["name"]) if len(pods) < len(spec["hosts"]) else []
        except Exception as exc:  # pylint: disable=broad-except
            self.failures += 1
            self.error = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            if self.failures >= self.API_FAILURES:
                return [(None, "the Kubernetes API does not answer (%d tries: %s)" % (self.failures, self.error),
                         False)]
            return []
        self.failures = 0
        self.pods = sorted((k8s_pods.pod_state(p) for p in pods), key=lambda p: (p["ordinal"] is None, p["ordinal"]))
        if owner is None:
            return [(None, "the Service %s/%s is gone (deleted outside the run)" % (spec["namespace"], spec["name"]),
                     False)]
        self.created = k8s_pods.api_time((owner.get("metadata") or {}).get("creationTimestamp"))
        return [(host, "%s (%s)" % (host, msg) if host else msg, lost)
                for host, _pod, msg, lost in k8s_pods.pod_problems(pods, nodes, spec["hosts"], now, self.created,
                                                                   events)]

    def running(self):
        """Every planned pod runs (its agent is up, or about to be)."""
        return len(self.pods) == len(self.spec["hosts"]) and all(p["phase"] == "Running" for p in self.pods)

    def progress(self):
        """``pods 2/2 running`` or ``pods 1/2 running (mnds-x-1 Pending: ContainerCreating)``."""
        if not self.pods:
            return "pods 0/%d created" % len(self.spec["hosts"])
        running = [p for p in self.pods if p["phase"] == "Running"]
        others = ["%s %s%s%s" % (p["pod"], p["phase"], ": " + p["reason"] if p["reason"] else "",
                                 " on " + p["node"] if p["node"] else "")
                  for p in self.pods if p["phase"] != "Running"]
        return "pods %d/%d running%s" % (len(running), len(self.spec["hosts"]),
                                         " (%s)" % ", ".join(others) if others else "")

    def record(self):
        return {"pods": self.pods, "api_error": self.error if self.failures else None}

    def stop(self):
        """Delete the run's objects (unless ``keep``); what was deleted."""
        if self.spec.get("keep"):
            return []
        return self._api().delete_run(self.spec["namespace"], self.spec["name"])
