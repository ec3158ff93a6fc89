"""A real Kubernetes control plane on this machine, built from Debian's own source package (issue 14).

    scripts/k8s-local build     fetch Debian's kubernetes source, Go 1.19 and etcd (apt, no internet beyond the
                                Debian mirror), build kube-apiserver, kube-controller-manager, kube-scheduler and
                                kubelet once; the binaries are cached under ~/.cache/multinode-deepspeed/dev/k8s/bin
                                (MNDS_K8S_BUILD_CACHE), kept across clones of the repository
    scripts/k8s-local up        certificates (openssl), etcd, apiserver, controller-manager, scheduler on loopback;
                                writes .cache/k8s/admin.kubeconfig; waits for /readyz
    scripts/k8s-local down      stops them and removes their state (the binaries stay)
    scripts/k8s-local status    is it up?
    scripts/k8s-local node N... --resource nvidia.com/gpu=2
                                nodes with no kubelet, whose capacity the caller gives, kept ready while it runs
    scripts/k8s-local kubelet up|down|status|import TAR...
                                a real node: containerd, runc, the CNI plugins and busybox from Debian's packages
                                (apt-get download + dpkg-deb -x into the build cache's tools/, nothing installed), the
                                kubelet built above, a CNI bridge on an unused 10.x/24, and a small cluster DNS
                                (pods' <hostname>.<subdomain>.<ns>.svc.cluster.local from the API) on its gateway;
                                ``import`` loads docker-archive tarballs into the node's containerd;
                                ``up --insecure-registry HOST:PORT`` lets the node pull from a registry that speaks
                                plain HTTP (Debian's docker-registry on loopback, in the tests).
                                ``down`` stops the pods, the kubelet, containerd, the shims, and removes the
                                mounts, cgroups and bridge it made (``scripts/k8s-local down`` does it too)

Nothing of the machine's apt configuration is changed: a private sources list (deb and deb-src lines for the
machine's own Debian mirrors) and private lists and cache directories are passed to apt-get.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# The state of what runs (certificates, etcd, the node's files, logs) is the clone's; what is built or downloaded
# once (the binaries, the Go cache, the node's tools) is this machine's, so a fresh clone finds it built.
CACHE = Path(os.environ.get("MNDS_K8S_CACHE", ROOT / ".cache" / "k8s"))
BUILT = Path(os.environ.get("MNDS_K8S_BUILD_CACHE",
                            Path.home() / ".cache" / "multinode-deepspeed" / "dev" / "k8s"))
BIN = BUILT / "bin"
RUN = CACHE / "run"
PKI = CACHE / "pki"
KUBECONFIG = CACHE / "admin.kubeconfig"
KUBE_VERSION = "1.20.5+really1.20.2-1.1+deb12u1"
KUBE_GIT_VERSION = "v1.20.2"
TOOLS = ("golang-1.19-go", "golang-1.19-src", "etcd-server", "etcd-client")
COMPONENTS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")
ETCD_PORT = int(os.environ.get("MNDS_K8S_ETCD_PORT", 23790))
ETCD_PEER_PORT = int(os.environ.get("MNDS_K8S_ETCD_PEER_PORT", 23800))
API_PORT = int(os.environ.get("MNDS_K8S_API_PORT", 16443))
SERVICE_RANGE = "10.0.0.0/24"


def say(msg: str) -> None:
    print(f"[k8s-local] {msg}", flush=True)


def run(argv, **kw):
    check = kw.pop("check", True)
    return subprocess.run([str(a) for a in argv], check=check, **kw)


# --------------------------------------------------------------------------- fetch and build

def mirrors() -> list:
    """(uri, suite) pairs of the machine's Debian sources (deb822 .sources files and sources.list)."""
    pairs = []
    files = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for f in files:
        for stanza in f.read_text().split("\n\n"):
            fields = dict((k.strip().lower(), v.strip()) for k, _sep, v in
                          (line.partition(":") for line in stanza.splitlines() if ":" in line and
                           not line.startswith("#")))
            if "deb" not in fields.get("types", "").split() or "main" not in fields.get("components", "").split():
                continue
            pairs += [(uri, suite) for uri in fields.get("uris", "").split()
                      for suite in fields.get("suites", "").split()]
    legacy = Path("/etc/apt/sources.list")
    if legacy.exists():
        for line in legacy.read_text().splitlines():
            m = re.match(r"\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)\s+(.*)", line)
            if m and "main" in m.group(3).split():
                pairs.append((m.group(1), m.group(2)))
    return [(u, s) for u, s in dict.fromkeys(pairs) if s in ("bookworm", "bookworm-security", "bookworm-updates")]


def apt(args, apt_dir: Path, **kw):
    opts = ["-o", f"Dir::Etc::SourceList={apt_dir / 'sources.list'}", "-o", "Dir::Etc::SourceParts=/nonexistent",
            "-o", f"Dir::State::Lists={apt_dir / 'lists'}", "-o", f"Dir::Cache={apt_dir / 'cache'}",
            "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root"]
    return run(["apt-get", "-q", *opts, *args], **kw)


