"""Local multi-node cluster for demos and tests: podman containers with sshd.

Each node is a separate host (its own network namespace, hostname, sshd and
host keys) on a private podman network.  The default topology follows the
field notes: one CPU-only ``coordinator`` and two ``workers``.

    scripts/localcluster.py up [--workers N]   # build/cached image, start nodes, write inventory, check names + SSH
    scripts/localcluster.py check              # check again: every node resolves and reaches every node
    scripts/localcluster.py disconnect NODE    # cut NODE off the cluster network (fault tests)
    scripts/localcluster.py connect NODE       # put it back, at its own address
    scripts/localcluster.py down               # remove containers, network, volume and keys
    scripts/localcluster.py status

Node names resolve through podman's DNS (netavark + aardvark-dns, installed by
scripts/setup), and every node has a fixed address on the cluster network, so a
restarted or reconnected node keeps it.

Podman is always driven with the project's own containers.conf (through
CONTAINERS_CONF), never the machine's /etc.
"""
from __future__ import annotations

import argparse
import hashlib
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / ".cache"
# What is built once for this machine (the node image's tarball, the nodes' compiler cache) is kept outside the
# clone, so that a fresh clone finds it: ~/.cache/multinode-deepspeed/dev, or MNDS_DEV_CACHE.
DEV_CACHE = Path(os.environ.get("MNDS_DEV_CACHE", Path.home() / ".cache" / "multinode-deepspeed" / "dev"))
# MNDS_CLUSTER_PREFIX names a second cluster beside the first (the suite's second lane of end-to-end tests):
# its containers, network and volume carry the prefix, and its keys, inventory and mounts have folders of their
# own (.cluster-<prefix>, inventories/local-<prefix>, .cache/mounts-<prefix>).  The node image is the same.
DEFAULT_PREFIX = "mnds"
PREFIX = os.environ.get("MNDS_CLUSTER_PREFIX", DEFAULT_PREFIX)
SUFFIX = "" if PREFIX == DEFAULT_PREFIX else f"-{PREFIX}"
CLUSTER = ROOT / f".cluster{SUFFIX}"
INVENTORY_DIR = ROOT / "inventories" / f"local{SUFFIX}"
NETWORK = f"{PREFIX}-net"
VOLUME = f"{PREFIX}-shared"
SHARED_MOUNT = "/shared"
# A directory of this machine that every node sees at HOST_MOUNT, with mounts made under it later propagated to
# the nodes: the tests put small file systems there (a shared disk that fills up).
MOUNTS = CACHE / f"mounts{SUFFIX}"
HOST_MOUNT = "/mnt/host"
SUITE = "bookworm"
# What every node image carries.  python3-venv for the stack's venv, pdsh for
# DeepSpeed's launcher, rsync for ansible.posix.synchronize, g++ and the
# Python headers to build DeepSpeed's ops while provisioning.
IMAGE_PACKAGES = [
    "openssh-server", "openssh-client", "python3", "python3-venv", "python3-dev", "g++", "python3-apt", "python3-packaging",
    "pdsh", "rsync", "sudo", "procps", "iproute2", "ca-certificates", "netbase", "less", "cron",
    # The nfs role's packages (server and client), so its tests need no apt mirror.
    "nfs-kernel-server", "nfs-common",
    # The slurm role's packages (daemons, client, munge, accounting with slurmdbd on MariaDB).
    "munge", "slurmctld", "slurmd", "slurm-client", "slurmdbd", "mariadb-server", "python3-pymysql",
    # A compiler cache (COMPILER_CACHE below).
    "ccache",
]
# The nodes' C++ compiles (DeepSpeed's ops, built by role stack and by ds_ops on every fresh node) go through ccache
# (``c++``, ``g++``, ``cc`` and ``gcc`` in /usr/local/bin, ahead of /usr/bin, are its links), with one cache directory
# of this machine shared by every node of every local cluster (DEV_CACHE/ccache at CCACHE_MOUNT): a fresh node still
# runs each build, its compiler served from the cache when another node compiled the same file before.  A node
# without the mount (a molecule scenario's) keeps a cache of its own.  A test that needs a real compile sets
# CCACHE_DISABLE=1.
CCACHE_MOUNT = "/var/cache/mnds-ccache"
CCACHE_CONF = f"""\
# Written by scripts/localcluster.py: the local cluster's shared compiler cache.
cache_dir = {CCACHE_MOUNT}
# Every node's accounts write to it.
umask = 000
# The build directory is not part of a compile's key (nodes build in their own).
hash_dir = false
max_size = 2G
"""
CONTAINERS_CONF = """\
# Written by scripts/localcluster.py; used through CONTAINERS_CONF only.
[containers]
default_ulimits = ["nofile=16384:16384", "nproc=32768:32768"]
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"

[network]
# netavark + aardvark-dns: the cluster network has DNS, so nodes resolve each other by name.
network_backend = "netavark"
"""
# Where Debian (and upstream) install podman's network helpers.
HELPER_DIRS = ["/usr/libexec/podman", "/usr/lib/podman", "/usr/local/libexec/podman", "/usr/local/lib/podman"]
# Node i of the topology (coord first) gets the network's address + ADDRESS_OFFSET + i.
ADDRESS_OFFSET = 10


