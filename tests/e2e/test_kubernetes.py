"""The kubernetes backend against a real control plane (issue 14): etcd, kube-apiserver, kube-controller-manager
and kube-scheduler v1.20.2 built from Debian's source package by scripts/k8s-local, on loopback.

What runs for real: train.yml plans the job, checks the cluster through the API, creates the run's headless
Service and pods with kubernetes.core.k8s; the apiserver validates them; the controller-manager.s garbage collector deletes
what the Service owns when it goes; the scheduler places the pods by their GPU (and RDMA) requests; the watch follows them; the finish step
writes the run's record and deletes the objects.  What the test stands in for: the nodes.  They have no kubelet
(``scripts/k8s-local node``: the test gives their capacity and keeps them reporting Ready), so the pods are
placed but never run; the test then stops the nodes' reports, as a node that dies would, and the run must stop
at once naming the node.  docs/kubernetes.md says what a real kubelet on this machine did."""
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from e2e_nodes import K8S, KUBECONFIG, k8s_build, k8s_exists, k8s_local, k8s_read, node_name, on_coord, start_train

pytestmark = [pytest.mark.e2e, pytest.mark.k8s]
# The pods here are placed but never run (no kubelet): an image name no registry serves, its check off.
IMAGE = ["-e", "k8s_image=mnds-node:local", "-e", "k8s_image_check=false"]
ROOT = Path(__file__).resolve().parents[2]
CUDA = ["-e", "deepspeed_accelerator=cuda", "-e", "deepspeed_gpu_count=2", "-e", "deepspeed_slots=2"]  # what the plan asks of the pods