def private_apt(work: Path, sources: bool = False) -> Path:
    """A private apt configuration under ``work/apt`` for the machine's own Debian mirrors (``deb`` lines, and
    ``deb-src`` ones with ``sources``), its lists updated; the machine's apt setup is not touched."""
    apt_dir = work / "apt"
    (apt_dir / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (apt_dir / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    found = mirrors()
    if not found:
        raise SystemExit("k8s-local: no bookworm Debian mirror in /etc/apt (sources.list or *.sources)")
    lines = []
    for uri, suite in found:
        lines += [f"deb {uri} {suite} main"] + ([f"deb-src {uri} {suite} main"] if sources else [])
    (apt_dir / "sources.list").write_text("\n".join(lines) + "\n")
    say("apt-get update (private lists: %s)" % ", ".join("%s %s" % p for p in found))
    apt(["update"], apt_dir, stdout=subprocess.DEVNULL)
    return apt_dir


def fetch(work: Path) -> Path:
    """Debian's kubernetes source tree and the tools (Go, etcd), unpacked under ``work``; returns the tree."""
    apt_dir = private_apt(work, sources=True)
    src = work / "src"
    src.mkdir(exist_ok=True)
    if not list(src.glob("kubernetes_*.dsc")):
        say(f"apt-get source kubernetes={KUBE_VERSION} (about 130 MB)")
        apt(["source", "--download-only", f"kubernetes={KUBE_VERSION}"], apt_dir, cwd=src, stdout=subprocess.DEVNULL)
    tools = work / "tools"
    tools.mkdir(exist_ok=True)
    debs = work / "debs"
    debs.mkdir(exist_ok=True)
    for pkg in TOOLS:
        if not list(debs.glob(f"{pkg}_*.deb")):
            apt(["download", pkg], apt_dir, cwd=debs, stdout=subprocess.DEVNULL)
    for deb in sorted(debs.glob("*.deb")):
        run(["dpkg-deb", "-x", deb, tools])
    tree = work / "kubernetes"
    if not tree.exists():
        dsc = sorted(src.glob("kubernetes_*.dsc"))[-1]
        say(f"dpkg-source -x {dsc.name}")
        run(["dpkg-source", "-x", "--no-check", dsc, tree], stdout=subprocess.DEVNULL)
        for copy in work.glob("kubernetes_*.orig*.tar.*"):  # dpkg-source's copy next to the tree
            copy.unlink()
    return tree


def build(args) -> int:
    if all((BIN / c).exists() for c in COMPONENTS + ("etcd",)) and not args.force:
        say(f"binaries are cached in {BIN} (--force rebuilds)")
        return 0
    work = BUILT / "build"
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    tree = fetch(work)
    goroot = work / "tools" / "usr" / "lib" / "go-1.19"
    version_file = work / "kube-version"
    version_file.write_text(f"KUBE_GIT_VERSION='{KUBE_GIT_VERSION}'\nKUBE_GIT_TREE_STATE='clean'\n"
                            "KUBE_GIT_COMMIT='debian'\n")
    env = dict((k, v) for k, v in os.environ.items() if k not in ("GOFLAGS", "GO111MODULE", "GOPATH"))
    env.update(GOROOT=str(goroot), PATH=f"{goroot}/bin:{env.get('PATH', '')}", CGO_ENABLED="0", GOPROXY="off",
               KUBE_GIT_VERSION_FILE=str(version_file), GOCACHE=str(work / "gocache"),
               GOPATH=str(work / "gopath"), HOME=env.get("HOME", "/root"))
    say("make WHAT=%s (about 7 minutes on 2 cores the first time)" % " ".join("cmd/" + c for c in COMPONENTS))
    run(["make", "WHAT=" + " ".join("cmd/" + c for c in COMPONENTS)], cwd=tree, env=env)
    BIN.mkdir(parents=True, exist_ok=True)
    out = tree / "_output" / "local" / "go" / "bin"
    if not out.exists():
        out = next(p for p in (tree / "_output").rglob("kube-apiserver")).parent
    for c in COMPONENTS:
        shutil.copy2(out / c, BIN / c)
    for c in ("etcd", "etcdctl"):
        shutil.copy2(work / "tools" / "usr" / "bin" / c, BIN / c)  # not /etc/init.d/etcd
    (BIN / "VERSION").write_text(json.dumps({"kubernetes": KUBE_VERSION, "git": KUBE_GIT_VERSION,
                                             "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                             "seconds": round(time.time() - t0)}) + "\n")
    if not args.keep_tree:
        shutil.rmtree(tree, ignore_errors=True)  # 3 GB; the .dsc and tarballs stay for a rebuild
        shutil.rmtree(work / "gocache", ignore_errors=True)
    say(f"built in {time.time() - t0:.0f}s: " + ", ".join(sorted(p.name for p in BIN.iterdir())))
    return 0


# --------------------------------------------------------------------------- certificates

def openssl(*args, **kw):
    return run(["openssl", *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)


def cert(name: str, subject: str, ca: bool = False, sans: str | None = None, client: bool = False):
    key, crt = PKI / f"{name}.key", PKI / f"{name}.crt"
    if crt.exists():
        return
    openssl("genrsa", "-out", key, "2048")
    if ca:
        openssl("req", "-x509", "-new", "-nodes", "-key", key, "-subj", subject, "-days", "3650", "-out", crt)
        return
    ext = PKI / f"{name}.ext"
    usage = "clientAuth" if client else "serverAuth,clientAuth"
    ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                   f"extendedKeyUsage={usage}\n" + (f"subjectAltName={sans}\n" if sans else ""))
    csr = PKI / f"{name}.csr"
    openssl("req", "-new", "-key", key, "-subj", subject, "-out", csr)
    openssl("x509", "-req", "-in", csr, "-CA", PKI / "ca.crt", "-CAkey", PKI / "ca.key", "-CAcreateserial",
            "-days", "3650", "-out", crt, "-extfile", ext)


def kubeconfig(path: Path, user: str) -> None:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "local",
        "clusters": [{"name": "local", "cluster": {"server": f"https://127.0.0.1:{API_PORT}",
                                                   "certificate-authority": str(PKI / "ca.crt")}}],
        "users": [{"name": user, "user": {"client-certificate": str(PKI / f"{user}.crt"),
                                          "client-key": str(PKI / f"{user}.key")}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
    }, indent=1) + "\n")


def pki() -> None:
    PKI.mkdir(parents=True, exist_ok=True)
    os.chmod(PKI, 0o700)
    cert("ca", "/CN=multinode-deepspeed-local-ca", ca=True)
    cert("apiserver", "/CN=kube-apiserver",
         sans="IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
              "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local")
    cert("admin", "/O=system:masters/CN=admin", client=True)
    cert("controller-manager", "/CN=system:kube-controller-manager", client=True)
    cert("scheduler", "/CN=system:kube-scheduler", client=True)
    # The apiserver's identity at the kubelet (logs, exec): the kubelet trusts only this CA's client certs.
    cert("apiserver-kubelet-client", "/O=system:masters/CN=kube-apiserver-kubelet-client", client=True)
    if not (PKI / "sa.key").exists():
        openssl("genrsa", "-out", PKI / "sa.key", "2048")
        openssl("rsa", "-in", PKI / "sa.key", "-pubout", "-out", PKI / "sa.pub")
    kubeconfig(KUBECONFIG, "admin")
    kubeconfig(PKI / "controller-manager.kubeconfig", "controller-manager")
    kubeconfig(PKI / "scheduler.kubeconfig", "scheduler")


# --------------------------------------------------------------------------- up, down, status

def start(name: str, argv: list) -> None:
    RUN.mkdir(parents=True, exist_ok=True)
    log = open(RUN / f"{name}.log", "ab")
    proc = subprocess.Popen([str(a) for a in argv], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    (RUN / f"{name}.pid").write_text(str(proc.pid))


def alive(name: str) -> bool:
    try:
        pid = int((RUN / f"{name}.pid").read_text())
        os.kill(pid, 0)
        return True
    except (OSError, ValueError):
        return False


def ready(timeout: float = 0.0) -> bool:
    ctx = ssl.create_default_context(cafile=str(PKI / "ca.crt"))
    ctx.load_cert_chain(str(PKI / "admin.crt"), str(PKI / "admin.key"))
    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{API_PORT}/readyz", context=ctx, timeout=2) as r:
                if r.read().strip() == b"ok":
                    return True
        except OSError:
            pass
        if time.time() >= deadline:
            return False
        time.sleep(0.5)


def up(args) -> int:
    missing = [c for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd")
               if not (BIN / c).exists()]
    if missing:
        raise SystemExit(f"k8s-local: {', '.join(missing)} not built. Fix: scripts/k8s-local build")
    if (RUN / "kube-apiserver.pid").exists() and ready():
        say(f"already up: KUBECONFIG={KUBECONFIG}")
        return 0
    t0 = time.time()
    pki()
    start("etcd", [BIN / "etcd", "--name", "local", "--data-dir", RUN / "etcd",
                   "--listen-client-urls", f"http://127.0.0.1:{ETCD_PORT}",
                   "--advertise-client-urls", f"http://127.0.0.1:{ETCD_PORT}",
                   "--listen-peer-urls", f"http://127.0.0.1:{ETCD_PEER_PORT}",
                   "--initial-advertise-peer-urls", f"http://127.0.0.1:{ETCD_PEER_PORT}",
                   "--initial-cluster", f"local=http://127.0.0.1:{ETCD_PEER_PORT}"])
    start("kube-apiserver", [
        BIN / "kube-apiserver", f"--etcd-servers=http://127.0.0.1:{ETCD_PORT}", "--bind-address=127.0.0.1",
        "--advertise-address=127.0.0.1", f"--secure-port={API_PORT}",
        f"--tls-cert-file={PKI / 'apiserver.crt'}", f"--tls-private-key-file={PKI / 'apiserver.key'}",
        f"--client-ca-file={PKI / 'ca.crt'}", f"--service-account-key-file={PKI / 'sa.pub'}",
        f"--service-account-signing-key-file={PKI / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-cluster-ip-range={SERVICE_RANGE}", "--authorization-mode=Node,RBAC", "--allow-privileged=true",
        f"--kubelet-client-certificate={PKI / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={PKI / 'apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={PKI / 'ca.crt'}",
        "--kubelet-preferred-address-types=Hostname,InternalIP"])
    if not ready(60):
        raise SystemExit(f"k8s-local: the apiserver did not become ready in 60 s; see {RUN / 'kube-apiserver.log'}")
    start("kube-controller-manager", [
        BIN / "kube-controller-manager", f"--kubeconfig={PKI / 'controller-manager.kubeconfig'}",
        "--bind-address=127.0.0.1", "--secure-port=0", "--port=0",
        f"--service-account-private-key-file={PKI / 'sa.key'}", f"--root-ca-file={PKI / 'ca.crt'}",
        "--use-service-account-credentials=true", "--controllers=*,-nodeipam",
        # A test cluster: a node that stops reporting is noticed in seconds, not 40 s.
        "--node-monitor-period=2s", "--node-monitor-grace-period=12s"])
    start("kube-scheduler", [BIN / "kube-scheduler", f"--kubeconfig={PKI / 'scheduler.kubeconfig'}",
                             "--bind-address=127.0.0.1", "--secure-port=0", "--port=0"])
    time.sleep(1)
    dead = [n for n in ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler") if not alive(n)]
    if dead:
        raise SystemExit(f"k8s-local: {', '.join(dead)} exited; see {RUN}/<name>.log")
    say(f"up in {time.time() - t0:.1f}s: apiserver https://127.0.0.1:{API_PORT}, KUBECONFIG={KUBECONFIG}")
    return 0


def down(args) -> int:
    if node_running():
        kubelet_down(args)
    for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd", "kubelet"):
        try:
            pid = int((RUN / f"{name}.pid").read_text())
            os.killpg(pid, signal.SIGTERM)
            for _try in range(50):
                os.kill(pid, 0)
                time.sleep(0.1)
            os.killpg(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass
    shutil.rmtree(RUN, ignore_errors=True)
    say("down")
    return 0


def status(args) -> int:
    up_now = KUBECONFIG.exists() and (PKI / "ca.crt").exists() and ready()
    names = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
    states = ", ".join("%s %s" % (n, "running" if alive(n) else "stopped") for n in names)
    say("%s; %s" % ("ready" if up_now else "not ready", states))
    return 0 if up_now else 1


# --------------------------------------------------------------------------- nodes with no kubelet

def api(method: str, path: str, body=None, content_type: str = "application/json"):
    """One call to the apiserver as admin; the decoded answer, or None for 404."""
    ctx = ssl.create_default_context(cafile=str(PKI / "ca.crt"))
    ctx.load_cert_chain(str(PKI / "admin.crt"), str(PKI / "admin.key"))
    req = urllib.request.Request(f"https://127.0.0.1:{API_PORT}{path}", method=method,
                                 data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": content_type, "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise SystemExit(f"k8s-local: {method} {path}: {exc.code} {exc.read().decode(errors='replace')[:300]}")


def node_status(resources: dict, ready: bool = True) -> dict:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    res = {"cpu": "16", "memory": "64Gi", "pods": "110"}
    res.update(resources)
    return {"status": {"capacity": res, "allocatable": res, "conditions": [
        {"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady",
         "message": "k8s-local node (no kubelet: its status comes from the test)", "lastHeartbeatTime": now,
         "lastTransitionTime": now}]}}


def node(args) -> int:
    """Nodes whose capacity comes from the caller: created, then kept Ready (a heartbeat every 2 s) for
    --for seconds or until this process is stopped; what a kubelet would report, with no kubelet."""
    resources = dict(r.split("=", 1) for r in args.resource)
    for name in args.names:
        if api("GET", f"/api/v1/nodes/{name}") is None:
            api("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": name, "labels": {"kubernetes.io/hostname": name, "multinode-deepspeed.io/k8s-local": "fake"}}})
        api("PATCH", f"/api/v1/nodes/{name}/status", node_status(resources), "application/merge-patch+json")
    say(f"nodes {', '.join(args.names)}: ready with {resources or 'no extended resources'}")
    deadline = time.time() + args.seconds if args.seconds else None
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    while deadline is None or time.time() < deadline:
        time.sleep(2)
        for name in args.names:
            api("PATCH", f"/api/v1/nodes/{name}/status", node_status(resources), "application/merge-patch+json")
    return 0


def unnode(args) -> int:
    for name in args.names:
        api("DELETE", f"/api/v1/nodes/{name}")
    return 0


# --------------------------------------------------------------------------- a real node: containerd + kubelet

NODE = CACHE / "node"                      # the node's state (containerd, kubelet, CNI, logs); removed by down
TOOLS_DIR = BUILT / "tools"                # containerd, runc, CNI plugins, busybox: extracted .debs (kept)
NODE_PACKAGES = ("containerd", "runc", "containernetworking-plugins", "busybox-static")
KUBELET_PORT = int(os.environ.get("MNDS_K8S_KUBELET_PORT", 20250))
KUBELET_HEALTHZ_PORT = int(os.environ.get("MNDS_K8S_KUBELET_HEALTHZ_PORT", 20248))
BRIDGE = "mndsk8s0"
CGROUP_ROOT = "mnds-k8s"
SANDBOX_IMAGE = "localhost/mnds-k8s-pause:busybox"
CLUSTER_DOMAIN = "cluster.local"
# Paths the 1.20 kubelet, containerd 1.6 and libcni use whatever their flags say; removed by down when this
# node made them.
FIXED_DIRS = ("/var/lib/kubelet", "/var/log/pods", "/var/lib/cni", "/run/containerd")


def sock() -> Path:
    return NODE / "containerd.sock"


def tool(rel: str) -> Path:
    return TOOLS_DIR / rel


def fetch_node_tools() -> None:
    """containerd, runc, the CNI plugins and busybox-static from the machine's Debian mirrors, extracted into
    TOOLS_DIR (once: its ``.done`` lists the packages)."""
    done = TOOLS_DIR / ".done"
    if done.exists() and done.read_text().split() == list(NODE_PACKAGES):
        return
    work = BUILT / "node-debs"
    apt_dir = private_apt(work)
    say("apt-get download %s" % " ".join(NODE_PACKAGES))
    for pkg in NODE_PACKAGES:
        if not list(work.glob(f"{pkg}_*.deb")):
            apt(["download", pkg], apt_dir, cwd=work, stdout=subprocess.DEVNULL)
    shutil.rmtree(TOOLS_DIR, ignore_errors=True)
    TOOLS_DIR.mkdir(parents=True)
    for pkg in NODE_PACKAGES:
        run(["dpkg-deb", "-x", sorted(work.glob(f"{pkg}_*.deb"))[-1], TOOLS_DIR])
    done.write_text("\n".join(NODE_PACKAGES) + "\n")


def docker_archive(files: dict, tag: str, out: Path, entrypoint=None, cmd=None) -> None:
    """A one-layer docker-archive tarball (what ``ctr images import`` reads), stdlib only.  ``files``: path in
    the image -> (bytes, mode) for a file or str for a symlink's target."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        dirs = sorted(set(str(Path(p).parent) for p in files) - {"."})
        for d in dirs:
            ti = tarfile.TarInfo(d)
            ti.type, ti.mode = tarfile.DIRTYPE, 0o755
            t.addfile(ti)
        for path, what in sorted(files.items()):
            ti = tarfile.TarInfo(path)
            if isinstance(what, str):
                ti.type, ti.linkname = tarfile.SYMTYPE, what
                t.addfile(ti)
            else:
                ti.size, ti.mode = len(what[0]), what[1]
                t.addfile(ti, io.BytesIO(what[0]))
    layer = buf.getvalue()
    diff = "sha256:" + hashlib.sha256(layer).hexdigest()
    cfg = json.dumps({"architecture": "amd64", "os": "linux", "created": "2020-01-01T00:00:00Z",
                      "config": {"Entrypoint": entrypoint, "Cmd": cmd, "WorkingDir": "/",
                                 "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]},
                      "rootfs": {"type": "layers", "diff_ids": [diff]}}).encode()
    cfg_name = hashlib.sha256(cfg).hexdigest() + ".json"
    manifest = json.dumps([{"Config": cfg_name, "RepoTags": [tag], "Layers": ["layer.tar"]}]).encode()
    with tarfile.open(out, "w") as t:
        for name, data in ((cfg_name, cfg), ("layer.tar", layer), ("manifest.json", manifest)):
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            t.addfile(ti, io.BytesIO(data))


def sandbox_image() -> Path:
    """The pods' sandbox ("pause") image: busybox-static's binary sleeping (no registry, no compiler)."""
    out = TOOLS_DIR / "sandbox.tar"
    if not out.exists():
        busybox = tool("bin/busybox").read_bytes()
        docker_archive({"bin/busybox": (busybox, 0o755), "bin/sleep": "busybox", "bin/sh": "busybox"},
                       SANDBOX_IMAGE, out, entrypoint=["/bin/sleep", "2147483647"])
    return out


def pod_subnet() -> str:
    """The first 10.<n>.0.0/24 (n from 244) that no route of the machine uses, or the one given."""
    if os.environ.get("MNDS_K8S_POD_SUBNET"):
        return os.environ["MNDS_K8S_POD_SUBNET"]
    routes = subprocess.run(["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True,
                            check=False).stdout
    used = set(re.findall(r"\b10\.(\d+)\.", routes))
    for n in range(244, 255):
        if str(n) not in used:
            return f"10.{n}.0.0/24"
    raise SystemExit("k8s-local: no free 10.244-254.0.0/24 for the pods. Fix: MNDS_K8S_POD_SUBNET=<a.b.c.0/24>")


def gateway(subnet: str) -> str:
    return subnet.rsplit(".", 1)[0] + ".1"


def registry_hosts(registries) -> Path:
    """containerd's registry hosts directory: each ``host:port`` given is read over plain HTTP (a registry the
    caller runs without TLS, e.g. Debian's docker-registry on loopback); every other registry as containerd would."""
    root = NODE / "certs.d"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    for reg in registries or []:
        (root / reg).mkdir()
        (root / reg / "hosts.toml").write_text(
            f'server = "http://{reg}"\n[host."http://{reg}"]\n  capabilities = ["pull", "resolve"]\n')
    return root


def containerd_config(subnet: str) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f'''version = 2
root = "{NODE / 'containerd-root'}"
state = "{NODE / 'containerd-state'}"
[grpc]
  address = "{sock()}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{NODE / 'opt'}"
[{cri}]
  sandbox_image = "{SANDBOX_IMAGE}"
  # root here lacks CAP_SYS_RESOURCE: the sandbox's oom_score_adj -998 would fail every RunPodSandbox
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_cdi = false
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  BinaryName = "{tool('usr/sbin/runc')}"
  Root = "{NODE / 'runc'}"
[{cri}.cni]
  bin_dir = "{tool('usr/lib/cni')}"
  conf_dir = "{NODE / 'cni'}"
[{cri}.registry]
  config_path = "{NODE / 'certs.d'}"
'''


def cni_config(subnet: str) -> dict:
    return {"cniVersion": "0.4.0", "name": "mnds-k8s", "plugins": [
        {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False, "hairpinMode": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet, "gateway": gateway(subnet)}]],
                  "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(NODE / "cni-ipam")}},
        {"type": "loopback"}]}


def kubelet_config(dns_ip: str) -> dict:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": "127.0.0.1", "port": KUBELET_PORT, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": KUBELET_HEALTHZ_PORT,
        "cgroupDriver": "cgroupfs", "cgroupRoot": "/" + CGROUP_ROOT, "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"], "failSwapOn": False,
        "tlsCertFile": str(PKI / "kubelet.crt"), "tlsPrivateKeyFile": str(PKI / "kubelet.key"),
        # Only the apiserver (its kubelet-client cert from this CA) may read logs or exec.
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(PKI / "ca.crt")}},
        "authorization": {"mode": "AlwaysAllow"},
        "clusterDNS": [dns_ip], "clusterDomain": CLUSTER_DOMAIN, "resolvConf": "/etc/resolv.conf",
        "volumePluginDir": str(NODE / "volume-plugins"),
        # The imported images cannot be pulled again: never collect them.
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "serializeImagePulls": False, "nodeStatusUpdateFrequency": "2s",
    }


