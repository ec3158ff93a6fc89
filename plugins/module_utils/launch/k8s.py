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

Pure Python, no Ansible import: unit-tested on the controller.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import hashlib
import re

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import registry as image_registry

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
# margin); the next run in the namespace removes it (``leftovers``).
DEADLINE_ANNOTATION = "multinode-deepspeed.io/deadline-seconds"
# Seconds a run's objects may stay once every pod ended (or before any pod exists) while its controller collects
# them; after that the next run in the namespace removes them.
LEFTOVER_GRACE = 120


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


# A container that cannot start for one of these reasons will not start by waiting.
STUCK_REASONS = {
    "ErrImagePull": "the node cannot pull k8s_image. Fix: -e k8s_image=<an image the nodes can pull or have>",
    "ImagePullBackOff": "the node cannot pull k8s_image. Fix: -e k8s_image=<an image the nodes can pull or have>",
    "ErrImageNeverPull": "k8s_image is not on the node. Fix: load the image on every GPU node, or push it to a "
                         "registry the nodes can pull from",
    "InvalidImageName": "k8s_image is not an image reference. Fix: -e k8s_image=<registry/name:tag>",
    "CreateContainerConfigError": "the pod's configuration is invalid on the node. Fix: see the message",
    "CreateContainerError": "the runtime cannot create the container. Fix: see the message",
    "RunContainerError": "the runtime cannot run the container. Fix: see the message",
    "CrashLoopBackOff": "the container keeps exiting. Fix: see the pod's log (runs/<run_id>/k8s/)",
}
# Seconds a pod may stay unschedulable, or missing from its StatefulSet, before the run is stopped.
UNSCHEDULABLE_GRACE = 15
MISSING_GRACE = 30


