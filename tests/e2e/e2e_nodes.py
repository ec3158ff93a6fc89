"""What the end-to-end tests ask of the local cluster's nodes (imported by the test modules)."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The cluster this session's end-to-end tests use: the default one, or the second lane's (MNDS_CLUSTER_PREFIX, as
# scripts/localcluster.py reads it; tests/e2e/lanes.py).  Its containers are <PREFIX>-<node>; its inventory and
# keys are in folders of their own.
DEFAULT_PREFIX = "mnds"


def cluster_paths(prefix):
    """The inventory and the keys' folder of the local cluster ``prefix`` (where scripts/localcluster.py writes
    them)."""
    suffix = "" if prefix == DEFAULT_PREFIX else f"-{prefix}"
    return ROOT / "inventories" / f"local{suffix}" / "hosts.yml", ROOT / f".cluster{suffix}"


PREFIX = os.environ.get("MNDS_CLUSTER_PREFIX", DEFAULT_PREFIX)
INVENTORY, CLUSTER_DIR = cluster_paths(PREFIX)


def node_name(node):
    """The container of the local cluster's ``node`` (coord, worker1, ...)."""
    return f"{PREFIX}-{node}"


def podman(*args, **kw):
    """podman with the local cluster's containers.conf."""
    # /usr/sbin too: netavark runs iptables or nft when a container starts.
    env = {"CONTAINERS_CONF": str(ROOT / ".cache" / "podman" / "containers.conf"), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, check=False, **kw)


def run_processes(node, run_id):
    """Processes on ``node`` that belong to run ``run_id`` (by the marker in their environment)."""
    script = ("for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null | "
              f"grep -qx MULTINODE_DS_RUN_ID={run_id} && echo ${{p#/proc/}}; done; true")
    # As root and as the run's account: root in the container has no CAP_SYS_PTRACE, so it cannot read the
    # environment of another account's processes.
    pids = podman("exec", node_name(node), "sh", "-c", script).stdout.split()
    pids += podman("exec", "--user", "deepspeed", node_name(node), "sh", "-c", script).stdout.split()
    # A rank forked from the node's warm process shows that one's environment: its record names the run (read as
    # the agent reads it: a record whose process is gone, or whose PID was reused, is none).
    warm = ("from multinode_ds import warm; import sys; print(' '.join(str(p) for p, r in warm.registered().items() "
            "if r.get('run_id') == sys.argv[1]))")
    pids += podman("exec", "--user", "deepspeed", node_name(node), "/opt/multinode-deepspeed/venv/bin/python", "-c",
                   warm, run_id).stdout.split()
    return sorted(set(pids), key=int)


NODES = ("coord", "worker1", "worker2")


def left_on(nodes, run_id, seconds=10, look=None, every=0.5):
    """The run's processes still on ``nodes`` after up to ``seconds`` (``look(node, run_id)`` lists them; by
    default run_processes), as {node: [pids]}; {} once none is left."""
    look = look or run_processes
    left = {}
    deadline = time.time() + seconds
    while time.time() < deadline:
        left = dict((n, look(n, run_id)) for n in nodes)
        if not any(left.values()):
            return {}
        time.sleep(every)
    return left


def finish(proc, out, timeout=600):
    """Wait for a play started by start_train (killed when it outlives ``timeout``); its exit code."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
    return proc.returncode


def load_summary(run_id):
    return json.loads((ROOT / "runs" / run_id / "summary.json").read_text())


def wait_for_files(paths, seconds=30):
    """Wait until every path exists and is not empty (train.yml draws a run's plots in the background); returns the
    ones still missing."""
    deadline = time.time() + seconds
    missing = list(paths)
    while missing and time.time() < deadline:
        missing = [p for p in paths if not p.exists() or p.stat().st_size == 0]
        if missing:
            time.sleep(0.2)
    return missing


def on_coord(command):
    """A shell command on the coordinator."""
    return podman("exec", node_name("coord"), "sh", "-c", command)


_shared = {}


def shared_on_host():
    """Where this machine sees the cluster's shared directory (the podman volume ``<PREFIX>-shared``, mounted at
    /shared on every node), or None: reading a file there takes no podman exec."""
    if "path" not in _shared:
        res = podman("volume", "inspect", f"{PREFIX}-shared", "--format", "{{.Mountpoint}}")
        path = Path(res.stdout.strip()) if res.returncode == 0 and res.stdout.strip() else None
        _shared["path"] = path if path is not None and path.is_dir() else None
    return _shared["path"]


def last_line(path, chunk=65536):
    """The last line of the file at ``path`` ("" when there is none)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - chunk))
            lines = fh.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def rank_step(run_id, rank=0, attempt=None):
    """The last step ``rank`` of run ``run_id`` (of its ``attempt``, for a run with restarts) recorded in its
    metrics (0 before the first; the run's steps once it wrote its done record).  Read from the shared volume on
    this machine where it can be (a podman exec into the coordinator took seconds on a loaded machine, and a short
    run was over before a test's look saw the step it waited for)."""
    where = f"runs/{run_id}" + (f"/attempts/{attempt}" if attempt else "") + f"/metrics/rank{rank}.jsonl"
    host = shared_on_host()
    text = last_line(host / where) if host is not None else on_coord(f"tail -n1 /shared/{where} 2>/dev/null").stdout
    try:
        record = json.loads(text)
    except ValueError:
        return 0
    # A short run can end between two looks: its last record is then the done one, with the steps it ran.
    return record.get("step", record.get("steps", 0) if record.get("event") == "done" else 0)


