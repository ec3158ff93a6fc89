#!/usr/bin/env python3
"""A real Kubernetes control plane on this machine, built from Debian's own source package (issue 14).

    scripts/k8s-local build     fetch Debian's kubernetes source, Go 1.19 and etcd (apt, no internet beyond the
                                Debian mirror), build kube-apiserver, kube-controller-manager, kube-scheduler and
                                kubelet once; the binaries are cached under .cache/k8s/bin
    scripts/k8s-local up        certificates (openssl), etcd, apiserver, controller-manager, scheduler on loopback;
                                writes .cache/k8s/admin.kubeconfig; waits for /readyz
    scripts/k8s-local down      stops them and removes their state (the binaries stay)
    scripts/k8s-local status    is it up?
    scripts/k8s-local node N... --resource nvidia.com/gpu=2
                                nodes with no kubelet, whose capacity the caller gives, kept ready while it runs

Nothing of the machine's apt configuration is changed: a private sources list (deb and deb-src lines for the
machine's own Debian mirrors) and private lists and cache directories are passed to apt-get.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("MNDS_K8S_CACHE", ROOT / ".cache" / "k8s"))
BIN = CACHE / "bin"
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
    kw.setdefault("check", True)
    return subprocess.run([str(a) for a in argv], **kw)


# --------------------------------------------------------------------------- fetch and build

def mirrors() -> list:
    """(uri, suite) pairs of the machine's Debian sources (deb822 .sources files and sources.list)."""
    pairs = []
    files = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for f in files:
        for stanza in f.read_text().split("\n\n"):
            fields = dict((k.strip().lower(), v.strip()) for k, _, v in
                          (line.partition(":") for line in stanza.splitlines() if ":" in line and
                           not line.startswith("#")))
            if "deb" not in fields.get("types", "").split() or "main" not in fields.get("components", "").split():
                continue
            pairs += [(uri, suite) for uri in fields.get("uris", "").split() for suite in fields.get("suites", "").split()]
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


def fetch(work: Path) -> Path:
    """Debian's kubernetes source tree and the tools (Go, etcd), unpacked under ``work``; returns the tree."""
    apt_dir = work / "apt"
    (apt_dir / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (apt_dir / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    found = mirrors()
    if not found:
        raise SystemExit("k8s-local: no bookworm Debian mirror in /etc/apt (sources.list or *.sources)")
    lines = []
    for uri, suite in found:
        lines += [f"deb {uri} {suite} main", f"deb-src {uri} {suite} main"]
    (apt_dir / "sources.list").write_text("\n".join(lines) + "\n")
    say("apt-get update (private lists: %s)" % ", ".join("%s %s" % p for p in found))
    apt(["update"], apt_dir, stdout=subprocess.DEVNULL)
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
    work = CACHE / "build"
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
    missing = [c for c in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd") if not (BIN / c).exists()]
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
        f"--service-cluster-ip-range={SERVICE_RANGE}", "--authorization-mode=Node,RBAC", "--allow-privileged=true"])
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
    for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd", "kubelet"):
        try:
            pid = int((RUN / f"{name}.pid").read_text())
            os.killpg(pid, signal.SIGTERM)
            for _ in range(50):
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
    say("%s; %s" % ("ready" if up_now else "not ready", ", ".join("%s %s" % (n, "running" if alive(n) else "stopped")
                                                                for n in names)))
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
    args = p.parse_args(argv)
    return {"build": build, "up": up, "down": down, "status": status, "node": node, "unnode": unnode}[args.what](args)


if __name__ == "__main__":
    sys.exit(main())
