# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kubernetes backend's objects, from the job plan: one headless Service and one StatefulSet per run.

One pod per rank host of the plan (its ordinal is DeepSpeed's node rank), each asking for the host's slots in
GPUs (CUDA ranks), the shared directory as a volume (a PVC, an NFS export or a hostPath), ``/dev/shm`` as a
memory-backed emptyDir, and the ranks' environment from the same NCCL profile. Two fabric modes:

* ``tcp``: ``NCCL_IB_DISABLE=1`` and ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` for the pod's interface;
* ``rdma``: the RDMA device resource (configurable name), ``IPC_LOCK``, optional host networking,
  ``NCCL_IB_HCA`` and ``NCCL_IB_GID_INDEX`` from the profile.

Pure Python, no Ansible import: unit-tested on the controller.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import re

LABEL = "multinode-deepspeed.io/run"
APP = {"app.kubernetes.io/name": "multinode-deepspeed", "app.kubernetes.io/managed-by": "multinode.deepspeed"}
DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
RESOURCE_RE = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
FABRICS = ("tcp", "rdma")
VOLUME_KINDS = ("pvc", "nfs", "hostPath")
# Pod names are <statefulset>-<ordinal> and must stay DNS labels (63 characters) with room for the ordinal.
NAME_MAX = 52


def object_name(run_id):
    """The run's Service and StatefulSet name: ``mnds-`` + the run id as a DNS label (lower case, '-'), with a
    short hash of the real run id when it had to change, so that two run ids never share a name."""
    base = re.sub(r"[^a-z0-9-]+", "-", str(run_id).lower()).strip("-") or "run"
    name = "mnds-" + base
    if name != "mnds-" + str(run_id) or len(name) > NAME_MAX:
        digest = hashlib.sha256(str(run_id).encode()).hexdigest()[:6]
        name = "%s-%s" % (name[:NAME_MAX - 7].rstrip("-"), digest)
    return name


def master_dns(name, namespace, cluster_domain="cluster.local"):
    """Pod 0's stable name through the headless Service."""
    return "%s-0.%s.%s.svc.%s" % (name, name, namespace, cluster_domain)


def volume(opts, shared_dir):
    """The shared directory's volume: ``{"kind": "pvc", "claim": NAME}``, ``{"kind": "nfs", "server": HOST,
    "path": PATH}`` or ``{"kind": "hostPath", "path": PATH}`` (default: the shared directory's own path)."""
    kind = opts.get("kind") or "hostPath"
    if kind == "pvc":
        return {"name": "shared", "persistentVolumeClaim": {"claimName": opts["claim"]}}
    if kind == "nfs":
        return {"name": "shared", "nfs": {"server": opts["server"], "path": opts["path"]}}
    return {"name": "shared", "hostPath": {"path": opts.get("path") or shared_dir, "type": "Directory"}}


def fabric_env(fabric, profile_env, interface):
    """The NCCL/gloo variables of the fabric mode, over the job's profile variables."""
    env = dict(profile_env or {})
    if fabric == "tcp":
        env["NCCL_IB_DISABLE"] = "1"
        env["NCCL_SOCKET_IFNAME"] = "=" + interface
        env["GLOO_SOCKET_IFNAME"] = interface
    else:
        env.pop("NCCL_IB_DISABLE", None)
        env.setdefault("NCCL_SOCKET_IFNAME", "=" + interface)
        env.setdefault("GLOO_SOCKET_IFNAME", interface)
    return env


def objects(job, opts):
    """``[Service, StatefulSet]`` for the planned ``job``.

    ``opts``: ``namespace``, ``image``, ``fabric`` (tcp|rdma), ``rdma_resource`` (e.g.
    ``rdma/rdma_shared_device_a``), ``rdma_count``, ``host_network``, ``interface`` (the pod's, default
    ``eth0``), ``volume`` (see ``volume``), ``shm_size`` (e.g. ``8Gi``, or None: no limit),
    ``cluster_domain``, ``profile_env`` (the NCCL profile's variables).
    """
    name = object_name(job["run_id"])
    namespace = opts["namespace"]
    labels = dict(APP)
    labels[LABEL] = name
    hosts = list(job["rank_hosts"])
    slots = job["slots"][hosts[0]]
    interface = "eth0" if not opts.get("host_network") else (opts.get("interface") or job.get("interface") or "eth0")
    env = dict(job["env"])
    env.update(fabric_env(opts["fabric"], opts.get("profile_env"), opts.get("interface") or interface))
    env["MULTINODE_DS_K8S_MASTER"] = master_dns(name, namespace, opts.get("cluster_domain") or "cluster.local")
    resources = {}
    if job["accelerator"] == "cuda":
        resources["nvidia.com/gpu"] = str(slots)
    if opts["fabric"] == "rdma":
        resources[opts["rdma_resource"]] = str(opts.get("rdma_count") or 1)
    container = {
        "name": "ranks",
        "image": opts["image"],
        "imagePullPolicy": "IfNotPresent",
        # The pod's part of the run: its ordinal is DeepSpeed's node rank (multinode_ds.k8s).
        "command": [job["venv"] + "/bin/python", "-m", "multinode_ds.k8s", "pod", "--run-dir", job["run_dir"]],
        "env": [{"name": k, "value": v} for k, v in sorted(env.items())] + [
            {"name": "MULTINODE_DS_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "ports": [{"name": "master", "containerPort": int(job["master_port"])}],
        "volumeMounts": [{"name": "shared", "mountPath": job["shared_dir"]},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if resources:
        container["resources"] = {"limits": dict(resources), "requests": dict(resources)}
    if opts["fabric"] == "rdma":
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    shm = {"medium": "Memory"}
    if opts.get("shm_size"):
        shm["sizeLimit"] = opts["shm_size"]
    pod_spec = {
        "containers": [container],
        "volumes": [volume(opts.get("volume") or {}, job["shared_dir"]), {"name": "dshm", "emptyDir": shm}],
        "terminationGracePeriodSeconds": 15,
        "enableServiceLinks": False,
    }
    if opts.get("host_network"):
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"clusterIP": "None", "selector": {LABEL: name}, "publishNotReadyAddresses": True,
                 "ports": [{"name": "master", "port": int(job["master_port"])}]},
    }
    statefulset = {
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "serviceName": name, "replicas": len(hosts), "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {LABEL: name}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
    return [service, statefulset]


def check(job, opts):
    """Problems of a plan for this backend, each with its fix."""
    problems = []
    slots = sorted(set(job["slots"].values()))
    if len(slots) > 1:
        problems.append("backend=kubernetes gives every pod the same resources (one StatefulSet), but the ranks per "
                        "node differ (%s). Fix: the same deepspeed_slots on every node, or -e hosts= the nodes with "
                        "as many" % ", ".join("%s=%s" % kv for kv in sorted(job["slots"].items())))
    if not DNS_LABEL_RE.fullmatch(str(opts.get("namespace") or "")) or len(str(opts.get("namespace"))) > 63:
        problems.append("k8s_namespace=%r is not a namespace name (lower-case letters, digits, '-'). Fix: -e "
                        "k8s_namespace=<name>" % (opts.get("namespace"),))
    if opts.get("fabric") not in FABRICS:
        problems.append("k8s_fabric=%r is not a fabric mode. Fix: -e k8s_fabric=tcp or -e k8s_fabric=rdma"
                        % (opts.get("fabric"),))
    if opts.get("fabric") == "rdma" and not RESOURCE_RE.fullmatch(str(opts.get("rdma_resource") or "")):
        problems.append("k8s_rdma_resource=%r is not a resource name. Fix: -e k8s_rdma_resource=<the device "
                        "plugin's resource, e.g. rdma/rdma_shared_device_a>" % (opts.get("rdma_resource"),))
    if not opts.get("image"):
        problems.append("k8s_image is not set. Fix: -e k8s_image=<an image with the stack's venv at %s>"
                        % job["venv"])
    vol = opts.get("volume") or {}
    if vol.get("kind", "hostPath") not in VOLUME_KINDS:
        problems.append("k8s_shared_volume kind %r is not one of %s. Fix: pvc:<claim>, nfs:<server>:<path> or "
                        "hostPath:<path>" % (vol.get("kind"), ", ".join(VOLUME_KINDS)))
    elif vol.get("kind") == "pvc" and not DNS_LABEL_RE.fullmatch(str(vol.get("claim") or "")):
        problems.append("k8s_shared_volume=pvc:%s: not a claim name. Fix: pvc:<claim name>" % vol.get("claim"))
    elif vol.get("kind") == "nfs" and (not vol.get("server") or not str(vol.get("path") or "").startswith("/")):
        problems.append("k8s_shared_volume=nfs:%s:%s: needs a server and an absolute path. Fix: "
                        "nfs:<server>:</export/path>" % (vol.get("server"), vol.get("path")))
    return problems


def parse_volume(text):
    """``pvc:NAME``, ``nfs:SERVER:/PATH``, ``hostPath:/PATH`` (or ``/PATH``) -> the volume option."""
    text = str(text or "").strip()
    if not text:
        return {"kind": "hostPath"}
    kind, _, rest = text.partition(":")
    if text.startswith("/"):
        return {"kind": "hostPath", "path": text}
    if kind == "pvc":
        return {"kind": "pvc", "claim": rest}
    if kind == "nfs":
        server, _, path = rest.partition(":")
        return {"kind": "nfs", "server": server, "path": path}
    if kind == "hostPath":
        return {"kind": "hostPath", "path": rest}
    return {"kind": kind}
