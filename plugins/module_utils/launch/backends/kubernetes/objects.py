# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kubernetes backend's objects, from the job plan: one headless Service and one Pod per rank node per run.

One pod per rank host of the plan (its ordinal is DeepSpeed's node rank), each asking for the host's slots in
GPUs (CUDA ranks), the shared directory as a volume (a PVC, an NFS export or a hostPath), ``/dev/shm`` as a
memory-backed emptyDir, and the ranks' environment from the same NCCL profile. Two fabric modes:

* ``tcp``: ``NCCL_IB_DISABLE=1`` and ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` for the pod's interface;
* ``rdma``: the RDMA device resource (configurable name), ``IPC_LOCK``, optional host networking,
  ``NCCL_IB_HCA`` and ``NCCL_IB_GID_INDEX`` from the profile.

Also their names and labels (``object_name``, ``LABEL``), the checks of the backend's options (``check``)
and what one pod asks for (``per_pod_resources``).

Pure Python, no Ansible import: unit-tested on the controller.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import re

LABEL = "multinode-deepspeed.io/run"
ORDINAL_LABEL = "multinode-deepspeed.io/ordinal"
APP = {"app.kubernetes.io/name": "multinode-deepspeed", "app.kubernetes.io/managed-by": "multinode.deepspeed"}
DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
RESOURCE_RE = re.compile(r"([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
IMAGE_RE = re.compile(r"[a-z0-9][a-z0-9._-]*(:[0-9]+)?(/[a-z0-9][a-z0-9._-]*)*(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
                      r"(@sha256:[a-f0-9]{64})?")
QUANTITY_RE = re.compile(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
FABRICS = ("tcp", "rdma")
VOLUME_KINDS = ("pvc", "nfs", "hostPath")
# Pod names are <statefulset>-<ordinal> and must stay DNS labels (63 characters) with room for the ordinal.
NAME_MAX = 52


# Seconds a pod may outlive the run's timeout (activeDeadlineSeconds) before the kubelet stops it: the agents stop
# the run at its timeout; the kubelet's deadline is the net under a run whose controller and agents are gone.
DEADLINE_MARGIN = 60


# On the run's Service: seconds after its creation past which no controller follows the run (its timeout and the
# margin); the next run in the namespace removes it (``pods.leftovers``).
DEADLINE_ANNOTATION = "multinode-deepspeed.io/deadline-seconds"


def object_name(run_id, attempt=1):
    """The run's Service and StatefulSet name: ``mnds-`` + the run id as a DNS label (lower case, '-'), with a
    short hash of the real run id when it had to change, so that two run ids never share a name.  A later attempt
    of a run with restarts is a new generation of objects, ``<name>-a<attempt>``: the pods of a node that stopped
    reporting stay Terminating until it answers again, and must not hold the next attempt's names."""
    base = re.sub(r"[^a-z0-9-]+", "-", str(run_id).lower()).strip("-") or "run"
    name = "mnds-" + base
    if name != "mnds-" + str(run_id) or len(name) > NAME_MAX:
        digest = hashlib.sha256(str(run_id).encode()).hexdigest()[:6]
        name = "%s-%s" % (name[:NAME_MAX - 7].rstrip("-"), digest)
    if int(attempt or 1) > 1:
        name = "%s-a%d" % (name, int(attempt))
    return name


def run_name(job):
    """The objects' name of the planned ``job`` (its run id and attempt)."""
    return object_name(job["run_id"], job.get("attempt") or 1)


# A Node's name (a DNS subdomain), as the plan accepts one to keep the pods off.
NODE_NAME_RE = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")


def node_affinity(avoid):
    """The pods' affinity that keeps them off the Nodes ``avoid`` (by name: ``matchFields`` on ``metadata.name``,
    not a label another node could share), or None; no node is cordoned, so other users' pods still run there."""
    if not avoid:
        return None
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": sorted(set(avoid))}]}]}}}


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


def pod_env(job, opts, name):
    """The ranks' environment in a pod: the plan's, the fabric mode's NCCL/gloo variables for the pod's interface
    (``eth0``, or the node's with host networking), and pod 0's stable name as the master."""
    interface = "eth0" if not opts.get("host_network") else (opts.get("interface") or job.get("interface") or "eth0")
    env = dict(job["env"])
    env.update(fabric_env(opts["fabric"], opts.get("profile_env"), opts.get("interface") or interface))
    if opts["fabric"] == "rdma":
        # The nodes' own tcp profile (a plan made over Ethernet-only hosts) must not switch InfiniBand off.
        env.pop("NCCL_IB_DISABLE", None)
    env["MULTINODE_DS_K8S_MASTER"] = master_dns(name, opts["namespace"], opts.get("cluster_domain") or "cluster.local")
    return env


def container(job, opts, name):
    """The pod's one container: the image, ``multinode_ds.k8s pod``, the environment, the master port, the shared
    directory and ``/dev/shm``, the GPUs and RDMA devices it asks for (``IPC_LOCK`` for RDMA)."""
    env = pod_env(job, opts, name)
    resources = dict((k, str(v)) for k, v in per_pod_resources(job, opts).items())
    out = {
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
        out["resources"] = {"limits": dict(resources), "requests": dict(resources)}
    out["securityContext"] = container_security(opts)
    return out


def container_security(opts):
    """The container's securityContext: no privilege escalation, every capability dropped but ``IPC_LOCK`` in rdma
    mode (the ranks pin memory for the HCA), a non-root user when ``run_as_user`` is one."""
    out = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    if opts.get("fabric") == "rdma":
        out["capabilities"]["add"] = ["IPC_LOCK"]
    user = numeric_id(opts.get("run_as_user"))
    if user is not None:
        out["runAsUser"] = user
        out["runAsNonRoot"] = user != 0
    return out


def numeric_id(value):
    """A uid or gid option as an int, or None (unset or not a number: ``check`` names it)."""
    return int(value) if re.fullmatch(r"[0-9]+", str(value if value is not None else "")) else None


def pod_security(opts):
    """The pod's securityContext: ``fsGroup`` (``fs_group``, else the non-root ``run_as_user``) owns the Secret's
    files, so a non-root image reads them (the Secret's mode is 0440)."""
    user, group = numeric_id(opts.get("run_as_user")), numeric_id(opts.get("fs_group"))
    if group is None and user:
        group = user
    # The container runtime's default seccomp filter (syscalls such as keyctl, kexec, module loading refused), as the
    # "restricted" Pod Security Standard asks; Kubernetes' own default is Unconfined.
    out = {"seccompProfile": {"type": "RuntimeDefault"}}
    if group is not None:
        out["fsGroup"] = group
    if user:
        out["runAsNonRoot"] = True
    return out


def secret_items(job):
    """What the run's Secret holds for the ranks (the play's start step makes it from hf_token and secret_env), under
    the names they read on any other backend (``<home>/secrets``); none: the run has no secrets."""
    items = []
    if job["env"].get("HF_TOKEN_PATH"):
        items.append({"key": "hf_token", "path": "hf_token"})
    if job.get("secret_file"):
        items.append({"key": "secret_env", "path": "runs/" + job["secret_file"].rpartition("/")[2]})
    return items


def pod_spec(job, opts, name):
    """The pod: its container, the shared directory's volume, ``/dev/shm`` in memory (``shm_size``), the run's
    Secret when it has secrets, host networking when asked."""
    ranks = container(job, opts, name)
    shm = {"medium": "Memory"}
    if opts.get("shm_size"):
        shm["sizeLimit"] = opts["shm_size"]
    volumes = [volume(opts.get("volume") or {}, job["shared_dir"]), {"name": "dshm", "emptyDir": shm}]
    items = secret_items(job)
    if items:
        volumes.append({"name": "secrets", "secret": {"secretName": secret_name(name), "items": items,
                                                      "defaultMode": 0o440}})
        ranks["volumeMounts"].append({"name": "secrets", "mountPath": job["home"] + "/secrets", "readOnly": True})
    spec = {
        "containers": [ranks],
        "volumes": volumes,
        "terminationGracePeriodSeconds": 15,
        "enableServiceLinks": False,
        # The pods never call the API: no service account token in them.
        "automountServiceAccountToken": False,
        "securityContext": pod_security(opts),
    }
    if job.get("timeout"):
        # The run's timeout, kept by the kubelet even when no controller is left to stop the run: a pod ends at most
        # a minute after the agent's own --max-time would have stopped it.
        spec["activeDeadlineSeconds"] = int(job["timeout"]) + DEADLINE_MARGIN
    if opts.get("host_network"):
        spec["hostNetwork"] = True
        spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    affinity = node_affinity(job.get("avoid_scheduler_nodes"))
    if affinity:
        spec["affinity"] = affinity
    return spec


def objects(job, opts):
    """``[Service, Pod 0, Pod 1, ...]`` for the planned ``job``: a headless Service and one Pod per rank host
    (``pod_spec``), named ``<name>-<ordinal>``, reachable at ``<name>-<ordinal>.<name>.<namespace>.svc...``.

    Bare pods with ``restartPolicy: Never``, not a StatefulSet: a pod whose agent ends (the run done, or the
    controller's lease lapsed) ends too and gives its GPUs back; nothing starts it again.  The play makes the
    Service the owner of the pods and the Secret (``owner_reference``), so deleting the Service deletes the rest.

    ``opts``: ``namespace``, ``image``, ``fabric`` (tcp|rdma), ``rdma_resource`` (e.g.
    ``rdma/rdma_shared_device_a``), ``rdma_count``, ``host_network``, ``interface`` (the pod's, default
    ``eth0``), ``volume`` (see ``volume``), ``shm_size`` (e.g. ``8Gi``, or None: no limit),
    ``cluster_domain``, ``profile_env`` (the NCCL profile's variables), ``run_as_user``, ``fs_group``.
    """
    name = run_name(job)
    namespace = opts["namespace"]
    labels = dict(APP)
    labels[LABEL] = name
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels,
                     "annotations": {DEADLINE_ANNOTATION: str(int(job.get("timeout") or 0) + DEADLINE_MARGIN)}},
        "spec": {"clusterIP": "None", "selector": {LABEL: name}, "publishNotReadyAddresses": True,
                 "ports": [{"name": "master", "port": int(job["master_port"])}]},
    }
    pods = []
    for index in range(len(job["rank_hosts"])):
        spec = pod_spec(job, opts, name)
        spec.update({"hostname": "%s-%d" % (name, index), "subdomain": name, "restartPolicy": "Never"})
        pods.append({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": "%s-%d" % (name, index), "namespace": namespace,
                                  "labels": dict(labels, **{ORDINAL_LABEL: str(index)})},
                     "spec": spec})
    return [service] + pods


def deletion(objects, secret):
    """The run's objects to delete, ``[{"kind", "name"}]``: what the Service owns (the pods, the Secret) first,
    the Service last.  Deleted the other way round, the garbage collector removes an owned object between the
    module's read and its delete, and the delete fails on the 404."""
    owned = [o for o in objects if o["kind"] != "Service"] + [{"kind": "Secret", "metadata": {"name": secret}}]
    owners = [o for o in objects if o["kind"] == "Service"]
    return [{"kind": o["kind"], "name": o["metadata"]["name"]} for o in owned + owners]


def owner_reference(name, uid):
    """What the pods and the Secret carry: the run's Service owns them (deleting it deletes them)."""
    return {"apiVersion": "v1", "kind": "Service", "name": name, "uid": uid}


def check(job, opts):
    """Problems of a plan for this backend, each with its fix."""
    problems = []
    slots = sorted(set(job["slots"].values()))
    if len(slots) > 1:
        problems.append("backend=kubernetes gives every pod the same resources, but the ranks per "
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
    if not opts.get("image") and not opts.get("image_default"):
        problems.append("k8s_image is not set. Fix: -e k8s_image=<an image with the stack's venv at %s>"
                        % job["venv"])
    elif opts.get("image") and not IMAGE_RE.fullmatch(str(opts["image"])):
        problems.append("k8s_image=%r is not an image reference. Fix: -e k8s_image=<registry/name:tag>"
                        % (opts["image"],))
    domain = str(opts.get("cluster_domain") or "cluster.local")
    if len(domain) > 253 or not all(DNS_LABEL_RE.fullmatch(label) for label in domain.split(".")):
        problems.append("k8s_cluster_domain=%r is not a DNS domain. Fix: -e k8s_cluster_domain=<the cluster's "
                        "domain, e.g. cluster.local>" % (domain,))
    for key in ("run_as_user", "fs_group"):
        if opts.get(key) not in (None, "") and numeric_id(opts[key]) is None:
            problems.append("k8s_%s=%r is not a numeric id. Fix: -e k8s_%s=<uid or gid, e.g. 1000>"
                            % (key, opts[key], key))
    if opts.get("shm_size") not in (None, "") and not QUANTITY_RE.fullmatch(str(opts["shm_size"])):
        problems.append("k8s_shm_size=%r is not a Kubernetes quantity. Fix: -e k8s_shm_size=8Gi (or leave it out)"
                        % (opts["shm_size"],))
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
    kind, _sep, rest = text.partition(":")
    if text.startswith("/"):
        return {"kind": "hostPath", "path": text}
    if kind == "pvc":
        return {"kind": "pvc", "claim": rest}
    if kind == "nfs":
        server, _sep, path = rest.partition(":")
        return {"kind": "nfs", "server": server, "path": path}
    if kind == "hostPath":
        return {"kind": "hostPath", "path": rest}
    return {"kind": kind}


def per_pod_resources(job, opts):
    """What one pod asks for (resource -> count), as ``objects`` writes it."""
    out = {}
    if job["accelerator"] == "cuda":
        out["nvidia.com/gpu"] = int(job["slots"][job["rank_hosts"][0]])
    if opts.get("fabric") == "rdma":
        out[opts["rdma_resource"]] = int(opts.get("rdma_count") or 1)
    return out


def secret_name(name):
    """The run's Secret (hf_token, secret_env), created by the play's start step when the run has secrets."""
    return name + "-secrets"