def _time(text):
    """An API timestamp (``2026-11-24T10:00:00Z``) -> seconds since the epoch, or None."""
    import calendar
    import time as _t
    try:
        return float(calendar.timegm(_t.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ")))
    except (TypeError, ValueError):
        return None


def condition(obj, kind):
    """The ``kind`` condition of a pod's or node's status (a dict), or {}."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return {}


def pod_ordinal(pod):
    name = (pod.get("metadata") or {}).get("name") or ""
    tail = name.rpartition("-")[2]
    return int(tail) if tail.isdigit() else None


def pod_state(pod):
    """One pod, as the run's record keeps it: name, ordinal, phase, node, ready, restarts, the container's state
    and why."""
    status = pod.get("status") or {}
    cstat = (status.get("containerStatuses") or [{}])[0]
    state = cstat.get("state") or {}
    kind = next(iter(state), None)
    detail = state.get(kind) or {}
    return {"pod": (pod.get("metadata") or {}).get("name"), "ordinal": pod_ordinal(pod),
            "phase": status.get("phase"), "node": (pod.get("spec") or {}).get("nodeName"),
            "ip": status.get("podIP"), "ready": condition(pod, "Ready").get("status") == "True",
            "restarts": int(cstat.get("restartCount") or 0), "container": kind,
            "reason": detail.get("reason") or status.get("reason"),
            "message": detail.get("message") or status.get("message"),
            "exit_code": detail.get("exitCode"),
            "started": bool(cstat.get("containerID")) or kind in ("running", "terminated"),
            "unschedulable": condition(pod, "PodScheduled").get("reason") == "Unschedulable",
            "unschedulable_message": condition(pod, "PodScheduled").get("message"),
            "unschedulable_since": _time(condition(pod, "PodScheduled").get("lastTransitionTime"))}


def pod_problems(pods, nodes, expected, now, created=None, events=()):
    """Why the run's pods will not run, from the API's objects (JSON dicts): ``pods`` (the run's), ``nodes``
    (every Node), ``expected`` (the plan's rank hosts, in ordinal order), ``now`` and ``created`` (when the
    run's Service was created, seconds), ``events`` (its events).

    Returns ``[(rank host, pod, message, lost)]``: ``lost`` when the pod's node stopped reporting.  Empty while
    the pods are running or may still start."""
    out = []
    by_ordinal = dict((pod_ordinal(p), p) for p in pods)
    ready = dict(((n.get("metadata") or {}).get("name"), condition(n, "Ready")) for n in nodes)
    for index, host in enumerate(expected):
        pod = by_ordinal.get(index)
        if pod is None:
            if created is not None and now - created > MISSING_GRACE:
                why = [e.get("message") for e in events if e.get("reason") == "FailedCreate"]
                out.append((host, None, "pod %d is missing %ds after the run's Service was created (deleted "
                            "outside the run?)%s" % (index, MISSING_GRACE, ": " + why[-1] if why else ""), False))
            continue
        st = pod_state(pod)
        name, node = st["pod"], st["node"]
        where = "pod %s%s" % (name, " on node %s" % node if node else "")
        if st["phase"] == "Failed":
            out.append((host, name, "%s failed: %s" % (where, st["message"] or st["reason"] or "no reason given"),
                        st["reason"] in ("Evicted", "NodeLost", "Shutdown")))
        elif st["phase"] == "Succeeded":
            continue
        elif st["unschedulable"]:
            since = st["unschedulable_since"]
            if since is None or now - since >= UNSCHEDULABLE_GRACE:
                out.append((host, name, "pod %s cannot be scheduled: %s. Fix: free or add nodes with the resources "
                            "the pod asks for (nvidia.com/gpu, the RDMA resource), or -e hosts= fewer nodes" % (
                                name, st["unschedulable_message"] or "no node fits"), False))
        elif node and ready.get(node, {}).get("status") != "True":
            cond = ready.get(node) or {}
            out.append((host, name, "%s: node %s is not ready (Ready=%s%s), so the pod does not run" % (
                where, node, cond.get("status") or "unknown", ": " + cond["message"] if cond.get("message") else ""),
                True))
        elif st["container"] == "waiting" and st["reason"] in STUCK_REASONS:
            out.append((host, name, "%s cannot start: %s%s; %s" % (
                where, st["reason"], " (%s)" % st["message"] if st["message"] else "", STUCK_REASONS[st["reason"]]),
                False))
        elif st["restarts"] > 0:
            out.append((host, name, "%s: its container exited%s and was restarted %d time(s); the run does not "
                        "survive a restart. Fix: see the pod's log (runs/<run_id>/k8s/)" % (
                            where, " with %s" % st["exit_code"] if st["exit_code"] is not None else "",
                            st["restarts"]), False))
    return out


def allocatable(nodes):
    """Per schedulable, ready Node: its allocatable resources (name -> int) and why others are left out."""
    fit, skipped = {}, {}
    for node in nodes:
        name = (node.get("metadata") or {}).get("name")
        spec = node.get("spec") or {}
        taints = [t for t in spec.get("taints") or [] if t.get("effect") in ("NoSchedule", "NoExecute")]
        if spec.get("unschedulable"):
            skipped[name] = "cordoned"
        elif condition(node, "Ready").get("status") != "True":
            skipped[name] = "not ready"
        elif taints:
            skipped[name] = "tainted %s" % ", ".join("%s=%s:%s" % (t.get("key"), t.get("value", ""), t.get("effect"))
                                                     for t in taints)
        else:
            res = {}
            for key, value in ((node.get("status") or {}).get("allocatable") or {}).items():
                try:
                    res[key] = int(str(value))
                except ValueError:
                    continue
            fit[name] = res
    return fit, skipped


def capacity_problems(nodes, pods, per_pod):
    """Can ``pods`` pods, each asking for ``per_pod`` (resource -> count), be placed on the schedulable Nodes?
    (First fit, one pod's resources on one node.)  Returns problems, each naming what is missing and the fix."""
    fit, skipped = allocatable(nodes)
    if not per_pod:
        return [] if fit else ["no schedulable, ready node in the cluster%s. Fix: add or uncordon a node" % (
            " (%s)" % ", ".join("%s: %s" % kv for kv in sorted(skipped.items())) if skipped else "")]
    problems = []
    for res, count in sorted(per_pod.items()):
        have = dict((n, r.get(res, 0)) for n, r in fit.items())
        if not any(have.values()):
            problems.append("no schedulable node has %s (the pods ask for %d each)%s. Fix: %s" % (
                res, count, " (%s)" % ", ".join("%s: %s" % kv for kv in sorted(skipped.items())) if skipped else "",
                "install the device plugin that provides it, or -e k8s_rdma_resource=<the name it uses>"
                if res != "nvidia.com/gpu" else "install NVIDIA's device plugin on the GPU nodes"))
    if problems:
        return problems
    free = dict((n, dict(r)) for n, r in fit.items())
    placed = 0
    for _pod in range(pods):
        for name in sorted(free):
            if all(free[name].get(res, 0) >= count for res, count in per_pod.items()):
                for res, count in per_pod.items():
                    free[name][res] -= count
                placed += 1
                break
    if placed < pods:
        return ["the cluster's schedulable nodes fit %d of the %d pods (each asks for %s; allocatable: %s). Fix: -e "
                "hosts= fewer nodes, fewer deepspeed_slots, or free the nodes" % (
                    placed, pods, ", ".join("%s=%d" % kv for kv in sorted(per_pod.items())),
                    "; ".join("%s: %s" % (n, ", ".join("%s=%d" % (res, fit[n].get(res, 0)) for res in sorted(per_pod)))
                              for n in sorted(fit)) or "none")]
    return []


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


class Api(object):
    """The few reads and deletes the watch makes, with the ``kubernetes`` client and the controller's kubeconfig
    (imported here, when a watch follows pods: nothing else needs the client)."""

    def __init__(self, kubeconfig=None, context=None, timeout=5):
        from kubernetes import client, config  # pylint: disable=import-outside-toplevel
        self.client = client
        self.api = config.new_client_from_config(config_file=kubeconfig, context=context)
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.timeout = timeout

    @staticmethod
    def _json(resp):
        import json  # pylint: disable=import-outside-toplevel
        return json.loads(resp.data)

    def pods(self, namespace, name):
        return self._json(self.core.list_namespaced_pod(namespace, label_selector="%s=%s" % (LABEL, name),
                                                        _preload_content=False,
                                                        _request_timeout=self.timeout)).get("items") or []

    def nodes(self):
        return self._json(self.core.list_node(_preload_content=False, _request_timeout=self.timeout)).get("items") or []

    def service(self, namespace, name):
        """The run's Service (the owner of its pods and Secret), or None."""
        try:
            return self._json(self.core.read_namespaced_service(name, namespace, _preload_content=False,
                                                                _request_timeout=self.timeout))
        except self.client.exceptions.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def events(self, namespace, name):
        return self._json(self.core.list_namespaced_event(
            namespace, field_selector="involvedObject.name=%s" % name, _preload_content=False,
            _request_timeout=self.timeout)).get("items") or []

    def delete_run(self, namespace, name):
        """The run's Service (the garbage collector deletes what it owns), then its pods and Secret at once; the
        ones that were there."""
        deleted = []
        pods = [p["metadata"]["name"] for p in self.pods(namespace, name)]
        calls = [("Service", name, self.core.delete_namespaced_service)]
        calls += [("Pod", pod, self.core.delete_namespaced_pod) for pod in pods]
        calls.append(("Secret", secret_name(name), self.core.delete_namespaced_secret))
        for kind, target, call in calls:
            try:
                call(target, namespace, propagation_policy="Background", _preload_content=False,
                     _request_timeout=self.timeout)
                deleted.append("%s/%s" % (kind, target))
            except self.client.exceptions.ApiException as exc:
                if exc.status != 404:
                    raise
        return deleted


def _api_failure(res):
    """The first line of why a registered kubernetes.core result failed, or None."""
    if not res or not res.get("failed"):
        return None
    msg = str(res.get("msg") or res.get("error") or "failed").strip()
    for key in ("reason", "status"):
        if res.get(key):
            msg = "%s (%s)" % (msg, res[key])
    return msg.splitlines()[0][:400]


def image_verdicts(opts, found, fingerprints):
    """The image's verdict from what ``image_registry`` read (``found``; skipped with ``k8s_image_check=false``):
    the registry holds the tag, and the stack its label names is the rank nodes' (``fingerprints``)."""
    if not opts.get("image_check") or not found or found.get("skipped"):
        return []
    ref = opts.get("image")
    named = "" if opts.get("image_name") in (None, "", "multinode-deepspeed") else " -e image_name=%s" % opts["image_name"]
    build = ("ansible-playbook image.yml -e image_registry=%s%s (it builds and pushes this stack's image)"
             % (opts.get("image_registry"), named) if opts.get("image_default") else
             "-e k8s_image=<an image the registry holds>, or leave k8s_image unset and run image.yml")
    out = {"check": "kubernetes image", "host": "kubernetes", "status": "fail", "fix": None}
    if found.get("error"):
        detail, _sep, fix = str(found.get("message") or found["error"]).partition(". Fix: ")
        out.update(detail="%s: %s" % (ref, detail), fix=(fix or build) + (
            "; or -e k8s_image_check=false for an image the nodes hold that no registry serves"))
        return [out]
    if not found.get("exists"):
        out.update(detail="the registry %s has no %s" % (found.get("registry"), ref), fix=build)
        return [out]
    wanted = sorted(set(fp for fp in (fingerprints or {}).values() if fp))
    label = (found.get("labels") or {}).get(image_registry.FINGERPRINT_LABEL)
    if not label:
        out.update(detail="%s has no stack label (%s): it was not built by image.yml" % (ref, image_registry.FINGERPRINT_LABEL),
                   fix="leave k8s_image unset and run image.yml, or -e k8s_image_check=false to run it unchecked")
        return [out]
    if wanted and label not in wanted:
        out.update(detail="%s holds stack %s, the rank nodes hold %s" % (ref, label, ", ".join(wanted)),
                   fix="leave k8s_image unset (image.yml's image of the nodes' stack), or run site.yml and "
                       "image.yml so that both are the same stack")
        return [out]
    out.update(status="pass", detail="%s is in the registry with stack %s" % (ref, label))
    return [out]


def preflight_verdicts(opts, extra, kubeconfig_found, namespace, nodes, claim=None, image=None, fingerprints=None):
    """The kubernetes backend's verdicts (``check``, ``host``, ``status``, ``detail``, ``fix``) from what the
    controller read with kubernetes.core.k8s_info: ``namespace`` (the Namespace), ``nodes`` (every Node),
    ``claim`` (the PersistentVolumeClaim, when the shared volume is one).  ``opts``: the plan's backend options;
    ``extra``: the backend's ``extra`` (``per_pod``, ``pods``)."""
    host = "kubernetes"
    out = []

    def verdict(check, ok, detail, fix=None):
        out.append({"check": check, "host": host, "status": "pass" if ok else "fail", "detail": detail,
                    "fix": None if ok else fix})

    config = opts.get("kubeconfig")
    if not kubeconfig_found:
        verdict("kubernetes api", False, "no kubeconfig at %s" % config,
                "-e k8s_kubeconfig=<the cluster's kubeconfig on the controller>, or export KUBECONFIG")
        return out
    failure = _api_failure(namespace)
    if failure:
        verdict("kubernetes api", False, "the API does not answer with %s%s: %s" % (
            config, " (context %s)" % opts["context"] if opts.get("context") else "", failure),
            "check the kubeconfig's server and credentials (-e k8s_kubeconfig=, -e k8s_context=)")
        return out
    verdict("kubernetes api", True, "answers with %s" % config)
    ns = opts.get("namespace")
    if not (namespace or {}).get("resources"):
        verdict("kubernetes namespace", False, "namespace %s does not exist" % ns,
                "-e k8s_namespace=<an existing namespace>, or create it: kubectl create namespace %s" % ns)
    else:
        verdict("kubernetes namespace", True, "namespace %s exists" % ns)
    failure = _api_failure(nodes)
    if failure:
        verdict("kubernetes capacity", False, "cannot list the nodes: %s" % failure,
                "give the kubeconfig's user the right to list nodes")
    else:
        problems = capacity_problems((nodes or {}).get("resources") or [], int(extra["pods"]), extra["per_pod"])
        want = ", ".join("%s=%d" % kv for kv in sorted(extra["per_pod"].items())) or "no extended resources"
        if problems:
            for problem in problems:
                detail, _sep, fix = problem.partition(". Fix: ")
                verdict("kubernetes capacity", False, detail, fix)
        else:
            verdict("kubernetes capacity", True, "%d pods of %s fit on the schedulable nodes" % (
                int(extra["pods"]), want))
    vol = opts.get("volume") or {}
    if vol.get("kind") == "pvc":
        failure = _api_failure(claim)
        found = (claim or {}).get("resources") or []
        if failure or not found:
            verdict("kubernetes volume", False, "claim %s is not in namespace %s%s" % (
                vol.get("claim"), ns, ": " + failure if failure else ""),
                "-e k8s_shared_volume=pvc:<an existing claim>, or create the claim")
        else:
            phase = (found[0].get("status") or {}).get("phase")
            verdict("kubernetes volume", phase == "Bound", "claim %s is %s" % (vol.get("claim"), phase or "unknown"),
                    "bind the claim to a volume (it is %s)" % phase)
    return out + image_verdicts(opts, image, fingerprints)


def leftovers(services, pods, now, grace=LEFTOVER_GRACE, keep=()):
    """``[{"name", "reason"}]``: the collection's run Services (``services``, from the API by the ``APP`` labels) that
    no controller follows any more, so that the next run in the namespace deletes them (their pods and Secret go
    with them, their owner): past the run's deadline (``DEADLINE_ANNOTATION``: a pod never scheduled has no kubelet
    deadline); every pod ended ``grace`` seconds ago; or no pod at all ``grace`` seconds after the Service was
    made (a start that died half way).  ``keep``: names never returned (the run about to start)."""
    by_run = {}
    for pod in pods or []:
        by_run.setdefault(((pod.get("metadata") or {}).get("labels") or {}).get(LABEL), []).append(pod)
    out = []
    for service in services or []:
        meta = service.get("metadata") or {}
        name, created = meta.get("name"), _time(meta.get("creationTimestamp"))
        if not name or name in keep or created is None:
            continue
        reason = _leftover_reason(meta, created, by_run.get(name) or [], now, grace)
        if reason:
            out.append({"name": name, "reason": reason})
    return out


def _leftover_reason(meta, created, pods, now, grace):
    deadline = str((meta.get("annotations") or {}).get(DEADLINE_ANNOTATION) or "")
    if deadline.isdigit() and int(deadline) and now > created + int(deadline):
        return "made %ds ago, past the run's deadline of %ss: no controller follows it" % (now - created, deadline)
    if not pods:
        return "no pod %ds after it was made" % (now - created) if now - created > grace else None
    ends = [_pod_end(pod) for pod in pods]
    if all(end is not None for end in ends) and now - max(ends) > grace:
        return "every pod ended %ds ago and nothing collected them" % (now - max(ends))
    return None


def _pod_end(pod):
    """When ``pod`` ended (its container's finish, else its last condition change), or None while it may still run."""
    status = pod.get("status") or {}
    if status.get("phase") not in ("Succeeded", "Failed"):
        return None
    finished = [_time(((c.get("state") or {}).get("terminated") or {}).get("finishedAt"))
                for c in status.get("containerStatuses") or []]
    finished += [_time(c.get("lastTransitionTime")) for c in status.get("conditions") or []]
    finished = [t for t in finished if t is not None]
    return max(finished) if finished else _time(status.get("startTime")) or 0.0