def log(msg: str) -> None:
    print(f"[localcluster] {msg}", file=sys.stderr, flush=True)


def podman_env() -> dict:
    conf = CACHE / "podman" / "containers.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    if not conf.exists() or conf.read_text() != CONTAINERS_CONF:
        conf.write_text(CONTAINERS_CONF)
    env = dict(os.environ)
    env["CONTAINERS_CONF"] = str(conf)
    return env


def podman(*args: str, check: bool = True, capture: bool = True, input_bytes: bytes | None = None):
    cmd = ["podman", *args]
    res = subprocess.run(cmd, env=podman_env(), input=input_bytes, check=False,
                         stdout=subprocess.PIPE if capture else None,
                         stderr=subprocess.PIPE if capture else None)
    if check and res.returncode != 0:
        err = (res.stderr or b"").decode(errors="replace").strip()
        raise SystemExit(f"[localcluster] podman {' '.join(args[:3])} failed (rc={res.returncode}): {err}")
    return res


def debian_mirror() -> str:
    """The Debian mirror this machine's apt already uses."""
    candidates = []
    for path in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("URIs:"):
                candidates += line.split()[1:]
            elif line.startswith("deb ") and not line.startswith("deb-src"):
                parts = [p for p in line.split() if not p.startswith("[")]
                if len(parts) > 1:
                    candidates.append(parts[1])
    for uri in candidates:
        if "/debian" in uri and "security" not in uri:
            return uri
    return "http://deb.debian.org/debian"


def image_name() -> str:
    digest = hashlib.sha256((SUITE + " ".join(IMAGE_PACKAGES) + START_SCRIPT + CCACHE_CONF).encode()).hexdigest()[:10]
    return f"localhost/{DEFAULT_PREFIX}-node:{SUITE}-{digest}"


