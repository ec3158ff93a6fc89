# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Preflight of the kubernetes backend: does the cluster take the planned run?

The verdicts (``check``, ``host``, ``status``, ``detail``, ``fix``) from what the controller read with
kubernetes.core.k8s_info and ``image_registry``: the API answers with the kubeconfig, the namespace exists, the
schedulable, ready nodes have room for every pod (GPUs, the RDMA resource), the shared volume's claim is bound, and
the registry holds the image with the rank nodes' stack.  Each failed verdict names what is missing and the fix.

Pure Python, no Ansible import: unit-tested on the controller.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import registry as image_registry


def condition(obj, kind):
    """The ``kind`` condition of a pod's or node's status (a dict), or {}."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond
    return {}


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


def api_failure(res):
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
    failure = api_failure(namespace)
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
    failure = api_failure(nodes)
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
        failure = api_failure(claim)
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