def cgroup_dirs() -> list:
    """The node's cgroupRoot in every hierarchy (v1: one per controller; v2: the one tree)."""
    base = Path("/sys/fs/cgroup")
    if (base / "cgroup.controllers").exists():
        return [base / CGROUP_ROOT]
    return [d / CGROUP_ROOT for d in sorted(base.iterdir()) if d.is_dir() and (d / "cgroup.procs").exists()]


def ctr(*args, **kw):
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("check", False)
    return run([tool("usr/bin/ctr"), "-a", sock(), "-n", "k8s.io", *args], **kw)


def node_alive(name: str) -> bool:
    try:
        os.kill(int((NODE / f"{name}.pid").read_text()), 0)
        return True
    except (OSError, ValueError):
        return False


def node_running() -> bool:
    return any(node_alive(n) for n in ("kubelet", "containerd", "dns"))


def node_start(name: str, argv: list, env=None) -> None:
    log = open(NODE / f"{name}.log", "ab")
    proc = subprocess.Popen([str(a) for a in argv], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, env=env)
    (NODE / f"{name}.pid").write_text(str(proc.pid))


def node_stop(name: str, seconds: float = 10) -> None:
    try:
        pid = int((NODE / f"{name}.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        for _try in range(int(seconds * 10)):
            os.kill(pid, 0)
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass


def node_name() -> str:
    return socket.gethostname().lower()


def import_images(paths) -> float:
    t0 = time.time()
    for path in paths:
        res = ctr("images", "import", "--no-unpack", str(path))
        if res.returncode != 0:
            raise SystemExit(f"k8s-local: ctr images import {path}: {res.stderr.strip()}")
    return time.time() - t0


def kubelet_up(args) -> int:
    if not (BIN / "kubelet").exists():
        raise SystemExit("k8s-local: kubelet not built. Fix: scripts/k8s-local build")
    if not ready():
        raise SystemExit("k8s-local: the control plane is not up. Fix: scripts/k8s-local up")
    if node_alive("kubelet") and node_alive("containerd"):
        say(f"kubelet already up (node {node_name()})")
        return 0
    name = node_name()
    try:
        addrs = set(a[4][0] for a in socket.getaddrinfo(name, None))
    except OSError:
        addrs = set()
    if not any(a.startswith("127.") or a == "::1" for a in addrs):
        raise SystemExit(f"k8s-local: the hostname {name} does not resolve to a loopback address, and the apiserver "
                         f"reaches the kubelet (on 127.0.0.1) by it. Fix: add '127.0.1.1 {name}' to /etc/hosts")
    t0 = time.time()
    fetch_node_tools()
    t_fetch = time.time() - t0
    for sub in ("cni", "cni-ipam", "kubelet-root", "kubelet-certs", "volume-plugins", "opt"):
        (NODE / sub).mkdir(parents=True, exist_ok=True)
    made = [d for d in FIXED_DIRS if not os.path.exists(d)]
    old = NODE / "made-dirs"
    made = sorted(set(made) | set(old.read_text().split() if old.exists() else []))
    old.write_text("\n".join(made) + "\n")
    subnet = pod_subnet()
    gw = gateway(subnet)
    (NODE / "subnet").write_text(subnet + "\n")
    (NODE / "containerd.toml").write_text(containerd_config(subnet))
    registry_hosts(args.insecure_registry)
    (NODE / "cni" / "10-mnds-k8s.conflist").write_text(json.dumps(cni_config(subnet), indent=1) + "\n")
    # The bridge first, so that the DNS can listen on its gateway before the first pod.
    if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True, check=False).returncode != 0:
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
    run(["ip", "addr", "replace", f"{gw}/{subnet.rsplit('/', 1)[1]}", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])
    for d in cgroup_dirs():
        d.mkdir(exist_ok=True)
    host = name
    cert("kubelet", f"/O=system:nodes/CN=system:node:{host}", sans=f"DNS:{host},DNS:localhost,IP:127.0.0.1")
    kubeconfig(NODE / "kubelet.kubeconfig", "kubelet")
    (NODE / "kubelet-config.yaml").write_text(json.dumps(kubelet_config(gw), indent=1) + "\n")
    env = dict(os.environ, PATH=f"{tool('usr/bin')}:{tool('usr/sbin')}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    node_start("dns", [sys.executable, Path(__file__).resolve(), "dns", "--listen", gw])
    node_start("containerd", [tool("usr/bin/containerd"), "--config", NODE / "containerd.toml"], env=env)
    deadline = time.time() + 30
    while ctr("version").returncode != 0:
        if time.time() > deadline or not node_alive("containerd"):
            raise SystemExit(f"k8s-local: containerd did not answer in 30 s; see {NODE / 'containerd.log'}")
        time.sleep(0.1)
    t1 = time.time()
    import_images([sandbox_image()] + list(args.images or []))
    t2 = time.time()
    node_start("kubelet", [
        BIN / "kubelet", f"--config={NODE / 'kubelet-config.yaml'}", f"--kubeconfig={NODE / 'kubelet.kubeconfig'}",
        "--container-runtime=remote", f"--container-runtime-endpoint=unix://{sock()}",
        f"--image-service-endpoint=unix://{sock()}", f"--pod-infra-container-image={SANDBOX_IMAGE}",
        f"--root-dir={NODE / 'kubelet-root'}", f"--cert-dir={NODE / 'kubelet-certs'}",
        f"--hostname-override={host}", "--register-node=true", "--v=2"], env=env)
    deadline = time.time() + 120
    while True:
        got = api("GET", f"/api/v1/nodes/{host}")
        if got and any(c.get("type") == "Ready" and c.get("status") == "True"
                       for c in (got.get("status") or {}).get("conditions") or []):
            break
        if time.time() > deadline or not node_alive("kubelet") or not node_alive("dns"):
            raise SystemExit(f"k8s-local: node {host} not Ready in 120 s; see {NODE}/kubelet.log, dns.log")
        time.sleep(0.25)
    t3 = time.time()
    say(f"kubelet up: node {host} Ready, pods on {subnet} (bridge {BRIDGE}), cluster DNS {gw}:53; "
        f"tools {t_fetch:.1f}s, containerd {t1 - t0 - t_fetch:.1f}s, images {t2 - t1:.1f}s, "
        f"kubelet to Ready {t3 - t2:.1f}s, total {t3 - t0:.1f}s")
    return 0


def shim_pids() -> list:
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and b"containerd-shim" in argv[0] and str(sock()).encode() in argv:
            out.append(int(proc.name))
    return out


def cgroup_pids() -> set:
    pids = set()
    for d in cgroup_dirs():
        if d.exists():
            for procs in d.rglob("cgroup.procs"):
                try:
                    pids.update(int(p) for p in procs.read_text().split())
                except OSError:
                    pass
    return pids


def kubelet_down(args) -> int:
    """Everything kubelet_up made, gone: pods' containers, kubelet, containerd, shims, DNS, mounts, cgroups,
    bridge, the node's state; the Node object too when the apiserver answers."""
    host = node_name()
    node_stop("kubelet")
    if sock().exists() and node_alive("containerd"):
        for task in ctr("tasks", "ls", "-q").stdout.split():
            ctr("tasks", "kill", "-s", "SIGKILL", task)
        deadline = time.time() + 10
        while ctr("tasks", "ls", "-q").stdout.split() and time.time() < deadline:
            time.sleep(0.2)
    node_stop("containerd")
    node_stop("dns", 2)
    for pid in shim_pids() + sorted(cgroup_pids()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.time() + 10
    while (shim_pids() or cgroup_pids()) and time.time() < deadline:
        time.sleep(0.2)
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    prefixes = (str(NODE) + "/", "/run/containerd/", "/var/lib/kubelet/")
    for m in sorted((m for m in mounts if m.startswith(prefixes)), key=len, reverse=True):
        if subprocess.run(["umount", m], capture_output=True, check=False).returncode != 0:
            subprocess.run(["umount", "-l", m], capture_output=True, check=False)
    for d in cgroup_dirs():
        if d.exists():
            for sub in sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                try:
                    sub.rmdir()
                except OSError:
                    pass
            try:
                d.rmdir()
            except OSError:
                pass
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True, check=False)
    made = NODE / "made-dirs"
    for d in (made.read_text().split() if made.exists() else []):
        shutil.rmtree(d, ignore_errors=True)
    if (PKI / "ca.crt").exists() and ready():
        try:
            api("DELETE", f"/api/v1/nodes/{host}")
        except SystemExit:
            pass
    shutil.rmtree(NODE, ignore_errors=True)
    left = shim_pids() + sorted(cgroup_pids())
    say("kubelet down" + (f"; still running: {left}" if left else ""))
    return 1 if left else 0


def kubelet_status(args) -> int:
    names = ("containerd", "kubelet", "dns")
    say(", ".join("%s %s" % (n, "running" if node_alive(n) else "stopped") for n in names))
    return 0 if all(node_alive(n) for n in names) else 1


def kubelet_cmd(args) -> int:
    if args.action == "import":
        if not node_alive("containerd"):
            raise SystemExit("k8s-local: the node is not up. Fix: scripts/k8s-local kubelet up")
        say(f"imported {len(args.images)} image(s) in {import_images(args.images):.1f}s")
        return 0
    return {"up": kubelet_up, "down": kubelet_down, "status": kubelet_status}[args.action](args)


# --------------------------------------------------------------------------- the cluster DNS

DNS_A, DNS_AAAA = 1, 28


def dns_parse(packet: bytes):
    """(id, flags, qname lower-case without the final dot, qtype, qclass, offset after the question)."""
    if len(packet) < 12:
        raise ValueError("short DNS packet")
    ident, flags, qdcount = struct.unpack("!HHH", packet[:6])
    if qdcount < 1:
        raise ValueError("no question")
    labels, pos = [], 12
    while True:
        if pos >= len(packet):
            raise ValueError("truncated name")
        n = packet[pos]
        pos += 1
        if n == 0:
            break
        if n & 0xC0:
            raise ValueError("compressed question name")
        labels.append(packet[pos:pos + n].decode("ascii", "replace").lower())
        pos += n
    if pos + 4 > len(packet):
        raise ValueError("truncated question")
    qtype, qclass = struct.unpack("!HH", packet[pos:pos + 4])
    return ident, flags, ".".join(labels), qtype, qclass, pos + 4


def dns_answer(packet: bytes, ips, rcode: int = 0, ttl: int = 5) -> bytes:
    """The reply to ``packet`` (one question): A records for ``ips`` (when the question asks for A), ``rcode``
    (0 NOERROR, 2 SERVFAIL, 3 NXDOMAIN)."""
    ident, flags, _name, qtype, _qclass, end = dns_parse(packet)
    answers = [socket.inet_aton(ip) for ip in ips] if qtype == DNS_A and rcode == 0 else []
    reply_flags = 0x8000 | (flags & 0x7900) | 0x0400 | 0x0080 | (rcode & 0xF)  # QR, opcode+RD, AA, RA
    out = struct.pack("!HHHHHH", ident, reply_flags, 1, len(answers), 0, 0) + packet[12:end]
    for addr in answers:
        out += struct.pack("!HHHIH", 0xC00C, DNS_A, 1, ttl, 4) + addr
    return out


def dns_lookup(name: str, get, domain: str = CLUSTER_DOMAIN):
    """The IPs of a cluster name, or None (no such name).  ``get(path)`` reads the API (None for 404).
    ``<hostname>.<subdomain>.<ns>.svc.<domain>``: the pods with that spec.hostname and spec.subdomain;
    ``<service>.<ns>.svc.<domain>``: a headless Service's endpoints, else its cluster IP."""
    suffix = ".svc." + domain
    if not name.endswith(suffix):
        return None
    parts = name[:-len(suffix)].split(".")
    if len(parts) == 3:
        host, sub, ns = parts
        pods = (get(f"/api/v1/namespaces/{ns}/pods") or {}).get("items") or []
        ips = [p["status"]["podIP"] for p in pods
               if (p.get("spec") or {}).get("hostname") == host and p["spec"].get("subdomain") == sub
               and (p.get("status") or {}).get("podIP") and not p["metadata"].get("deletionTimestamp")]
        return ips or None
    if len(parts) == 2:
        svc, ns = parts
        service = get(f"/api/v1/namespaces/{ns}/services/{svc}")
        if not service:
            return None
        cluster_ip = (service.get("spec") or {}).get("clusterIP")
        if cluster_ip and cluster_ip != "None":
            return [cluster_ip]
        eps = get(f"/api/v1/namespaces/{ns}/endpoints/{svc}") or {}
        ips = [a["ip"] for s in eps.get("subsets") or [] for a in (s.get("addresses") or []) +
               (s.get("notReadyAddresses") or []) if a.get("ip")]
        return ips or None
    return None


def dns_serve(args) -> int:
    """A small DNS for the pods: cluster names from the API, anything else forwarded to the machine's resolver."""
    upstream = [line.split()[1] for line in Path("/etc/resolv.conf").read_text().splitlines()
                if line.startswith("nameserver") and len(line.split()) > 1][:1]
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    srv.bind((args.listen, args.port))
    print(f"cluster DNS on {args.listen}:{args.port}, upstream {upstream}", flush=True)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))

    def get(path):
        return api("GET", path)

    def answer(packet, peer):
        try:
            _ident, _flags, name, qtype, _qclass, _end = dns_parse(packet)
        except ValueError:
            return
        try:
            if name == CLUSTER_DOMAIN or name.endswith("." + CLUSTER_DOMAIN):
                ips = dns_lookup(name, get)
                reply = dns_answer(packet, ips or [], 0 if ips else 3)
                print(f"{peer[0]} {name} {qtype}: {ips or 'NXDOMAIN'}", flush=True)
            elif upstream:
                fwd = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                fwd.settimeout(3)
                try:
                    fwd.sendto(packet, (upstream[0], 53))
                    reply = fwd.recv(4096)
                finally:
                    fwd.close()
            else:
                reply = dns_answer(packet, [], 3)
        except (OSError, SystemExit) as exc:
            print(f"{peer[0]} {name}: SERVFAIL ({exc})", flush=True)
            reply = dns_answer(packet, [], 2)
        srv.sendto(reply, peer)

    while True:
        packet, peer = srv.recvfrom(4096)
        threading.Thread(target=answer, args=(packet, peer), daemon=True).start()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="scripts/k8s-local", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    b = sub.add_parser("build")
    b.add_argument("--force", action="store_true")
    b.add_argument("--keep-tree", action="store_true", help="keep the 3 GB source tree after the build")
    sub.add_parser("up")
    sub.add_parser("down")
    sub.add_parser("status")
    n = sub.add_parser("node", help="nodes with no kubelet, their capacity from the caller, kept ready while this runs")
    n.add_argument("names", nargs="+")
    n.add_argument("--resource", action="append", default=[], metavar="NAME=COUNT",
                   help="an allocatable resource, e.g. nvidia.com/gpu=2 (repeat)")
    n.add_argument("--for", dest="seconds", type=float, default=0, help="stop reporting after this long (0: never)")
    u = sub.add_parser("unnode", help="delete nodes")
    u.add_argument("names", nargs="+")
    k = sub.add_parser("kubelet", help="a real node on this machine: containerd + the kubelet + a cluster DNS")
    k.add_argument("action", choices=("up", "down", "status", "import"))
    k.add_argument("images", nargs="*", help="docker-archive tarballs to import into the node's containerd")
    k.add_argument("--insecure-registry", action="append", default=[], metavar="HOST:PORT",
                   help="a registry the node pulls from over plain HTTP (repeat)")
    d = sub.add_parser("dns", help=argparse.SUPPRESS)
    d.add_argument("--listen", required=True)
    d.add_argument("--port", type=int, default=53)
    args = p.parse_args(argv)
    return {"build": build, "up": up, "down": down, "status": status, "node": node, "unnode": unnode,
            "kubelet": kubelet_cmd, "dns": dns_serve}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
