"""The kubernetes backend with real pods (issue 14): train.yml trains llama-tiny across two pods that a real
kubelet (v1.20.2, built by scripts/k8s-local) runs with containerd on this machine.

What runs for real: the control plane (scripts/k8s-local up); the node (``scripts/k8s-local kubelet up``:
containerd, runc and the CNI plugins from Debian's packages, the kubelet, a CNI bridge, and the cluster DNS that
resolves pod 0's stable name for pod 1); the image (issue 24: image.yml builds the stack site.yml chose from the
same wheelhouse, tags it with the stack's fingerprint and pushes it to Debian's docker-registry on loopback; the
node's containerd pulls it, and train.yml names it by default); the run (the pods mount the podman volume the cluster's nodes share at /shared, so the
coordinator's watch reads their heartbeats and metrics as on any other backend); the pods' logs, read through the
apiserver from the kubelet.  Nothing is stood in for."""
import json
import os
import re
import shutil
import signal
import subprocess
import tarfile
import time
import urllib.request
from pathlib import Path

import pytest
from e2e_nodes import (CLUSTER_DIR, K8S, KUBECONFIG, PREFIX, free_port, k8s_build, k8s_exists, k8s_local, k8s_read,
                       load_summary, node_name, podman, start_registry, start_train)
import early
from early import run_playbook

pytestmark = [pytest.mark.e2e, pytest.mark.k8s]
ROOT = Path(__file__).resolve().parents[2]
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
    res = podman("volume", "inspect", f"{PREFIX}-shared", "--format", "{{.Mountpoint}}")
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def image_yml(registry, *extra, name="image"):
    return run_playbook("image.yml", "-e", f"image_registry={registry}", "-e", "image_registry_insecure=true",
                        *extra, name=name)


def shown_image(res):
    """The image the play printed: (reference, built now?)."""
    match = re.search(r"- '?(\S+:[0-9a-f]{16}) \((built now|already there: nothing built|check mode: would be "
                      r"built)\)", res.out)
    assert match, res.tail()
    return match.group(1), match.group(2) != "already there: nothing built"


@pytest.fixture(scope="module")
def registry(provisioned, tmp_path_factory):
    """A real OCI registry on loopback, and the stack's image built by image.yml and pushed to it."""
    built = early.image()  # built in the background since site.yml ended (tests/e2e/early.py), or now
    if built is not None:
        root, address, proc, res, took = built["root"], built["address"], built["proc"], built["result"], built["seconds"]
    else:
        root = tmp_path_factory.mktemp("registry")
        address, proc = start_registry(root)
    try:
        if built is None:
            t0 = time.time()
            res = image_yml(address, name="image-first")
            took = time.time() - t0
        assert res.rc == 0, res.tail(80)
        ref, built = shown_image(res)
        assert built and ref.startswith(address + "/multinode-deepspeed:"), ref
        size = sum(f.stat().st_size for f in (root / "data").rglob("*") if f.is_file())
        print(f"image.yml: built and pushed {ref} in {took:.0f}s; {size / 1e6:.0f} MB in the registry")
        yield {"address": address, "ref": ref, "root": root, "first": took, "size": size}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
        # The image was pushed: the build host's copy is not needed again; nor is the registry's storage.
        podman("rmi", "-f", ref, timeout=120) if "ref" in locals() else None
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def node(registry):
    """The control plane and a real node on this machine; the node pulls the stack's image from the registry."""
    assert not node_processes(), "a containerd or kubelet is already running: %s" % node_processes()
    res = k8s_build()
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    res = k8s_local("up", timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    timings = {"image.yml (first)": registry["first"]}
    try:
        t0 = time.time()
        res = k8s_local("kubelet", "up", "--insecure-registry", registry["address"], timeout=600)
        timings["kubelet up"] = time.time() - t0
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        print(res.stdout.strip().splitlines()[-1])
        from kubernetes import client, config  # pylint: disable=import-outside-toplevel
        api_client = config.new_client_from_config(str(KUBECONFIG))
        yield {"core": client.CoreV1Api(api_client), "apps": client.AppsV1Api(api_client),
               "exc": client.exceptions.ApiException, "timings": timings, "node": os.uname().nodename.lower(),
               "image": ["-e", "image_registry=" + registry["address"], "-e", "image_registry_insecure=true"],
               "registry": registry}
    finally:
        down = k8s_local("kubelet", "down", timeout=180)
        k8s_local("down", timeout=60)
        print(down.stdout.strip())
        left = node_processes()
        assert down.returncode == 0 and not left, down.stdout + down.stderr + "\nstill running: %s" % left


def plant_leftovers(node, name):
    """What a controller that died before its watch started leaves (issue 44, point 14): the run's Service (with
    its deadline, here 1 s), a Secret and a pod the scheduler can never place (a Pending pod has no kubelet
    deadline), both owned by the Service."""
    core, labels = node["core"], {"app.kubernetes.io/name": "multinode-deepspeed",
                                  "app.kubernetes.io/managed-by": "multinode.deepspeed",
                                  "multinode-deepspeed.io/run": name}
    svc = core.create_namespaced_service("default", {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": labels,
                     "annotations": {"multinode-deepspeed.io/deadline-seconds": "1"}},
        "spec": {"clusterIP": "None", "selector": {"multinode-deepspeed.io/run": name},
                 "ports": [{"name": "master", "port": 29500}]}})
    owner = [{"apiVersion": "v1", "kind": "Service", "name": name, "uid": svc.metadata.uid}]
    core.create_namespaced_secret("default", {
        "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name + "-secrets", "labels": labels,
                                                           "ownerReferences": owner},
        "stringData": {"secret_env": "{}"}})
    core.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name + "-0", "labels": labels, "ownerReferences": owner},
        "spec": {"nodeSelector": {"kubernetes.io/hostname": "no-such-node"}, "restartPolicy": "Never",
                 "containers": [{"name": "ranks", "image": node["registry"]["ref"], "command": ["true"]}]}})
    time.sleep(2)  # past its 1 s deadline, by the apiserver's clock (whole seconds)


