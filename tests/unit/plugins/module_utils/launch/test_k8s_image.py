"""The kubernetes backend's image (issue 24): with k8s_image unset, image.yml's image of the rank nodes' stack in
image_registry.  The preflight's verdict from what the registry says (the tag, the stack label), each failure with
its fix: preflight/test_preflight_kubernetes.py."""
import datetime

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends.kubernetes import objects as k8s
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
