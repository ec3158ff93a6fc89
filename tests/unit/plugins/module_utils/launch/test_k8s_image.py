"""The kubernetes backend's image (issue 24): with k8s_image unset, image.yml's image of the rank nodes' stack in
image_registry; the preflight's verdict from what the registry says (the tag, the stack label), each failure with
its fix."""
import datetime

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import registry
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends, k8s
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import JobError, plan

NOW = datetime.datetime(2026, 11, 26, 2, 0, 0)
FP = "d312f27811669737"
REF = "127.0.0.1:5000/multinode-deepspeed:" + FP


def workers(fingerprints=(FP, FP)):
    return dict(("worker%d" % (i + 1), {"slots": 1, "gpus": 0, "address": "10.89.0.1%d" % (i + 1),
                                        "memtotal_mb": 65536, "interface": "eth0", "env": {},
                                        "stack_fingerprint": fp})
                for i, fp in enumerate(fingerprints))


def test_the_default_image_is_the_rank_nodes_stack_in_the_registry():
    job = plan({"run_id": "i1", "backend": "kubernetes", "image_registry": "127.0.0.1:5000"}, workers(), ["c"], NOW, backends)
    opts = job["backend_options"]
    assert opts["image"] == REF and opts["image_default"] and opts["image_check"]
    pods = [o for o in k8s.objects(job, opts) if o["kind"] == "Pod"]
    assert [p["spec"]["containers"][0]["image"] for p in pods] == [REF, REF]
    assert job["stack_fingerprints"] == {"worker1": FP, "worker2": FP}


def test_a_given_image_is_used_as_given():
    job = plan({"run_id": "i2", "backend": "kubernetes", "k8s_image": "reg.local/mine:1", "image_registry": "r:1",
                "k8s_image_check": "false"}, workers(), ["c"], NOW, backends)
    assert job["backend_options"]["image"] == "reg.local/mine:1" and not job["backend_options"]["image_check"]


@pytest.mark.parametrize("settings, fingerprints, words", [
    ({}, (FP, FP), ["k8s_image is not set and image_registry is not set either", "image.yml"]),
    ({"image_registry": "127.0.0.1:5000"}, (FP, None), ["the stack of worker2 is unknown", "site.yml"]),
    ({"image_registry": "127.0.0.1:5000"}, (FP, "0" * 16), ["the rank nodes hold different stacks"]),
])
def test_no_default_image_names_the_fix(settings, fingerprints, words):
    with pytest.raises(JobError) as err:
        plan(dict({"run_id": "i3", "backend": "kubernetes"}, **settings), workers(fingerprints), ["c"], NOW, backends)
    for word in words:
        assert word in str(err.value)
    assert str(err.value).count("k8s_image is not set") <= 1


def found(**over):
    out = {"image": REF, "registry": "127.0.0.1:5000", "reachable": True, "exists": True, "error": None,
           "message": None, "labels": {registry.FINGERPRINT_LABEL: FP}}
    out.update(over)
    return out


OPTS = {"image": REF, "image_default": True, "image_check": True, "image_registry": "127.0.0.1:5000"}
NODES = {"worker1": FP, "worker2": FP}


def test_the_image_passes_when_the_registry_holds_it_with_the_nodes_stack():
    [v] = k8s.image_verdicts(OPTS, found(), NODES)
    assert v["status"] == "pass" and FP in v["detail"]


@pytest.mark.parametrize("answer, opts, words", [
    (found(exists=False, labels={}), OPTS, ["the registry 127.0.0.1:5000 has no " + REF,
                                            "ansible-playbook image.yml -e image_registry=127.0.0.1:5000"]),
    (found(labels={registry.FINGERPRINT_LABEL: "0" * 16}), dict(OPTS, image_default=False),
     ["holds stack 0000000000000000, the rank nodes hold " + FP, "leave k8s_image unset"]),
    (found(labels={}), dict(OPTS, image_default=False), ["has no stack label", "k8s_image_check=false"]),
    (found(reachable=False, exists=False, error="unreachable",
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
    assert k8s.image_verdicts(dict(OPTS, image_check=False), found(), NODES) == []
    assert k8s.image_verdicts(OPTS, {"skipped": True, "changed": False}, NODES) == []