def ensure_image() -> str:
    name = image_name()
    if podman("image", "exists", name, check=False).returncode == 0:
        log(f"image {name} cached")
        return name
    tarball = DEV_CACHE / "image" / (name.rsplit("/", maxsplit=1)[-1].replace(":", "_") + ".tar")
    if not tarball.exists():
        if not shutil.which("debootstrap"):
            raise SystemExit("[localcluster] debootstrap is missing: run scripts/setup first")
        tarball.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=tarball.parent) as tmp:
            rootfs = Path(tmp) / "rootfs"
            mirror = debian_mirror()
            log(f"debootstrap {SUITE} from {mirror} (about a minute, cached afterwards)")
            t0 = time.time()
            subprocess.run(["debootstrap", "--variant=minbase", "--include=" + ",".join(IMAGE_PACKAGES),
                            SUITE, str(rootfs), mirror], check=True, stdout=subprocess.DEVNULL)
            # Node hygiene: no host keys baked into the image (each node makes its own
            # at first start), no apt caches.
            for key in (rootfs / "etc" / "ssh").glob("ssh_host_*"):
                key.unlink()
            # No munge key either: the slurm role makes the cluster's one key once, on the coordinator.
            (rootfs / "etc" / "munge" / "munge.key").unlink(missing_ok=True)
            shutil.rmtree(rootfs / "var" / "cache" / "apt" / "archives", ignore_errors=True)
            start = rootfs / START_SCRIPT_PATH.lstrip("/")
            start.write_text(START_SCRIPT)
            start.chmod(0o755)
            install_ccache(rootfs)
            (rootfs / "var" / "cache" / "apt" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
            subprocess.run(["tar", "-C", str(rootfs), "-cf", str(tarball) + ".part", "."], check=True)
            os.replace(str(tarball) + ".part", tarball)
            log(f"debootstrap done in {time.time() - t0:.0f}s")
    with open(tarball, "rb") as fh:
        res = subprocess.run(["podman", "import", "--change", "CMD=/bin/bash", "-", name],
                             stdin=fh, env=podman_env(), check=False, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if res.returncode != 0:
        raise SystemExit(f"[localcluster] podman import failed: {res.stderr.decode(errors='replace')}")
    log(f"image {name} imported")
    prune_old_images(name, tarball)
    return name


def install_ccache(rootfs: Path) -> None:
    """The compiler cache in the image's root file system: its config, its links ahead of the compilers, and its
    directory (the shared one is mounted over it)."""
    (rootfs / "etc" / "ccache.conf").write_text(CCACHE_CONF)
    for compiler in ("c++", "g++", "cc", "gcc"):
        link = rootfs / "usr" / "local" / "bin" / compiler
        link.unlink(missing_ok=True)
        link.symlink_to("/usr/bin/ccache")
    cache = rootfs / CCACHE_MOUNT.lstrip("/")
    cache.mkdir(parents=True, exist_ok=True)
    cache.chmod(0o1777)


def ccache_dir() -> Path:
    """This machine's directory of the nodes' compiler cache (made once, writable by every node's accounts)."""
    path = DEV_CACHE / "ccache"
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o1777)
    return path


def prune_old_images(keep: str, keep_tarball: Path) -> None:
    """Drop node images and tarballs of earlier package lists."""
    for old in (DEV_CACHE / "image").glob(f"{DEFAULT_PREFIX}-node_*.tar"):
        if old != keep_tarball:
            old.unlink()
    res = podman("images", "--format", "{{.Repository}}:{{.Tag}}", f"localhost/{DEFAULT_PREFIX}-node", check=False)
    for ref in res.stdout.decode().split():
        if ref != keep:
            podman("rmi", ref, check=False)


def node_names(workers: int, spares: int = 0) -> list[tuple[str, str]]:
    """(name, group) of every node: the coordinator, the workers, then the spares (named on from the workers:
    worker3 is the spare of a two-worker cluster, as a rack's spare is a node like the others)."""
    nodes = [("coord", "coordinator")]
    nodes += [(f"worker{i}", "workers") for i in range(1, workers + 1)]
    nodes += [(f"worker{i}", "spares") for i in range(workers + 1, workers + spares + 1)]
    return nodes


def container(node: str) -> str:
    return f"{PREFIX}-{node}"


# Baked into the image as START_SCRIPT, so molecule scenarios (whose command is
# one plain string) start nodes the same way.
START_SCRIPT_PATH = "/usr/local/sbin/mnds-node-start"
START_SCRIPT = """#!/bin/sh
# Start a node: its own host keys at first start, then sshd as a service (it can be stopped
# and started again, as on a real machine) and a foreground wait that keeps the node up.
mkdir -p /run/sshd /root/.ssh && chmod 700 /root/.ssh && ssh-keygen -A >/dev/null
/usr/sbin/sshd -E /var/log/sshd.log
trap 'kill $(cat /run/sshd.pid) 2>/dev/null; exit 0' TERM INT
sleep infinity &
wait
"""


def mounted(path: Path) -> list[str]:
    """The mount points at or under ``path`` on this machine, deepest first."""
    points = []
    path = path.resolve()
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            point = line.split()[4].replace("\\040", " ")
            if point == str(path) or point.startswith(str(path) + "/"):
                points.append(point)
    return sorted(set(points), key=len, reverse=True)


def ensure_mounts() -> None:
    """MOUNTS as a shared mount of its own, so that what is mounted under it later reaches the nodes."""
    MOUNTS.mkdir(parents=True, exist_ok=True)
    where = str(MOUNTS.resolve())
    if where not in mounted(MOUNTS):
        for cmd in (["mount", "--bind", where, where], ["mount", "--make-rshared", where]):
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if res.returncode != 0:
                raise SystemExit(f"[localcluster] {' '.join(cmd)} failed: {res.stderr.strip()}. The nodes' "
                                 f"{HOST_MOUNT} needs it. Fix: run as root (podman rootful, as scripts/setup sets up).")


def release_mounts() -> None:
    """Unmount what the tests left under MOUNTS, then MOUNTS itself."""
    for point in mounted(MOUNTS):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def has_host_mount(name: str) -> bool:
    res = podman("inspect", "-f", "{{range .Mounts}}{{.Destination}} {{end}}", name, check=False)
    return res.returncode == 0 and HOST_MOUNT in res.stdout.decode().split()


def ensure_key() -> Path:
    CLUSTER.mkdir(mode=0o700, exist_ok=True)
    key = CLUSTER / "id_ed25519"
    if not key.exists():
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{PREFIX}-controller",
                        "-f", str(key)], check=True)
    return key


