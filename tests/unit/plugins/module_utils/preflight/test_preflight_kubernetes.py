"""Preflight's verdicts on the kubernetes backend's cluster (module_utils/preflight/kubernetes.py): from objects a
real kube-apiserver (v1.20.2, scripts/k8s-local) returned, nodes with GPUs, the capacity for the pods and what is
missing, each with its fix; and the image's verdict from what the registry says (issue 24: the tag, the stack
label)."""
import copy

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight import kubernetes as k8s
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import registry

from tests.unit.plugins.module_utils.k8s_cluster import gpu_job, ready_nodes


def test_capacity_counts_only_ready_untainted_uncordoned_nodes():
    nodes = ready_nodes()
    fit, skipped = k8s.allocatable(nodes)
    assert sorted(fit) == ["fake-c", "fake-d"] and fit["fake-c"]["nvidia.com/gpu"] == 2
    assert skipped["fake-a"] == "not ready"
    assert k8s.capacity_problems(nodes, 2, {"nvidia.com/gpu": 2}) == []
    (msg,) = k8s.capacity_problems(nodes, 3, {"nvidia.com/gpu": 2})
    assert msg.startswith("the cluster's schedulable nodes fit 2 of the 3 pods") and "fake-c: nvidia.com/gpu=2" in msg
    (msg,) = k8s.capacity_problems(nodes, 1, {"nvidia.com/gpu": 4})
    assert "fit 0 of the 1 pods" in msg
    (msg,) = k8s.capacity_problems(nodes, 2, {"nvidia.com/gpu": 2, "rdma/hca": 1})
    assert msg.startswith("no schedulable node has rdma/hca") and "k8s_rdma_resource" in msg
    cordoned = copy.deepcopy(nodes)
    for node in cordoned:
        node["spec"]["unschedulable"] = True
    (msg,) = k8s.capacity_problems(cordoned, 1, {})
    assert "no schedulable, ready node" in msg and "fake-c: cordoned" in msg


def found(*resources):
    return {"changed": False, "api_found": True, "resources": list(resources)}


def test_preflight_verdicts_name_what_is_missing_and_the_fix():
    job = gpu_job()
    opts, extra = job["backend_options"], job["launch"]["extra"]
    nodes = found(*ready_nodes())
    ns = found({"metadata": {"name": "default"}})
    verdicts = k8s.preflight_verdicts(opts, extra, True, ns, nodes)
    assert [(v["check"], v["status"]) for v in verdicts] == [
        ("kubernetes api", "pass"), ("kubernetes namespace", "pass"), ("kubernetes capacity", "pass")]
    (v,) = k8s.preflight_verdicts(opts, extra, False, None, None)
    assert v["status"] == "fail" and "no kubeconfig at /k/config" in v["detail"] and "KUBECONFIG" in v["fix"]
    down = {"failed": True, "msg": "Failed to get client due to HTTPSConnectionPool(host='127.0.0.1', port=1): "
            "Max retries exceeded"}
    (v,) = k8s.preflight_verdicts(opts, extra, True, down, None)
    assert v["check"] == "kubernetes api" and "does not answer" in v["detail"] and "Max retries" in v["detail"]
    verdicts = k8s.preflight_verdicts(dict(opts, namespace="nope"), extra, True, found(), nodes)
    assert verdicts[1]["status"] == "fail" and "kubectl create namespace nope" in verdicts[1]["fix"]
    big = gpu_job(slots=(2, 2, 2))
    verdicts = k8s.preflight_verdicts(big["backend_options"], big["launch"]["extra"], True, ns, nodes)
    assert verdicts[2]["status"] == "fail" and "fit 2 of the 3 pods" in verdicts[2]["detail"]
    assert verdicts[2]["fix"].startswith("-e hosts= fewer nodes")
    rdma = gpu_job(k8s_fabric="rdma", k8s_rdma_resource="rdma/hca_shared")
    verdicts = k8s.preflight_verdicts(rdma["backend_options"], rdma["launch"]["extra"], True, ns, nodes)
    assert verdicts[2]["status"] == "fail" and "no schedulable node has rdma/hca_shared" in verdicts[2]["detail"]
    claim = gpu_job(k8s_shared_volume="pvc:shared")
    verdicts = k8s.preflight_verdicts(claim["backend_options"], claim["launch"]["extra"], True, ns, nodes, found())
    assert verdicts[-1]["status"] == "fail" and "claim shared is not in namespace default" in verdicts[-1]["detail"]
    bound = found({"metadata": {"name": "shared"}, "status": {"phase": "Bound"}})
    verdicts = k8s.preflight_verdicts(claim["backend_options"], claim["launch"]["extra"], True, ns, nodes, bound)
    assert verdicts[-1]["status"] == "pass"


# The image (issue 24).
FP = "d312f27811669737"
REF = "127.0.0.1:5000/multinode-deepspeed:" + FP


def image_found(**over):
    out = {"image": REF, "registry": "127.0.0.1:5000", "reachable": True, "exists": True, "error": None,
           "message": None, "labels": {registry.FINGERPRINT_LABEL: FP}}
    out.update(over)
    return out


OPTS = {"image": REF, "image_default": True, "image_check": True, "image_registry": "127.0.0.1:5000"}
NODES = {"worker1": FP, "worker2": FP}


def test_the_image_passes_when_the_registry_holds_it_with_the_nodes_stack():
    [v] = k8s.image_verdicts(OPTS, image_found(), NODES)
    assert v["status"] == "pass" and FP in v["detail"]


@pytest.mark.parametrize("answer, opts, words", [
    (image_found(exists=False, labels={}), OPTS, ["the registry 127.0.0.1:5000 has no " + REF,
                                                  "ansible-playbook image.yml -e image_registry=127.0.0.1:5000"]),
    (image_found(labels={registry.FINGERPRINT_LABEL: "0" * 16}), dict(OPTS, image_default=False),
     ["holds stack 0000000000000000, the rank nodes hold " + FP, "leave k8s_image unset"]),
    (image_found(labels={}), dict(OPTS, image_default=False), ["has no stack label", "k8s_image_check=false"]),
    (image_found(reachable=False, exists=False, error="unreachable",
                 message="the registry 127.0.0.1:5000 cannot be reached: refused. Fix: start it"), OPTS,
     ["cannot be reached", "start it", "k8s_image_check=false"]),
])
def test_a_wrong_image_is_refused_with_the_fix(answer, opts, words):
    [v] = k8s.image_verdicts(opts, answer, NODES)
    assert v["status"] == "fail", v
    text = v["detail"] + " Fix: " + v["fix"]
    for word in words:
        assert word in text, text


def test_no_check_no_verdict():
    assert k8s.image_verdicts(dict(OPTS, image_check=False), image_found(), NODES) == []
    assert k8s.image_verdicts(OPTS, {"skipped": True, "changed": False}, NODES) == []
