"""The kubernetes backend with real pods (issue 14): train.yml trains llama-tiny across two pods that a real
kubelet (v1.20.2, built by scripts/k8s-local) runs with containerd on this machine.

What runs for real: the control plane (scripts/k8s-local up); the node (``scripts/k8s-local kubelet up``:
containerd, runc and the CNI plugins from Debian's packages, the kubelet, a CNI bridge, and the cluster DNS that
resolves pod 0's stable name for pod 1); the image (the provisioned worker, committed with podman and imported into
the node's containerd); the run (the pods mount the podman volume the cluster's nodes share at /shared, so the
coordinator's watch reads their heartbeats and metrics as on any other backend); the pods' logs, read through the
apiserver from the kubelet.  Nothing is stood in for."""
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from e2e_nodes import K8S, KUBECONFIG, k8s_exists, k8s_local, k8s_read, load_summary, podman, start_train

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / ".cache" / "k8s" / "images"
IMAGE = "localhost/mnds-node:provisioned"
NODE_PROCESSES = ("containerd", "containerd-shim", "kubelet")


def node_processes():
    """The node's processes still running (by their program's name): containerd, shims, kubelet."""
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            exe = (proc / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if os.path.basename(exe).startswith(NODE_PROCESSES):
            out.append("%s %s" % (proc.name, exe))
    return out


def volume_path():
    res = podman("volume", "inspect", "mnds-shared", "--format", "{{.Mountpoint}}")
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


@pytest.fixture(scope="module")
def node(provisioned):
    """The control plane and a real node on this machine, with the provisioned worker's image on it."""
    assert not node_processes(), "a containerd or kubelet is already running: %s" % node_processes()
    res = k8s_local("build")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    res = k8s_local("up", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    timings = {}
    try:
        t0 = time.time()
        res = k8s_local("kubelet", "up", timeout=600)
        timings["kubelet up"] = time.time() - t0
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        print(res.stdout.strip().splitlines()[-1])
        # The image: the provisioned worker (the stack's venv and multinode_ds at the path the plan names).
        t0 = time.time()
        res = podman("commit", "-q", "mnds-worker1", IMAGE, timeout=600)
        assert res.returncode == 0, res.stderr
        IMAGES.mkdir(parents=True, exist_ok=True)
        tar = IMAGES / "mnds-node-provisioned.tar"
        if tar.exists():
            tar.unlink()
        res = podman("save", "-q", "--format", "docker-archive", "-o", str(tar), IMAGE, timeout=600)
        assert res.returncode == 0, res.stderr
        timings["image commit+save"] = time.time() - t0
        t0 = time.time()
        res = k8s_local("kubelet", "import", str(tar), timeout=600)
        assert res.returncode == 0, res.stdout + res.stderr
        timings["image import"] = time.time() - t0
        tar.unlink()
        # containerd has its own copy now: podman's (2.4 GB) would be left dangling by the next commit.
        podman("rmi", "-f", IMAGE, timeout=120)
        from kubernetes import client, config  # pylint: disable=import-outside-toplevel
        api_client = config.new_client_from_config(str(KUBECONFIG))
        yield {"core": client.CoreV1Api(api_client), "apps": client.AppsV1Api(api_client),
               "exc": client.exceptions.ApiException, "timings": timings, "node": os.uname().nodename.lower()}
    finally:
        down = k8s_local("kubelet", "down", timeout=180)
        k8s_local("down", timeout=60)
        print(down.stdout.strip())
        left = node_processes()
        assert down.returncode == 0 and not left, down.stdout + down.stderr + "\nstill running: %s" % left


def test_llama_tiny_trains_across_two_real_pods(node):
    run_id = f"e2e-k8s-pods-{int(time.time())}"
    name = f"mnds-{run_id}"
    t0 = time.time()
    proc, out, log = start_train(["-e", "backend=kubernetes", "-e", "model=llama-tiny", "-e", "steps=10",
                                  "-e", "preflight=false", "-e", f"run_id={run_id}",
                                  "-e", f"k8s_kubeconfig={KUBECONFIG}", "-e", f"k8s_image={IMAGE}",
                                  "-e", f"k8s_shared_volume=hostPath:{volume_path()}"], "k8s-pods")
    try:
        rc = proc.wait(900)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        rc = None
    finally:
        out.close()
    took = time.time() - t0
    text = log.read_text()
    timings = dict(node["timings"], **{"train.yml": took})
    print("timings: " + ", ".join("%s %.1fs" % kv for kv in timings.items()))
    assert rc == 0, text[-5000:]
    run = ROOT / "runs" / run_id
    summary = load_summary(run_id)
    assert summary["status"] == "success", summary
    assert summary["backend"] == "kubernetes" and summary["world_size"] == 2, summary
    for rank in ("0", "1"):
        assert summary["ranks"][rank]["finished"] and summary["ranks"][rank]["last_step"] == 10, summary["ranks"]
        events = [json.loads(line) for line in (run / "metrics" / f"rank{rank}.jsonl").read_text().splitlines()]
        assert [e["step"] for e in events if e.get("event") == "step"][-1] == 10, events[-3:]
        assert events[-1]["event"] == "done" and events[-1]["host"] == summary["ranks"][rank]["host"], events[-1]
    assert summary["environment"]["DS_ACCELERATOR"] == "cpu", summary["environment"]
    # Both pods ran on the real node, and their logs came through the apiserver from the kubelet.
    record = json.loads((run / "k8s" / "pods.json").read_text())
    pods = sorted(record["pods"], key=lambda p: p["ordinal"])
    assert [p["pod"] for p in pods] == [f"{name}-0", f"{name}-1"], record
    assert all(p["node"] == node["node"] and p["started"] and p["ip"] for p in pods), record
    assert any(p["phase"] in ("Running", "Succeeded") for p in pods), record
    for pod in pods:
        pod_log = (run / "k8s" / f"{pod['pod']}.log").read_text()
        assert "the agent exited with 0" in pod_log, pod_log[-2000:]
    # The objects are gone, then the pods.
    assert not k8s_exists(node, "Service", name, "default")
    deadline = time.time() + 60
    while time.time() < deadline:
        left = [p["metadata"]["name"] for p in k8s_read(node["core"].list_namespaced_pod, "default")["items"]
                if p["metadata"]["name"].startswith(name + "-")]
        if not left:
            break
        time.sleep(1)
    assert not left, left


def test_a_killed_controller_leaves_no_pod_running_and_the_service_takes_the_rest(node):
    """Issue 26, point 11: SIGKILL to the play (the controller dies mid-run, nothing of it runs again): the agents
    stop the ranks on the stale lease, the pods end (restartPolicy Never, so no pod holds its resources), and
    deleting the Service deletes the pods and the Secret it owns."""
    run_id = f"e2e-k8s-killed-{int(time.time())}"
    name = f"mnds-{run_id}"
    proc, out, log = start_train(["-e", "backend=kubernetes", "-e", "model=llama-tiny", "-e", "steps=100000",
                                  "-e", "preflight=false", "-e", f"run_id={run_id}",
                                  "-e", '{"secret_env": {"E2E_SECRET": "x"}}',
                                  "-e", f"k8s_kubeconfig={KUBECONFIG}", "-e", f"k8s_image={IMAGE}",
                                  "-e", f"k8s_shared_volume=hostPath:{volume_path()}"], "k8s-killed")

    def pods():
        return [p for p in k8s_read(node["core"].list_namespaced_pod, "default")["items"]
                if p["metadata"]["name"].startswith(name + "-")]
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not (len(pods()) == 2 and all(
                p["status"].get("phase") == "Running" for p in pods())):
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(1)
        assert len(pods()) == 2, log.read_text()[-3000:]
        time.sleep(5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
        out.close()
    t0 = time.time()
    # The agents' lease is 45 s; then they stop the ranks, exit, and the pods end.
    while time.time() - t0 < 120:
        phases = [p["status"].get("phase") for p in pods()]
        if phases and all(phase in ("Succeeded", "Failed") for phase in phases):
            break
        time.sleep(2)
    ended = time.time() - t0
    print(f"SIGKILL: the pods ended {ended:.1f}s after the controller died: {phases}")
    assert all(phase in ("Succeeded", "Failed") for phase in phases) and len(phases) == 2, phases
    for pod in pods():
        assert pod["spec"]["restartPolicy"] == "Never"
        assert pod["status"]["containerStatuses"][0].get("restartCount", 0) == 0
    # The owner chain: the Service goes, the garbage collector takes the pods and the Secret. (The play's worker,
    # orphaned by the SIGKILL, may have stopped the run and deleted them itself already.)
    if k8s_exists(node, "Service", name, "default"):
        node["core"].delete_namespaced_service(name, "default", propagation_policy="Background")
    deadline = time.time() + 60
    while time.time() < deadline and (pods() or k8s_exists(node, "Secret", name + "-secrets", "default")):
        time.sleep(1)
    assert not pods() and not k8s_exists(node, "Secret", name + "-secrets", "default")


def _run_pods(node, name):
    return sorted((p for p in k8s_read(node["core"].list_namespaced_pod, "default")["items"]
                   if p["metadata"]["name"].startswith(name + "-")), key=lambda p: p["metadata"]["name"])


def test_a_node_that_stops_reporting_gets_the_next_attempts_pods_elsewhere(node):
    """Issue 22 on Kubernetes: with -e restarts=1 both pods of attempt 1 are placed on a node that then stops
    reporting (a node with no kubelet; the real node is cordoned by the test until they are placed); attempt 2 is a
    new generation of pods (<name>-a2-*) kept off that node by node affinity (no cordon by the play), which runs on
    the real node and finishes the run."""
    run_id = f"e2e-k8s-recover-{int(time.time())}"
    name = f"mnds-{run_id}"
    fake = subprocess.Popen([str(K8S), "node", "lost-node"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert "ready with" in fake.stdout.readline()
        deadline = time.time() + 60
        while time.time() < deadline and k8s_read(node["core"].read_node, "lost-node")["spec"].get("taints"):
            time.sleep(0.5)
        node["core"].patch_node(node["node"], {"spec": {"unschedulable": True}})
        proc, out, log = start_train(["-e", "backend=kubernetes", "-e", "model=llama-tiny", "-e", "steps=10",
                                      "-e", "preflight=false", "-e", f"run_id={run_id}", "-e", "restarts=1",
                                      "-e", f"k8s_kubeconfig={KUBECONFIG}", "-e", f"k8s_image={IMAGE}",
                                      "-e", f"k8s_shared_volume=hostPath:{volume_path()}"], "k8s-recover")
        try:
            deadline = time.time() + 300
            while time.time() < deadline:
                placed = [p["spec"].get("nodeName") for p in _run_pods(node, name) if "-a2-" not in p["metadata"]["name"]]
                if len(placed) == 2 and all(placed):
                    break
                assert proc.poll() is None, log.read_text()[-3000:]
                time.sleep(1)
            assert placed == ["lost-node", "lost-node"], placed
            node["core"].patch_node(node["node"], {"spec": {"unschedulable": False}})
            fake.terminate()
            t0 = time.time()
            rc = proc.wait(900)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            out.close()
        text = log.read_text()
        print(f"the run ended {time.time() - t0:.1f}s after lost-node stopped reporting")
        assert rc == 0, text[-5000:]
        summary = load_summary(run_id)
        first, second = summary["attempts"]
        print(f"lost-node to attempt 2's first step: {second['fault_to_first_step']} s")
        assert summary["status"] == "success" and first["kind"] == "lost" and first["retried"] is True
        assert "node lost-node is not ready" in first["why"] and second["last_step"] == 10
        run = ROOT / "runs" / run_id / "attempts"
        pods = json.loads((run / "2" / "k8s" / "pods.json").read_text())["pods"]
        assert sorted(p["pod"] for p in pods) == [f"{name}-a2-0", f"{name}-a2-1"]
        assert all(p["node"] == node["node"] for p in pods), pods
        objects = json.loads((run / "2" / "k8s" / "objects.json").read_text())
        terms = objects[1]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchFields"] == [
            {"key": "metadata.name", "operator": "NotIn", "values": ["lost-node"]}]
        # Neither generation's Service is left, and no node was cordoned by the play.
        for service in (name, name + "-a2"):
            assert not k8s_exists(node, "Service", service, "default")
        # The last attempt gave the model's checkpoint lock back (the next run of llama-tiny may start at once).
        assert podman("exec", "mnds-coord", "test", "!", "-e", "/shared/checkpoints/llama-tiny.lock").returncode == 0
        assert not k8s_read(node["core"].read_node, node["node"])["spec"].get("unschedulable")
        assert not k8s_read(node["core"].read_node, "lost-node")["spec"].get("unschedulable")
    finally:
        node["core"].patch_node(node["node"], {"spec": {"unschedulable": False}})
        if fake.poll() is None:
            fake.terminate()
        # The first generation's pods stay Terminating on a node with no kubelet: remove them, then the node.
        for pod in _run_pods(node, name):
            node["core"].delete_namespaced_pod(pod["metadata"]["name"], "default", grace_period_seconds=0,
                                               _preload_content=False)
        k8s_local("unnode", "lost-node", timeout=30)
