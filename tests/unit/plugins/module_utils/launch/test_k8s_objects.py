"""The kubernetes backend's objects from the job plan (issue 14, WIP): names, the StatefulSet's pods, fabric modes,
volumes, and the checks."""
import datetime

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.launch import backends
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends.kubernetes import objects as k8s
from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import plan

NOW = datetime.datetime(2026, 11, 24, 2, 0, 0)


def workers(gpus=0, slots=(1, 1)):
    return dict(("worker%d" % (i + 1), {"slots": s, "gpus": gpus, "address": "10.89.0.1%d" % (i + 1),
                                        "memtotal_mb": 65536, "interface": "eth0", "env": {}})
                for i, s in enumerate(slots))


OPTS = {"namespace": "train", "image": "registry.local/mnds-node:1", "fabric": "tcp", "volume": {"kind": "pvc",
        "claim": "shared"}, "shm_size": "8Gi", "profile_env": {"NCCL_IB_DISABLE": "0", "NCCL_DEBUG": "WARN"}}


def test_names_are_dns_labels_and_distinct():
    assert k8s.object_name("e2e-run-1") == "mnds-e2e-run-1"
    a, b = k8s.object_name("Run_A.1"), k8s.object_name("run-a-1")
    assert a != b and k8s.DNS_LABEL_RE.fullmatch(a) and len(a) <= k8s.NAME_MAX
    long = k8s.object_name("x" * 128)
    assert len(long) <= k8s.NAME_MAX and k8s.DNS_LABEL_RE.fullmatch(long)


def test_one_service_and_one_pod_per_rank_node_that_ends_with_its_agent():
    job = plan({"run_id": "r1"}, workers(gpus=4, slots=(4, 4)), ["coord"], NOW, backends)
    service, pod0, pod1 = k8s.objects(job, OPTS)
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    # Bare pods, never restarted (issue 26, point 11): a pod whose agent ends gives its GPUs back.
    assert [pod0["kind"], pod0["metadata"]["name"], pod1["metadata"]["name"]] == ["Pod", "mnds-r1-0", "mnds-r1-1"]
    for index, obj in enumerate((pod0, pod1)):
        assert obj["spec"]["restartPolicy"] == "Never"
        # The stable name the master is reached at: <hostname>.<subdomain>.<namespace>.svc.<domain>.
        assert obj["spec"]["hostname"] == "mnds-r1-%d" % index and obj["spec"]["subdomain"] == "mnds-r1"
        assert obj["metadata"]["labels"][k8s.LABEL] == "mnds-r1" == service["spec"]["selector"][k8s.LABEL]
        assert obj["metadata"]["labels"][k8s.ORDINAL_LABEL] == str(index)
    pod = pod0["spec"]
    ranks = pod["containers"][0]
    assert ranks["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert ranks["command"][-4:] == ["multinode_ds.k8s", "pod", "--run-dir", job["run_dir"]]
    env = dict((e["name"], e.get("value")) for e in ranks["env"])
    assert env["MULTINODE_DS_K8S_MASTER"] == "mnds-r1-0.mnds-r1.train.svc.cluster.local"
    assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_SOCKET_IFNAME"] == "=eth0" and env["NCCL_DEBUG"] == "WARN"
    assert env["MULTINODE_DS_RUN_ID"] == "r1"
    volumes = dict((v["name"], v) for v in pod["volumes"])
    assert volumes["shared"]["persistentVolumeClaim"] == {"claimName": "shared"}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}