def when_step(run_id, step, action, seconds=300, attempt=None):
    """Run ``action`` once rank 0 reached ``step`` (in ``attempt``, for a run with restarts); returns the time it
    ran, or None."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if rank_step(run_id, attempt=attempt) >= step:
            action()
            return time.time()
        time.sleep(0.2)
    return None


def localcluster(*args):
    """scripts/localcluster.py with this venv's Python; returns the CompletedProcess (output captured)."""
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "localcluster.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, check=False)


def start_train(args, name):
    """train.yml in the background, in a process group of its own (a test sends it Ctrl-C with os.killpg);
    returns (process, its open log file, the log's path)."""
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_INVENTORY=str(INVENTORY), PWD=str(ROOT),
               PATH=f"{bin_dir}:{os.environ.get('PATH', '')}")
    log = ROOT / "tests" / "output" / f"{name}-{int(time.time())}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    out = open(log, "w")
    proc = subprocess.Popen([str(bin_dir / "ansible-playbook"), "train.yml", *args], cwd=ROOT, env=env, stdout=out,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    return proc, out, log


K8S = ROOT / "scripts" / "k8s-local"
KUBECONFIG = ROOT / ".cache" / "k8s" / "admin.kubeconfig"


def k8s_local(*args, timeout=1200):
    """scripts/k8s-local (the local Kubernetes control plane and node)."""
    return subprocess.run([str(K8S), *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)


def k8s_build(timeout=1200):
    """The control plane's binaries: the build the session started early (tests/e2e/early.py) once it ended, else
    ``scripts/k8s-local build`` now (cached: it returns at once)."""
    import early  # pylint: disable=import-outside-toplevel
    res = early.k8s_build(timeout)
    return res if res is not None else k8s_local("build", timeout=timeout)


def k8s_read(call, *args):
    """An API call's answer as the apiserver sent it (JSON), without the client's models."""
    return json.loads(call(*args, _preload_content=False).data)


def k8s_exists(api, kind, name, ns):
    """Does the StatefulSet, Service or Secret exist? ``api``: {"core", "apps", "exc"} of the kubernetes client."""
    call = {"StatefulSet": api["apps"].read_namespaced_stateful_set, "Service": api["core"].read_namespaced_service,
            "Secret": api["core"].read_namespaced_secret}[kind]
    try:
        call(name, ns, _preload_content=False)
        return True
    except api["exc"] as exc:
        if exc.status == 404:
            return False
        raise


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_registry(root, auth=False):
    """Debian's docker-registry on a free loopback port, its storage under ``root`` (``auth``: token auth whose
    token service is absent, so every request without credentials is refused): (address, process).  The port is
    free when asked for and may be taken before the registry binds it (a busy session opens ports all the time):
    then another."""
    root.mkdir(parents=True, exist_ok=True)
    for _attempt in range(5):
        port = free_port()
        proc = _registry_on(root, port, auth)
        if _listening(proc, port):
            return "127.0.0.1:%d" % port, proc
        try:
            proc.wait(10)  # (one that lost the port exits at once)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log = (root / "log").read_text()
        if "address already in use" not in log:
            raise AssertionError("docker-registry did not listen on %d: %s" % (port, log))
    raise AssertionError("docker-registry found no free port in 5 tries: %s" % (root / "log").read_text())


def _registry_on(root, port, auth):
    conf = root / "config.yml"
    text = ("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\n"
            "  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:%d\n" % (root / "data", port))
    if auth:
        text += "auth:\n  silly:\n    realm: http://127.0.0.1:%d/token\n    service: mnds-e2e\n" % port
    conf.write_text(text)
    return subprocess.Popen(["docker-registry", "serve", str(conf)], stdout=(root / "log").open("w"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def _listening(proc, port, seconds=30):
    """Whether the registry ``proc`` answers on ``port`` within ``seconds``: its /v2/ with the registry's API header
    (what else listens there is another process's), False once it exited."""
    import urllib.error  # pylint: disable=import-outside-toplevel
    import urllib.request  # pylint: disable=import-outside-toplevel
    deadline = time.time() + seconds
    while time.time() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen("http://127.0.0.1:%d/v2/" % port, timeout=2) as answer:
                headers = answer.headers
        except urllib.error.HTTPError as exc:  # 401 with auth: the registry too
            headers = exc.headers
        except (OSError, ValueError):
            time.sleep(0.2)
            continue
        return "Docker-Distribution-Api-Version" in headers and proc.poll() is None
    return False


def fake_gpu(node, fixture):
    """A fake nvidia-smi on the node that prints a fixture's output (tests/fixtures/nvidia-smi/<fixture>), and a fake
    dmesg printing the fixture's dmesg.txt where it has one."""
    name, src = node_name(node), ROOT / "tests" / "fixtures" / "nvidia-smi" / fixture
    podman("exec", name, "mkdir", "-p", "/opt/mnds-fixtures", "/etc/multinode-deepspeed-test")
    assert podman("cp", str(src), f"{name}:/opt/mnds-fixtures/nvidia-smi").returncode == 0
    fake = ROOT / "tests" / "fixtures" / "bin" / "nvidia-smi"
    assert podman("cp", str(fake), f"{name}:/usr/local/bin/nvidia-smi").returncode == 0
    podman("exec", name, "sh", "-c", "echo /opt/mnds-fixtures/nvidia-smi > /etc/multinode-deepspeed-test/nvidia-smi-fixture")
    if (src / "dmesg.txt").exists():
        podman("exec", name, "sh", "-c", "printf '#!/bin/sh\\nexec cat /opt/mnds-fixtures/nvidia-smi/dmesg.txt\\n' "
               "> /usr/local/bin/dmesg && chmod 755 /usr/local/bin/dmesg")


def remove_fake_gpu(node):
    podman("exec", node_name(node), "rm", "-rf", "/usr/local/bin/nvidia-smi", "/usr/local/bin/dmesg",
           "/opt/mnds-fixtures", "/etc/multinode-deepspeed-test")