def test_llama_tiny_trains_across_two_real_pods(node):
    run_id = f"e2e-k8s-pods-{int(time.time())}"
    name = f"mnds-{run_id}"
    dead = f"mnds-e2e-dead-controller-{int(time.time())}"
    plant_leftovers(node, dead)
    t0 = time.time()
    proc, out, log = start_train(["-e", "backend=kubernetes", "-e", "model=llama-tiny", "-e", "steps=10",
                                  "-e", "preflight=false", "-e", f"run_id={run_id}",
                                  "-e", f"k8s_kubeconfig={KUBECONFIG}", *node["image"],
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
    # No k8s_image: the plan named image.yml's image of the workers' stack, and the node's containerd pulled it.
    ref = node["registry"]["ref"]
    objects = json.loads((ROOT / "runs" / run_id / "k8s" / "objects.json").read_text())
    assert [o["spec"]["containers"][0]["image"] for o in objects if o["kind"] == "Pod"] == [ref, ref], objects
    pulled = (ROOT / ".cache" / "k8s" / "node" / "containerd.log").read_text()
    assert 'PullImage \\"%s\\" returns image reference' % ref in pulled, pulled[-2000:]
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
    # The pods ran under the runtime's seccomp filter, with the run's deadline (timeout 3600 s and a minute).
    assert all(o["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"} and
               o["spec"]["activeDeadlineSeconds"] == 3660 for o in objects if o["kind"] == "Pod"), objects
    # What the dead controller left was deleted by this run's start: its Service, then (their owner gone) its
    # Pending pod and its Secret.
    assert "mnds-e2e-dead-controller" in text and "past the run's deadline" in text, text[-5000:]
    assert not k8s_exists(node, "Service", dead, "default")
    deadline = time.time() + 60
    while time.time() < deadline and (k8s_exists(node, "Secret", dead + "-secrets", "default")
                                      or _run_pods(node, dead)):
        time.sleep(1)
    assert not k8s_exists(node, "Secret", dead + "-secrets", "default") and not _run_pods(node, dead)
    # The objects are gone, then the pods.
    assert not k8s_exists(node, "Service", name, "default")
    pods_deleted(node, name)


def test_a_killed_controller_leaves_no_pod_running_and_the_service_takes_the_rest(node):
    """Issue 26, point 11: SIGKILL to the play (the controller dies mid-run, nothing of it runs again): the run
    stops, the pods end (restartPolicy Never, so no pod holds its resources), and deleting the Service deletes the
    pods and the Secret it owns."""
    run_id = f"e2e-k8s-killed-{int(time.time())}"
    name = f"mnds-{run_id}"
    proc, out, log = start_train(["-e", "backend=kubernetes", "-e", "model=llama-tiny", "-e", "steps=100000",
                                  "-e", "preflight=false", "-e", f"run_id={run_id}",
                                  "-e", '{"secret_env": {"E2E_SECRET": "x"}}',
                                  "-e", f"k8s_kubeconfig={KUBECONFIG}", *node["image"],
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
    # Ansible's worker that runs the watch (a session of its own) sees the main process gone and stops the run as
    # on Ctrl-C; the dead man's switch and the agents' 45 s lease are the fallbacks. The pods end.
    while time.time() - t0 < 120:
        phases = [p["status"].get("phase") for p in pods()]
        # Ended, or already gone: the orphaned watch deletes them, and a kubelet that confirms at once leaves none.
        if all(phase in ("Succeeded", "Failed") for phase in phases):
            break
        time.sleep(2)
    ended = time.time() - t0
    print(f"SIGKILL: the pods ended {ended:.1f}s after the controller died: {phases or 'deleted and gone'}")
    # Each of the two pods ended or is gone (the orphaned watch may have deleted one and not yet the other).
    assert all(phase in ("Succeeded", "Failed") for phase in phases) and len(phases) <= 2, phases
    for pod in pods():
        assert pod["spec"]["restartPolicy"] == "Never"
        assert pod["status"]["containerStatuses"][0].get("restartCount", 0) == 0
    # The owner chain: the Service goes, the garbage collector takes the pods and the Secret. (The orphaned watch has
    # usually deleted them itself already.)
    if k8s_exists(node, "Service", name, "default"):
        node["core"].delete_namespaced_service(name, "default", propagation_policy="Background")
    deadline = time.time() + 60
    while time.time() < deadline and k8s_exists(node, "Secret", name + "-secrets", "default"):
        time.sleep(1)
    assert not k8s_exists(node, "Secret", name + "-secrets", "default")
    pods_deleted(node, name)


def _run_pods(node, name):
    return sorted((p for p in k8s_read(node["core"].list_namespaced_pod, "default")["items"]
                   if p["metadata"]["name"].startswith(name + "-")), key=lambda p: p["metadata"]["name"])


def pods_deleted(node, name, seconds=90):
    """The run's pods were deleted and run nothing: each leaves the API within ``seconds``, or is still there only
    because the kubelet has not confirmed its deletion yet (deletionTimestamp set, phase Succeeded or Failed, every
    container terminated). Kubelet v1.20 can take far longer than a pod's grace period to confirm, or never confirm
    at all (kubernetes/kubernetes#97288, #106711); that part is the kubelet's, not the run's. A pod left that way is
    removed with grace 0, as Kubernetes' pod garbage collector removes ended pods, so that the next test's node is
    clean (once every pod is in one of the two states: the confirmation is not waited for). Returns the names
    that the kubelet had not confirmed."""
    deadline = time.time() + seconds
    # Waits for the pods to leave the API, or for every one left to be deleted and ended (the kubelet's
    # confirmation, which may never come, is not waited for: the checks below are the same either way).
    while time.time() < deadline and not all(_deleted_and_ended(pod) for pod in _run_pods(node, name)):
        time.sleep(1)
    left = _run_pods(node, name)
    for pod in left:
        meta, status = pod["metadata"], pod.get("status") or {}
        states = _container_states(pod)
        why = "%s: deletionTimestamp %s, phase %s, containers %s\n%s" % (
            meta["name"], meta.get("deletionTimestamp"), status.get("phase"), states, kubelet_lines(meta["uid"]))
        assert meta.get("deletionTimestamp"), "never deleted: " + why
        assert status.get("phase") in ("Succeeded", "Failed"), "not ended: " + why
        assert states and all("terminated" in state for state in states), "a container still runs: " + why
        print("the kubelet had not confirmed the deletion yet: %s" % why)
        node["core"].delete_namespaced_pod(meta["name"], "default", grace_period_seconds=0, _preload_content=False)
    return [pod["metadata"]["name"] for pod in left]


def _container_states(pod):
    return [c.get("state") or {} for c in (pod.get("status") or {}).get("containerStatuses") or []]


def _deleted_and_ended(pod):
    """Deleted (deletionTimestamp set), ended (Succeeded or Failed) and no container running."""
    states = _container_states(pod)
    return bool(pod["metadata"].get("deletionTimestamp")) and (pod.get("status") or {}).get("phase") in (
        "Succeeded", "Failed") and bool(states) and all("terminated" in state for state in states)


def kubelet_lines(uid, count=20):
    """The node's kubelet log lines about the pod ``uid`` (the last ``count``)."""
    log = ROOT / ".cache" / "k8s" / "node" / "kubelet.log"
    lines = [line for line in log.read_text(errors="replace").splitlines() if uid in line] if log.exists() else []
    return "\n".join(line[:300] for line in lines[-count:])


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
                                      "-e", f"k8s_kubeconfig={KUBECONFIG}", *node["image"],
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
        assert podman("exec", node_name("coord"), "test", "!", "-e", "/shared/checkpoints/llama-tiny.lock").returncode == 0
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


def test_image_yml_again_builds_and_pushes_nothing(registry):
    t0 = time.time()
    res = image_yml(registry["address"], name="image-again")
    took = time.time() - t0
    assert res.rc == 0, res.tail(60)
    assert shown_image(res) == (registry["ref"], False)
    assert res.recap()["localhost"]["changed"] == 0, res.recap()
    print(f"image.yml with nothing changed: {took:.1f}s, changed=0")


def test_a_changed_pin_gives_a_new_tag(registry):
    """One package fewer in the stack (stack_extra_packages, as site.yml reads it): another venv, another tag; in
    check mode nothing is built or pushed."""
    extra = json.dumps({"stack_extra_packages": ["transformers==5.23.0", "mlcommons-loadgen==6.0.17"]})
    res = image_yml(registry["address"], "--check", "-e", extra, name="image-changed-pin")
    assert res.rc == 0, res.tail(60)
    ref, _built = shown_image(res)
    assert ref != registry["ref"] and ref.startswith(registry["address"] + "/multinode-deepspeed:"), ref
    assert "check mode: would be built" in res.out
    tags = json.loads(urllib.request.urlopen("http://%s/v2/multinode-deepspeed/tags/list" % registry["address"],
                                             timeout=30).read())["tags"]
    assert tags == [registry["ref"].rsplit(":", 1)[1]], tags


# A private key's block with key material after it (libraries hold the bare header line as a format constant).
PRIVATE_KEY = re.compile(rb"-----BEGIN ([A-Z0-9]+ )?PRIVATE KEY-----\r?\n(Proc-Type:[^\n]*\n)?[A-Za-z0-9+/=\r\n]{64}")
SECRET_NAMES = re.compile(r"(^|/)(id_(rsa|ecdsa|ed25519|dsa)|munge\.key|auth\.json|\.netrc|\.git-credentials|"
                          r"ssh_host_[a-z0-9]+_key|\.pypirc|config\.json)$")


def test_the_image_holds_no_key_token_or_password(registry):
    """Every layer the registry serves, read file by file: no private key (PEM or OpenSSH, outside the shared
    libraries' built-in self-test keys), no file where keys, tokens or passwords live, and none of this cluster's
    secrets (its SSH key, the munge key) anywhere."""
    def get(path, accept=None):
        req = urllib.request.Request("http://%s/v2/multinode-deepspeed/%s" % (registry["address"], path),
                                     headers={"Accept": accept} if accept else {})
        return urllib.request.urlopen(req, timeout=120)
    tag = registry["ref"].rsplit(":", 1)[1]
    manifest = json.loads(get("manifests/" + tag, "application/vnd.oci.image.manifest.v1+json").read())
    key = CLUSTER_DIR / "id_ed25519"
    known = [line.encode() for line in key.read_text().splitlines()[1:-1]] if key.exists() else []
    munge = subprocess.run(["podman", "exec", node_name("coord"), "cat", "/etc/munge/munge.key"], capture_output=True,
                           check=False).stdout
    known += [munge[i:i + 64] for i in range(0, len(munge) - 63, 256)] if len(munge) >= 64 else []
    hits, files = [], 0
    for layer in manifest["layers"]:
        with tarfile.open(fileobj=get("blobs/" + layer["digest"]), mode="r|*") as tf:
            for member in tf:
                files += 1
                if SECRET_NAMES.search(member.name) and "site-packages" not in member.name:
                    hits.append(("a secret's file", member.name))
                if member.isfile() and member.size < 4_000_000:
                    data = tf.extractfile(member).read()
                    # A key is a file of its own, never inside a shared library (libgnutls carries its self-test
                    # keys); this cluster's own secrets are looked for in every file.
                    if not data.startswith(b"\x7fELF") and PRIVATE_KEY.search(data):
                        hits.append(("a private key", member.name))
                    hits += [("this cluster's secret", member.name) for k in known if k and k in data]
    assert files > 10000 and not hits, hits[:20]


@pytest.mark.parametrize("case", ["unreachable", "credentials", "accelerator", "cuda"])
def test_image_yml_refuses_bad_inputs_before_any_build(registry, tmp_path, case):
    before = subprocess.run(["podman", "ps", "-a", "-q", "--filter", "label=io.buildah.version"], capture_output=True,
                            text=True, check=False).stdout
    proc = None
    if case == "unreachable":
        args, words = [f"image_registry=127.0.0.1:{free_port()}"], ["cannot be reached", "Connection refused"]
    elif case == "credentials":
        address, proc = start_registry(tmp_path / "auth", auth=True)
        args, words = [f"image_registry={address}", "image_registry_insecure=true"], [
            f"the registry {address} needs credentials", f"podman login {address}"]
    elif case == "accelerator":
        args, words = [f"image_registry={registry['address']}", "image_accelerator=rocm"], [
            "image_accelerator='rocm'", "Fix: -e image_accelerator=cuda or -e image_accelerator=cpu"]
    else:
        args, words = [f"image_registry={registry['address']}", "image_accelerator=cuda", "image_cuda=99.9"], [
            "image_cuda 99.9", "Fix: set image_cuda to one of"]
    try:
        extra = [x for a in args for x in ("-e", a)]
        res = run_playbook("image.yml", *extra, name=f"image-bad-{case}")
    finally:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    assert res.rc != 0
    for word in words:
        assert word in res.out, res.tail(30)
    assert "nothing was built" in res.out and "Build the image with podman" not in res.out, res.tail(30)
    after = subprocess.run(["podman", "ps", "-a", "-q", "--filter", "label=io.buildah.version"], capture_output=True,
                           text=True, check=False).stdout
    assert after == before


def test_a_missing_tag_is_refused_before_anything_is_created(node):
    run_id = f"e2e-k8s-notag-{int(time.time())}"
    res = run_playbook("train.yml", "-e", "backend=kubernetes", "-e", "preflight=false", "-e", f"run_id={run_id}",
                       "-e", f"k8s_kubeconfig={KUBECONFIG}", *node["image"], "-e", "image_name=not-built",
                       "-e", f"k8s_shared_volume=hostPath:{volume_path()}", name="k8s-notag")
    assert res.rc != 0
    address = node["registry"]["address"]
    assert "The cluster cannot run this job (nothing was created)" in res.out, res.tail(30)
    assert f"the registry {address} has no {address}/not-built:" in res.out, res.tail(30)
    assert f"ansible-playbook image.yml -e image_registry={address} -e image_name=not-built" in res.out
    assert not k8s_exists(node, "Service", f"mnds-{run_id}", "default")
    assert not (ROOT / "runs" / run_id / "k8s").exists()