def test_rdma_mode():
    job = plan({"run_id": "r2"}, workers(gpus=8, slots=(8, 8)), ["coord"], NOW, backends)
    opts = dict(OPTS, fabric="rdma", rdma_resource="rdma/rdma_shared_device_a", host_network=True,
                interface="ib0", profile_env={"NCCL_IB_HCA": "mlx5_0:1", "NCCL_IB_GID_INDEX": "3"})
    pod = k8s.objects(job, opts)[1]["spec"]
    ranks = pod["containers"][0]
    assert ranks["resources"]["limits"] == {"nvidia.com/gpu": "8", "rdma/rdma_shared_device_a": "1"}
    assert ranks["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    env = dict((e["name"], e.get("value")) for e in ranks["env"])
    assert env["NCCL_IB_HCA"] == "mlx5_0:1" and env["NCCL_IB_GID_INDEX"] == "3" and "NCCL_IB_DISABLE" not in env


@pytest.mark.parametrize("text,expected", [
    ("pvc:shared", {"kind": "pvc", "claim": "shared"}),
    ("nfs:10.0.0.5:/export/shared", {"kind": "nfs", "server": "10.0.0.5", "path": "/export/shared"}),
    ("hostPath:/srv/shared", {"kind": "hostPath", "path": "/srv/shared"}),
    ("/srv/shared", {"kind": "hostPath", "path": "/srv/shared"}),
    ("", {"kind": "hostPath"}),
])
def test_shared_volume_forms(text, expected):
    assert k8s.parse_volume(text) == expected


@pytest.mark.parametrize("opts,needle", [
    ({"namespace": "Train"}, "k8s_namespace='Train' is not a namespace name"),
    ({"fabric": "ib"}, "k8s_fabric='ib' is not a fabric mode"),
    ({"fabric": "rdma", "rdma_resource": "bad resource"}, "k8s_rdma_resource='bad resource'"),
    ({"image": ""}, "k8s_image is not set"),
    ({"volume": {"kind": "nfs", "server": "", "path": "x"}}, "needs a server and an absolute path"),
    ({"volume": {"kind": "s3"}}, "kind 's3' is not one of"),
])
def test_checks_name_the_variable_and_the_fix(opts, needle):
    job = plan({"run_id": "r3"}, workers(), ["coord"], NOW, backends)
    problems = k8s.check(job, dict(OPTS, **opts))
    assert any(needle in p and "Fix:" in p for p in problems), problems


def test_every_pod_gets_the_same_resources():
    job = plan({"run_id": "r4"}, workers(slots=(1, 2)), ["coord"], NOW, backends)
    assert any("the same deepspeed_slots on every node" in p for p in k8s.check(job, OPTS))


def test_the_backend_plans_pods_with_their_agents_and_pod_zero_as_master():
    import json as _json
    job = plan({"run_id": "r5", "backend": "kubernetes", "k8s_image": "mnds-node:local", "k8s_namespace": "train",
                "k8s_shared_volume": "pvc:shared"}, workers(gpus=2, slots=(2, 2)), ["coord"], NOW, backends)
    launch = job["launch"]
    assert launch["launchers"] == ["worker1", "worker2"]
    argv = launch["argv"]["worker2"]
    assert argv[argv.index("--master_addr") + 1] == "mnds-r5-0.mnds-r5.train.svc.cluster.local"
    assert argv[argv.index("--node_rank") + 1] == "1" and "deepspeed.launcher.launch" in argv
    agents = _json.loads(launch["files"]["k8s/agents.json"])
    assert len(agents) == 2 and agents[1][agents[1].index("--host") + 1] == "worker2"
    objects = _json.loads(launch["files"]["k8s/objects.json"])
    assert [o["kind"] for o in objects] == ["Service", "Pod", "Pod"]
    assert launch["start"] is True


def test_k8s_apply_false_is_a_handoff():
    job = plan({"run_id": "r6", "backend": "kubernetes", "k8s_image": "mnds-node:local", "k8s_apply": "false"},
               workers(), ["coord"], NOW, backends)
    assert job["launch"]["start"] is False and "kubectl apply -f" in job["launch"]["handoff"]


def test_a_missing_image_fails_the_plan():
    from ansible_collections.multinode.deepspeed.plugins.module_utils.plan.job import JobError
    with pytest.raises(JobError, match="k8s_image is not set"):
        plan({"run_id": "r7", "backend": "kubernetes"}, workers(), ["coord"], NOW, backends)


def test_the_service_owns_the_pods_and_the_secret():
    """Issue 26, point 11: the play puts this on the pods and the Secret, with the Service's uid once it exists."""
    owner = {"apiVersion": "v1", "kind": "Service", "name": "mnds-r1", "uid": "u-1"}
    assert k8s.owner_reference("mnds-r1", "u-1") == owner
    job = plan({"run_id": "r8", "backend": "kubernetes", "k8s_image": "mnds-node:local"}, workers(), ["coord"], NOW, backends)
    assert job["launch"]["extra"]["owner"] == {"apiVersion": "v1", "kind": "Service", "name": "mnds-r8", "uid": None}
