# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kubernetes backend's pods, read back from the API: each pod's state as the run's record keeps it, why the
run's pods will not run (``pod_problems``, what the watch's follower stops the run for), and the runs a dead
controller left in a namespace (``leftovers``).

Pure Python, no Ansible import: unit-tested on the controller.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends.kubernetes.objects import DEADLINE_ANNOTATION, LABEL
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.kubernetes import condition

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


# Seconds a run's objects may stay once every pod ended (or before any pod exists) while its controller collects
# them; after that the next run in the namespace removes them.
LEFTOVER_GRACE = 120


def api_time(text):
    """An API timestamp (``2026-11-24T10:00:00Z``) -> seconds since the epoch, or None."""
    import calendar
    import time as _t
    try:
        return float(calendar.timegm(_t.strptime(str(text), "%Y-%m-%dT%H:%M:%SZ")))
    except (TypeError, ValueError):
        return None


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
            "unschedulable_since": api_time(condition(pod, "PodScheduled").get("lastTransitionTime"))}


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
        name, created = meta.get("name"), api_time(meta.get("creationTimestamp"))
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
    finished = [api_time(((c.get("state") or {}).get("terminated") or {}).get("finishedAt"))
                for c in status.get("containerStatuses") or []]
    finished += [api_time(c.get("lastTransitionTime")) for c in status.get("conditions") or []]
    finished = [t for t in finished if t is not None]
    return max(finished) if finished else api_time(status.get("startTime")) or 0.0