def running_nodes() -> list[str]:
    res = podman("ps", "-a", "--filter", f"label=io.multinode.cluster={PREFIX}", "--format", "{{.Names}}",
                 check=False)
    return [n for n in res.stdout.decode().split() if n]


def wait_for_sshd(name: str, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        res = podman("exec", name, "sh", "-c", "test -s /etc/ssh/ssh_host_ed25519_key.pub && pgrep -x sshd",
                     check=False)
        if res.returncode == 0:
            return
        time.sleep(0.5)
    raise SystemExit(f"[localcluster] sshd did not come up in {name}")


def check_network_stack() -> None:
    """Podman must run netavark with aardvark-dns: without them the nodes' names do not resolve."""
    missing = [tool for tool in ("netavark", "aardvark-dns")
               if not any(Path(d, tool).exists() for d in HELPER_DIRS)]
    if missing:
        raise SystemExit(
            f"[localcluster] podman's network DNS is missing: {', '.join(missing)} not found in "
            f"{' or '.join(HELPER_DIRS[:2])}. Without it the nodes cannot resolve each other's names. "
            f"Fix: scripts/setup (it installs the Debian packages netavark and aardvark-dns), "
            f"or apt-get install netavark aardvark-dns.")
    backend = podman("info", "--format", "{{.Host.NetworkBackend}}").stdout.decode().strip()
    if backend != "netavark":
        raise SystemExit(f"[localcluster] podman uses the network backend {backend!r}, not netavark, although "
                         f"{podman_env()['CONTAINERS_CONF']} asks for it. Fix: check that this podman (4.x) "
                         f"supports netavark (podman info), then run up again.")


def network_info() -> dict | None:
    res = podman("network", "inspect", NETWORK, check=False)
    if res.returncode != 0:
        return None
    info = json.loads(res.stdout)
    return info[0] if info else None


def ensure_network() -> dict:
    """The cluster network, with DNS; a network without DNS (made by an older harness) is made again."""
    info = network_info()
    if info is not None and not info.get("dns_enabled"):
        log(f"network {NETWORK} has no DNS (dns_enabled=false): removing it and its nodes to make it again")
        for name in running_nodes():
            podman("rm", "-f", "-t", "2", name)
        podman("network", "rm", "-f", NETWORK)
        info = None
    if info is None:
        podman("network", "create", "--label", f"io.multinode.cluster={PREFIX}", NETWORK)
        info = network_info()
    if not info or not info.get("dns_enabled"):
        raise SystemExit(f"[localcluster] podman made {NETWORK} without DNS (dns_enabled is not true). "
                         f"Fix: scripts/setup (netavark and aardvark-dns), then down and up again.")
    return info


def node_addresses(info: dict, nodes: list[tuple[str, str]]) -> dict[str, str]:
    """A fixed address per node, from the network's first subnet: restarts and reconnects keep it."""
    subnets = [ipaddress.ip_network(sn["subnet"]) for sn in info.get("subnets") or []]
    subnet = next((sn for sn in subnets if sn.version == 4), None)
    if subnet is None:
        raise SystemExit(f"[localcluster] {NETWORK} has no IPv4 subnet ({', '.join(map(str, subnets)) or 'none'}). "
                         f"Fix: scripts/localcluster.py down, then up (it makes the network with an IPv4 subnet).")
    if subnet.num_addresses < ADDRESS_OFFSET + len(nodes) + 2:
        raise SystemExit(f"[localcluster] {NETWORK}'s subnet {subnet} is too small for {len(nodes)} nodes. "
                         f"Fix: fewer --workers, or down and up again (a new network gets a /24).")
    return {node[0]: str(subnet.network_address + ADDRESS_OFFSET + i) for i, node in enumerate(nodes)}


def mac_address(addr: str) -> str:
    """A fixed, locally administered MAC from the node's address: after a restart or a reconnect the
    other nodes' ARP caches still point at the right node, so the node is reachable at once."""
    return "02:6d:" + ":".join("%02x" % b for b in ipaddress.ip_address(addr).packed)


def container_address_label(name: str) -> str | None:
    res = podman("inspect", "-f", '{{index .Config.Labels "io.multinode.address"}}', name, check=False)
    return res.stdout.decode().strip() if res.returncode == 0 else None


def current_address(name: str) -> str | None:
    res = podman("inspect", name, check=False)
    if res.returncode != 0:
        return None
    nets = json.loads(res.stdout)[0].get("NetworkSettings", {}).get("Networks") or {}
    return (nets.get(NETWORK) or {}).get("IPAddress") or None


def up(workers: int, spares: int = 0) -> None:
    """Start the cluster, reusing what is there.  When the cluster is not usable (a reused one left by a
    machine that was stopped mid-run, a copied disk, a podman upgrade; a new one whose DNS did not settle),
    it is removed and made again once from scratch, and both causes are printed."""
    if workers < 1:
        raise SystemExit("[localcluster] --workers must be at least 1")
    if spares < 0 or workers + spares > 16:
        raise SystemExit("[localcluster] --spares must be 0 or more, with at most 16 nodes besides the coordinator")
    check_network_stack()
    image = ensure_image()
    reused = bool(running_nodes()) or network_info() is not None
    try:
        start_nodes(workers, image, spares)
    except SystemExit as exc:
        log(f"the {'existing' if reused else 'new'} cluster is not usable, making it again: {exc}")
        down()
        start_nodes(workers, image, spares)


def start_nodes(workers: int, image: str, spares: int = 0) -> None:
    key = ensure_key()
    pub = (key.with_suffix(".pub")).read_text()
    info = ensure_network()
    if podman("volume", "exists", VOLUME, check=False).returncode != 0:
        podman("volume", "create", "--label", f"io.multinode.cluster={PREFIX}", VOLUME)
    ensure_mounts()
    wanted = node_names(workers, spares)
    addresses = node_addresses(info, wanted)
    existing = set(running_nodes())
    for extra in sorted(existing - {container(node[0]) for node in wanted}):
        log(f"removing {extra} (not in the requested topology)")
        podman("rm", "-f", extra)
    for node, dummy in wanted:
        name = container(node)
        if name in existing:
            if container_address_label(name) == addresses[node] and has_host_mount(name):
                state = podman("inspect", "-f", "{{.State.Running}}", name).stdout.decode().strip()
                if state != "true":
                    podman("start", name)
                    log(f"started {name} again (address {addresses[node]} kept)")
                if current_address(name) != addresses[node]:
                    # Cut off the network (or put back by hand without --ip): back at its own address.
                    connect(node, quiet=True)
                continue
            log(f"making {name} again: it has no fixed address or no {HOST_MOUNT} (made by an older harness)")
            podman("rm", "-f", "-t", "2", name)
        podman("run", "-d", "--name", name, "--hostname", node, "--network", NETWORK, "--ip", addresses[node],
               "--mac-address", mac_address(addresses[node]), "--network-alias", node, "--label", f"io.multinode.cluster={PREFIX}",
               "--label", f"io.multinode.address={addresses[node]}",
               "--init", "-v", f"{VOLUME}:{SHARED_MOUNT}", "-v", f"{MOUNTS}:{HOST_MOUNT}:rslave", "--shm-size", "1g",
               "-v", f"{ccache_dir()}:{CCACHE_MOUNT}", image, START_SCRIPT_PATH)
        log(f"started {name} at {addresses[node]}")
    hosts = {}
    known = []
    for node, group in wanted:
        name = container(node)
        wait_for_sshd(name)
        podman("exec", "-i", name, "sh", "-c",
               "umask 077; mkdir -p /root/.ssh; cat > /root/.ssh/authorized_keys.controller; "
               "grep -qxF -f /root/.ssh/authorized_keys.controller /root/.ssh/authorized_keys 2>/dev/null || "
               "cat /root/.ssh/authorized_keys.controller >> /root/.ssh/authorized_keys; "
               "rm -f /root/.ssh/authorized_keys.controller", input_bytes=pub.encode())
        addr = addresses[node]
        hostkeys = podman("exec", name, "sh", "-c", "cat /etc/ssh/ssh_host_*_key.pub").stdout.decode()
        for line in hostkeys.splitlines():
            ktype, kdata = line.split()[:2]
            known.append(f"{addr} {ktype} {kdata}")
        hosts[node] = {"group": group, "addr": addr}
    (CLUSTER / "known_hosts").write_text("\n".join(known) + "\n")
    write_inventory(hosts, key)
    summary = ", ".join(f"{n}={h['addr']}" for n, h in hosts.items())
    log(f"cluster up: {summary}")
    log(f"inventory: {INVENTORY_DIR / 'hosts.yml'}")
    check(hosts, key)


# Run on every node by check(): resolve every node's name, then read its sshd's banner.
PROBE = r"""
import json, socket, sys
out = {}
for name in sys.argv[1:]:
    rec = {}
    try:
        rec["addresses"] = sorted({a[4][0] for a in socket.getaddrinfo(name, 22, socket.AF_INET, socket.SOCK_STREAM)})
        with socket.create_connection((name, 22), timeout=3) as s:
            s.settimeout(5)
            rec["banner"] = s.recv(64).decode(errors="replace").strip()
    except OSError as exc:
        rec["error"] = str(exc.strerror or exc)
    out[name] = rec
print(json.dumps(out))
"""


def check(hosts: dict | None = None, key: Path | None = None, settle: float = 30) -> None:
    """Prove the cluster: every node resolves every node's name to its address and reaches its sshd,
    and the controller logs in to every node over SSH with host keys checked.  A node just started
    or reconnected may take a few seconds (podman reloads its DNS server): tried for ``settle`` s."""
    if hosts is None:
        hosts = read_inventory_hosts()
    key = key or CLUSTER / "id_ed25519"
    deadline = time.time() + settle
    while True:
        problems = probe(hosts, key)
        if not problems or time.time() > deadline:
            break
        time.sleep(2)
    if problems:
        raise SystemExit("[localcluster] the cluster is not usable:\n  - " + "\n  - ".join(problems) +
                         "\nFix: scripts/localcluster.py up (starts stopped nodes, reconnects cut-off ones at their "
                         "own address); when names still do not resolve, scripts/setup (podman's DNS: netavark and "
                         "aardvark-dns), then scripts/localcluster.py down && scripts/localcluster.py up.")
    log(f"checked: every node resolves {', '.join(hosts)} to its fixed address and reaches its sshd; "
        f"the controller logs in to every node over SSH")


def probe(hosts: dict, key: Path) -> list[str]:
    """What keeps the cluster from working, as sentences (empty when nothing does)."""
    info = network_info()
    problems = []
    for node in hosts:
        res = podman("exec", container(node), "python3", "-c", PROBE, *hosts, check=False)
        if res.returncode != 0:
            problems.append(f"{node}: cannot run the name check ({res.stderr.decode(errors='replace').strip()})")
            continue
        for other, rec in json.loads(res.stdout).items():
            want = hosts[other]["addr"]
            if "addresses" not in rec:
                why = rec.get("error", "no answer")
                if info is not None and not info.get("dns_enabled"):
                    why += f"; {NETWORK} has no DNS (dns_enabled=false)"
                problems.append(f"{node} cannot resolve {other} ({why})")
            elif rec["addresses"] != [want]:
                problems.append(f"{node} resolves {other} to {', '.join(rec['addresses'])}, not {want} "
                                f"(its fixed address)")
            elif not rec.get("banner", "").startswith("SSH-"):
                problems.append(f"{node} resolves {other} but cannot reach its sshd on port 22 "
                                f"({rec.get('error') or rec.get('banner') or 'no banner'})")
    for node, h in hosts.items():
        res = subprocess.run(["ssh", "-i", str(key), "-o", f"UserKnownHostsFile={CLUSTER / 'known_hosts'}",
                              "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
                              f"root@{h['addr']}", "hostname"], capture_output=True, text=True, check=False)
        if res.returncode != 0 or res.stdout.strip() != node:
            problems.append(f"the controller cannot log in to {node} at {h['addr']} over SSH "
                            f"({(res.stderr or res.stdout).strip() or 'rc %d' % res.returncode})")
    return problems


def read_inventory_hosts() -> dict:
    """node -> {group, addr} from the running containers (their fixed addresses)."""
    hosts = {}
    for name in sorted(running_nodes(), key=lambda n: (not n.endswith("-coord"), n)):
        node = name[len(PREFIX) + 1:]
        addr = container_address_label(name)
        if addr:
            hosts[node] = {"group": "coordinator" if node == "coord" else "workers", "addr": addr}
    if not hosts:
        raise SystemExit("[localcluster] no local cluster: run scripts/localcluster.py up")
    return hosts


def disconnect(node: str) -> None:
    """Cut a node off the cluster network: a network failure, as on a real cluster."""
    name = container(node)
    podman("network", "disconnect", NETWORK, name)
    log(f"{name} disconnected from {NETWORK}")


def connect(node: str, quiet: bool = False) -> None:
    """Put a node back on the cluster network at its own fixed address."""
    name = container(node)
    addr = container_address_label(name)
    if not addr:
        raise SystemExit(f"[localcluster] {name} is not a node of this cluster (no io.multinode.address label)")
    if current_address(name) == addr:
        if not quiet:
            log(f"{name} is connected at {addr}")
        return
    if current_address(name):
        podman("network", "disconnect", NETWORK, name)
    podman("network", "connect", "--ip", addr, "--mac-address", mac_address(addr), "--alias", node, NETWORK, name)
    log(f"{name} connected to {NETWORK} at {addr}")


def ops_build_nodes(per_node_gib: float = 3.0) -> int:
    """How many nodes may build DeepSpeed's ops at once on this machine: one compiler takes about 1.5 GiB, and the
    nodes' other processes and the controller need the rest (this machine's MemTotal / 3 GiB, at least 1)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            kib = next(int(line.split()[1]) for line in fh if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return 1
    return max(1, int(kib / 1024 / 1024 // per_node_gib))


def write_inventory(hosts: dict, key: Path) -> None:
    INVENTORY_DIR.mkdir(parents=True, exist_ok=True)
    lines = [
        "---",
        "# Generated by scripts/localcluster.py: the local podman cluster.",
        "all:",
        "  vars:",
        "    ansible_user: root",
        f"    ansible_ssh_private_key_file: {key}",
        # Host keys were read from the nodes themselves: strict checking stays on.
        "    ansible_ssh_common_args: >-",
        f"      -o UserKnownHostsFile={CLUSTER / 'known_hosts'} -o StrictHostKeyChecking=yes",
        "    ansible_python_interpreter: /usr/bin/python3",
        f"    shared_dir_path: {SHARED_MOUNT}",
        "    # The podman volume mounted on every node stands in for NFS here.",
        "    shared_dir_provider: preexisting",
        "    deepspeed_accelerator: cpu",
        "    # Every node shares this machine's memory: one compiler per node while DeepSpeed's ops build, and",
        "    # no more nodes building at once than this machine has memory for (a compiler takes about 1.5 GiB).",
        "    stack_ops_build_jobs: 1",
        f"    stack_ops_build_nodes: {ops_build_nodes()}",
        "    # Every node shares this machine's cores: a node's compute figure depends on what the others run at that",
        "    # moment (one that started its measurement alone had both cores), so preflight's health check only warns",
        "    # here; -e preflight_health_action=fail makes it refuse (tests/e2e/test_stragglers.py).",
        "    preflight_health_action: warn",
        "    ssh_mesh_cluster_name: local",
        "  children:",
    ]
    for group in ("coordinator", "workers", "spares"):
        if not any(h["group"] == group for h in hosts.values()):
            continue
        lines.append(f"    {group}:")
        lines.append("      hosts:")
        for node, h in hosts.items():
            if h["group"] == group:
                lines.append(f"        {node}:")
                lines.append(f"          ansible_host: {h['addr']}")
        if group != "coordinator":
            # CPU nodes have no GPUs to count: one rank each, said explicitly (a spare has a worker's slots).
            lines += ["      vars:", "        deepspeed_slots: 1"]
    (INVENTORY_DIR / "hosts.yml").write_text("\n".join(lines) + "\n")


def down() -> None:
    for name in running_nodes():
        podman("rm", "-f", "-t", "2", name)
        log(f"removed {name}")
    release_mounts()
    if podman("network", "exists", NETWORK, check=False).returncode == 0:
        podman("network", "rm", "-f", NETWORK)
        log(f"removed network {NETWORK}")
    if podman("volume", "exists", VOLUME, check=False).returncode == 0:
        podman("volume", "rm", "-f", VOLUME)
        log(f"removed volume {VOLUME}")
    shutil.rmtree(CLUSTER, ignore_errors=True)
    shutil.rmtree(INVENTORY_DIR, ignore_errors=True)
    log("keys and inventory removed")


def status() -> int:
    names = running_nodes()
    if not names:
        print("no local cluster")
        return 1
    res = podman("ps", "-a", "--filter", f"label=io.multinode.cluster={PREFIX}",
                 "--format", "{{.Names}}\t{{.Status}}", capture=True)
    print(res.stdout.decode().strip())
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="start (or reuse) the local cluster")
    p_up.add_argument("--workers", type=int, default=int(os.environ.get("MNDS_WORKERS", "2")))
    p_up.add_argument("--spares", type=int, default=int(os.environ.get("MNDS_SPARES", "0")),
                      help="nodes in the inventory's spares group, provisioned like the workers by site.yml; they "
                           "take a failed worker's place in a run with -e restarts=N (default 0)")
    p_check = sub.add_parser(
        "check", help="check that every node resolves and reaches every node, and the controller each")
    p_check.add_argument("--settle", type=float, default=30,
                         help="seconds to keep trying while nodes settle after a start or reconnect (default 30)")
    for verb, text in (("disconnect", "cut a node off the cluster network"),
                       ("connect", "put a node back on the cluster network at its own address")):
        sub.add_parser(verb, help=text).add_argument("node", help="coord, worker1, ...")
    sub.add_parser("down", help="remove the local cluster")
    sub.add_parser("status", help="list the nodes")
    sub.add_parser("image", help="build (or reuse) the node image only")
    args = parser.parse_args(argv)
    if args.cmd == "up":
        up(args.workers, args.spares)
    elif args.cmd == "check":
        check(settle=args.settle)
    elif args.cmd == "disconnect":
        disconnect(args.node)
    elif args.cmd == "connect":
        connect(args.node)
    elif args.cmd == "down":
        down()
    elif args.cmd == "image":
        # The image's name on stdout (logs go to stderr): molecule scenarios use it.
        print(ensure_image())
    else:
        return status()
    return 0


if __name__ == "__main__":
    sys.exit(main())