@pytest.fixture(scope="module")
def api(provisioned):
    """The control plane, built once (cached in ~/.cache/multinode-deepspeed/dev/k8s/bin) and started for this module."""
    t0 = time.time()
    res = k8s_build()
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    print(f"k8s-local build: {time.time() - t0:.0f}s ({res.stdout.strip().splitlines()[-1:]})")
    res = k8s_local("up", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    print(res.stdout.strip().splitlines()[-1])
    from kubernetes import client, config  # pylint: disable=import-outside-toplevel
    api_client = config.new_client_from_config(str(KUBECONFIG))
    core = client.CoreV1Api(api_client)
    core.create_namespace({"metadata": {"name": "train"}}, _preload_content=False)
    yield {"core": core, "apps": client.AppsV1Api(api_client), "exc": client.exceptions.ApiException}
    k8s_local("down", timeout=60)


class FakeNodes(object):
    """Nodes with the given capacity, reporting Ready until ``stop`` (scripts/k8s-local node)."""

    def __init__(self, names, resources):
        self.names = list(names)
        argv = [str(K8S), "node", *names] + [a for r in resources for a in ("--resource", r)]
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert "ready with" in self.proc.stdout.readline()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@pytest.fixture
def nodes(api):
    made = []

    def make(*names, resources=("nvidia.com/gpu=2",)):
        made.append(FakeNodes(names, resources))
        # A node that joins carries the not-ready taint until the node controller has seen it Ready (a second or
        # two): wait for that, as a real node's first pods do.
        deadline = time.time() + 60
        while time.time() < deadline:
            taints = [t for n in names for t in (k8s_read(api["core"].read_node, n)["spec"].get("taints") or [])]
            if not taints:
                break
            time.sleep(0.5)
        assert not taints, taints
        return made[-1]

    yield make
    for fake in made:
        fake.stop()
        # Pods bound to a node with no kubelet stay Terminating after their Service goes: remove them, then
        # the nodes.
        for ns in ("default", "train"):
            for pod in json.loads(api["core"].list_namespaced_pod(ns, _preload_content=False).data)["items"]:
                api["core"].delete_namespaced_pod(pod["metadata"]["name"], ns, grace_period_seconds=0,
                                                  _preload_content=False)
        k8s_local("unnode", *fake.names, timeout=30)


def bound_pods(api, name, ns, count, seconds=180):
    """The run's pods once the scheduler placed ``count`` of them."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        pods = k8s_read(api["core"].list_namespaced_pod, ns)["items"]
        pods = [p for p in pods if p["metadata"]["name"].startswith(name + "-") and p["spec"].get("nodeName")]
        if len(pods) == count:
            return sorted(pods, key=lambda p: p["metadata"]["name"])
        time.sleep(1)
    return None


def pods_of(api, name, ns, alive=False):
    """The names of the run's pods that are still there (``alive``: and not being deleted)."""
    return [p["metadata"]["name"] for p in k8s_read(api["core"].list_namespaced_pod, ns)["items"]
            if p["metadata"]["name"].startswith(name + "-") and not (alive and p["metadata"].get("deletionTimestamp"))]


def train(args, name):
    proc, out, log = start_train(["-e", "backend=kubernetes", *IMAGE,
                                  "-e", f"k8s_kubeconfig={KUBECONFIG}", "-e", "preflight=false", *CUDA, *args], name)
    return proc, out, log


def finish(proc, out, seconds):
    try:
        rc = proc.wait(seconds)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rc = None
    out.close()
    return rc


@pytest.mark.parametrize("fabric", ["tcp", "rdma"])
def test_a_run_is_created_placed_followed_collected_and_deleted(api, nodes, fabric):
    ns = "default" if fabric == "tcp" else "train"
    resources = ("nvidia.com/gpu=2",) + (("rdma/hca_shared=1",) if fabric == "rdma" else ())
    fake = nodes("gpu-a", "gpu-b", resources=resources)
    run_id = f"e2e-k8s-{fabric}-{int(time.time())}"
    name = f"mnds-{run_id}"
    extra = ["-e", f"k8s_namespace={ns}"] + (["-e", "k8s_fabric=rdma", "-e", "k8s_rdma_resource=rdma/hca_shared",
                                              "-e", "k8s_host_network=true"] if fabric == "rdma" else [])
    proc, out, log = train(["-e", f"run_id={run_id}", "-e", "steps=5", *extra], f"k8s-{fabric}")
    try:
        pods = bound_pods(api, name, ns, 2)
        assert pods, "the scheduler did not place both pods: " + log.read_text()[-3000:]
        # What the real apiserver stored, and where the real scheduler put it.
        service = k8s_read(api["core"].read_namespaced_service, name, ns)
        assert service["spec"]["clusterIP"] == "None"
        # Issue 26: bare pods that end with their agent, owned by the Service, hardened.
        for index, pod in enumerate(pods):
            assert pod["metadata"]["name"] == f"{name}-{index}" and pod["spec"]["restartPolicy"] == "Never"
            assert pod["spec"]["hostname"] == f"{name}-{index}" and pod["spec"]["subdomain"] == name
            assert [(o["kind"], o["name"], o["uid"]) for o in pod["metadata"]["ownerReferences"]] == [
                ("Service", name, service["metadata"]["uid"])]
            assert pod["spec"]["automountServiceAccountToken"] is False
            ctx = pod["spec"]["containers"][0]["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False and ctx["capabilities"]["drop"] == ["ALL"]
            assert not any("serviceaccount" in m["mountPath"] for m in pod["spec"]["containers"][0]["volumeMounts"])
        assert sorted(p["spec"]["nodeName"] for p in pods) == ["gpu-a", "gpu-b"]  # one pod per 2-GPU node
        ranks = pods[0]["spec"]["containers"][0]
        env = dict((e["name"], e.get("value")) for e in ranks["env"])
        assert env["MULTINODE_DS_K8S_MASTER"] == f"{name}-0.{name}.{ns}.svc.cluster.local"
        if fabric == "tcp":
            assert ranks["resources"]["limits"] == {"nvidia.com/gpu": "2"}
            assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_SOCKET_IFNAME"] == "=eth0"
        else:
            assert ranks["resources"]["limits"] == {"nvidia.com/gpu": "2", "rdma/hca_shared": "1"}
            assert ranks["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
            assert pods[0]["spec"]["hostNetwork"] is True and "NCCL_IB_DISABLE" not in env
        # The nodes die: their reports stop.  The run must stop naming them, and its objects go.
        fake.stop()
        t0 = time.time()
        rc = finish(proc, out, 120)
        took = time.time() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    print(f"{fabric}: the play ended {took:.1f}s after the nodes stopped reporting")
    assert rc == 2, text[-3000:]
    # The first node noticed stops the run (the other may be noticed in the same poll).
    assert re.search(r"on node gpu-[ab]: node gpu-[ab] is not ready \(Ready=Unknown", text), text[-3000:]
    assert re.search(r"Lost first: worker[12]", text), text[-3000:]
    assert took < 60
    run = ROOT / "runs" / run_id
    manifests = json.loads((run / "k8s" / "objects.json").read_text())
    assert [o["kind"] for o in manifests] == ["Service", "Pod", "Pod"]
    record = json.loads((run / "k8s" / "pods.json").read_text())
    assert sorted(p["node"] for p in record["pods"]) == ["gpu-a", "gpu-b"]
    assert not k8s_exists(api, "Service", name, ns)


def test_ctrl_c_deletes_the_runs_objects(api, nodes):
    nodes("gpu-a", "gpu-b")
    run_id = f"e2e-k8s-ctrlc-{int(time.time())}"
    name = f"mnds-{run_id}"
    proc, out, log = train(["-e", f"run_id={run_id}", "-e", "steps=5", "-e", "k8s_keep=false"], "k8s-ctrl-c")
    try:
        assert bound_pods(api, name, "default", 2), log.read_text()[-3000:]
        time.sleep(4)  # the watch is following them
        os.killpg(proc.pid, signal.SIGINT)
        t0 = time.time()
        finish(proc, out, 60)
        took = time.time() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # The watch's worker deletes them (Ansible's main process may have ended already, its output with it).
    gone = None
    while time.time() - t0 < 15:
        # Pods on nodes with no kubelet stay Terminating: deleted is what the API can say of them.
        if not k8s_exists(api, "Service", name, "default") and not pods_of(api, name, "default", alive=True):
            gone = time.time() - t0
            break
        time.sleep(0.5)
    print(f"Ctrl-C: the play ended in {took:.1f}s, the run's objects were gone after {gone}s")
    assert gone is not None, log.read_text()[-3000:]


def test_bad_inputs_fail_before_anything_is_created(api, nodes, run_playbook):
    nodes("gpu-a", "gpu-b")
    cases = [
        ("no-kubeconfig", ["-e", "k8s_kubeconfig=/nonexistent/kubeconfig"],
         "kubernetes api: no kubeconfig at /nonexistent/kubeconfig. Fix: -e k8s_kubeconfig="),
        ("no-namespace", ["-e", "k8s_namespace=nope"],
         "kubernetes namespace: namespace nope does not exist. Fix: -e k8s_namespace=<an existing namespace>, or "
         "create it: kubectl create namespace nope"),
        ("too-many-gpus", ["-e", "deepspeed_gpu_count=4", "-e", "deepspeed_slots=4"],
         "kubernetes capacity: the cluster's schedulable nodes fit 0 of the 2 pods (each asks for nvidia.com/gpu=4"),
        ("rdma-without-resource", ["-e", "k8s_fabric=rdma"],
         "kubernetes capacity: no schedulable node has rdma/rdma_shared_device_a (the pods ask for 1 each)"),
    ]
    for label, args, expect in cases:
        run_id = f"e2e-k8s-bad-{label}-{int(time.time())}"
        res = run_playbook("train.yml", "-e", "backend=kubernetes", *IMAGE,
                           "-e", f"k8s_kubeconfig={KUBECONFIG}", "-e", "preflight=false", *CUDA,
                           "-e", f"run_id={run_id}", *args, name=f"k8s-bad-{label}")
        assert res.rc == 2, (label, res.tail())
        flat = " ".join(res.out.split())
        assert "nothing was created" in flat and expect in flat, (label, res.tail())
        for ns in ("default", "train", "nope"):
            assert not k8s_exists(api, "Service", f"mnds-{run_id}", ns), label
    # The same capacity problem through preflight: its report has the verdict, and nothing is created.
    run_id = f"e2e-k8s-bad-preflight-{int(time.time())}"
    res = run_playbook("train.yml", "-e", "backend=kubernetes", *IMAGE,
                       "-e", f"k8s_kubeconfig={KUBECONFIG}", "-e", "preflight=force", *CUDA,
                       "-e", "deepspeed_gpu_count=4", "-e", "deepspeed_slots=4", "-e", f"run_id={run_id}",
                       name="k8s-bad-preflight")
    assert res.rc == 2, res.tail()
    report = json.loads((ROOT / "runs" / run_id / "preflight.json").read_text())
    failed = [v for v in report["verdicts"] if v["status"] == "fail"]
    assert any(v["check"] == "kubernetes capacity" and "fit 0 of the 2 pods" in v["detail"] for v in failed), failed
    assert not k8s_exists(api, "Service", f"mnds-{run_id}", "default")


def test_a_refused_start_deletes_what_it_created(api, nodes):
    """Issue 26, point 11: the apiserver refuses the pods after the Service and the Secret exist (a quota of 0 pods
    in the namespace): the start step deletes both, then fails with the apiserver's words."""
    nodes("gpu-a", "gpu-b")
    ns = "quota"
    from kubernetes import client  # pylint: disable=import-outside-toplevel
    try:
        api["core"].create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    except api["exc"] as exc:
        assert exc.status == 409, exc
    quota = client.V1ResourceQuota(metadata=client.V1ObjectMeta(name="no-pods"),
                                   spec=client.V1ResourceQuotaSpec(hard={"pods": "0"}))
    try:
        api["core"].create_namespaced_resource_quota(ns, quota)
    except api["exc"] as exc:
        assert exc.status == 409, exc
    run_id = f"e2e-k8s-refused-{int(time.time())}"
    name = f"mnds-{run_id}"
    proc, out, log = train(["-e", f"run_id={run_id}", "-e", f"k8s_namespace={ns}",
                            "-e", '{"secret_env": {"E2E_SECRET": "x"}}'], "k8s-refused")
    try:
        rc = finish(proc, out, 180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    flat = " ".join(text.split())
    assert rc == 2, text[-3000:]
    assert "The cluster refused the run's objects (what was created is deleted)" in flat, text[-3000:]
    assert "exceeded quota" in flat or "forbidden" in flat, text[-3000:]
    assert "Delete what the failed start created" in text, text[-3000:]
    assert not k8s_exists(api, "Service", name, ns) and not k8s_exists(api, "Secret", name + "-secrets", ns)
    assert not pods_of(api, name, ns)
    # The run is marked aborted, so its checkpoint directory is free for the next run.
    assert "refused" in on_coord(f"cat /shared/runs/{run_id}/control/ABORT").stdout


def test_k8s_apply_false_writes_the_manifests_only(api, run_playbook):
    run_id = f"e2e-k8s-manifests-{int(time.time())}"
    res = run_playbook("train.yml", "-e", "backend=kubernetes", *IMAGE,
                       "-e", f"k8s_kubeconfig={KUBECONFIG}", "-e", "preflight=false", *CUDA,
                       "-e", "k8s_apply=false", "-e", f"run_id={run_id}", name="k8s-manifests")
    assert res.rc == 0, res.tail()
    assert "k8s_apply=false" in res.out and "kubectl apply -f" in res.out
    assert not k8s_exists(api, "Service", f"mnds-{run_id}", "default")
    # What the user would apply is accepted as is by the real apiserver (a server-side dry run).
    listing = subprocess.run(["podman", "exec", node_name("coord"), "cat", f"/shared/runs/{run_id}/k8s/objects.json"],
                             env={"CONTAINERS_CONF": str(ROOT / ".cache/podman/containers.conf"),
                                  "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True)
    service, *pods = json.loads(listing.stdout)
    assert [p["kind"] for p in pods] == ["Pod", "Pod"]
    api["core"].create_namespaced_service("default", service, dry_run="All", _preload_content=False)
    for pod in pods:
        api["core"].create_namespaced_pod("default", pod, dry_run="All", _preload_content=False)
