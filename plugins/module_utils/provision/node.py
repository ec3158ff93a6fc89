# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one node is, read in one go and without importing torch: memory, the default route's
interface, the versions the venv holds (from its ``*.dist-info`` names, so a changed package
changes them), whether a TCP port is free.  The parsers are pure and take text; the readers
take a root directory so that unit tests point them at fixture trees.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import errno
import glob
import hashlib
import os
import re
import socket

from ansible_collections.multinode.deepspeed.plugins.module_utils.common.tracking import MONITOR_PACKAGES

# The rendezvous port a job's master listens on unless -e master_port says otherwise (node_facts checks it).
MASTER_PORT = 29500
_ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_env(text):
    """``KEY=VALUE`` lines (the files provisioning writes: deepspeed_env, stack.env) -> dict; other lines
    (blanks, comments, anything that is not a variable assignment) are skipped."""
    out = {}
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and _ENV_KEY_RE.fullmatch(key):
            out[key] = value
    return out


# A value a shell reads as it is (DeepSpeed's runner's own test for values it leaves unquoted): the others only
# reach the ranks through rank.env, read by multinode_ds.rank on each node, never through a shell.
SHELL_SAFE_RE = re.compile(r"[\w@%+=:,./-]*")


def launcher_env(env):
    """The part of the ranks' environment that goes into ``.deepspeed_env``: with pdsh each node's shell sources
    that file before DeepSpeed's launcher starts (as DeepSpeed's runner would paste its lines into that shell), so
    only values a shell reads as they are.  The whole environment is ``rank.env``, which ``multinode_ds.rank``
    reads on each node."""
    return dict((k, v) for k, v in env.items() if SHELL_SAFE_RE.fullmatch(v))


# dist-info directory names: <name>-<version>.dist-info, the name normalised with '_' (PEP 427).
DIST_INFO_RE = re.compile(r"^(?P<name>[A-Za-z0-9_.]+?)-(?P<version>[^-]+)\.dist-info$")
VERSION_RE = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.M)
CUDA_LOCAL_RE = re.compile(r"\+cu(\d+)(\d)$")
PACKAGES = ("torch", "deepspeed", "transformers")


def meminfo_total_mb(text):
    """MemTotal of ``/proc/meminfo`` in MiB (what Ansible's ``memtotal_mb`` says), or None."""
    match = re.search(r"^MemTotal:\s+(\d+)\s+kB", text or "", re.M)
    return int(match.group(1)) // 1024 if match else None


def default_interface(route_text):
    """The interface of the IPv4 default route, from ``/proc/net/route`` (lowest metric wins), or None."""
    best = None
    for line in (route_text or "").splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8 or fields[1] != "00000000" or fields[7] != "00000000":
            continue
        try:
            metric = int(fields[6])
        except ValueError:
            continue
        if best is None or metric < best[0]:
            best = (metric, fields[0])
    return best[1] if best else None


def pyvenv_python(text):
    """The Python version a venv was made with (``version`` or ``version_info`` of ``pyvenv.cfg``)."""
    for line in (text or "").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("version", "version_info"):
            return ".".join(value.strip().split(".")[:3])
    return None


def dist_versions(names):
    """``{normalised name: version}`` from dist-info directory names."""
    out = {}
    for name in names:
        match = DIST_INFO_RE.match(os.path.basename(name.rstrip("/")))
        if match:
            out[match.group("name").lower().replace(".", "_").replace("-", "_")] = match.group("version")
    return out


def stack_versions(dists, python, trainer):
    """The version table's row from what the venv holds (the names site.yml's table uses).

    ``cuda``: the CUDA build of torch (``2.13.0+cu126`` -> ``12.6``; ``none`` for a CPU build);
    ``nccl``: the version of the NCCL wheel torch depends on (``none`` without one)."""
    out = {"python": python or "unknown", "trainer": trainer or "unknown"}
    for pkg in PACKAGES:
        out[pkg] = dists.get(pkg) or "missing"
    match = CUDA_LOCAL_RE.search(out["torch"])
    out["cuda"] = "%s.%s" % (match.group(1), match.group(2)) if match else "none"
    nccl = [v for k, v in sorted(dists.items()) if k.startswith("nvidia_nccl")]
    out["nccl"] = nccl[0] if nccl else "none"
    return out


def tracker_packages(venv):
    """``{tracker: version or None}``: whether the venv has each tracker's package (from dist-info names only)."""
    pattern = os.path.join(venv, "lib", "python*", "site-packages", "*.dist-info")
    dists = dist_versions(os.path.basename(p) for p in glob.glob(pattern))
    return dict((tracker, dists.get(pkg)) for tracker, pkg in MONITOR_PACKAGES.items())


def read_versions(venv, trainer_dir):
    """The venv's versions and a fingerprint of everything it holds (any installed, removed or
    changed package changes it), read from the file system only; ``{"error": ...}`` without a venv."""
    cfg = os.path.join(venv, "pyvenv.cfg")
    if not os.path.isfile(cfg):
        return {"error": "no venv at %s (run site.yml)" % venv}, None
    with open(cfg) as fh:
        python = pyvenv_python(fh.read())
    pattern = os.path.join(venv, "lib", "python*", "site-packages", "*.dist-info")
    names = sorted(os.path.basename(p) for p in glob.glob(pattern))
    trainer = None
    init = os.path.join(trainer_dir, "__init__.py")
    if os.path.isfile(init):
        with open(init) as fh:
            match = VERSION_RE.search(fh.read())
        trainer = match.group(1) if match else None
    versions = stack_versions(dist_versions(names), python, trainer)
    return versions, stack_fingerprint(python, names, trainer)


def stack_fingerprint(python, names, trainer):
    """The stack's fingerprint: the venv's Python version, its sorted ``*.dist-info`` names and the trainer's version
    (what preflight compares between nodes, and the tag of the stack's image)."""
    digest = hashlib.sha256("\n".join([python or ""] + sorted(names) + [trainer or ""]).encode("utf-8")).hexdigest()
    return digest[:16]


def port_state(port, host=""):
    """``(True, "")`` when nothing listens on TCP ``port`` here, else ``(False, why)``.

    SO_REUSEADDR, as a rendezvous binds: leftovers in TIME_WAIT do not count, a listener does."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        return True, ""
    except (OSError, socket.error) as exc:
        why = "in use" if getattr(exc, "errno", None) == errno.EADDRINUSE else str(exc)
        return False, "port %s is not free: %s" % (port, why)
    finally:
        sock.close()


# What role stack's record must still say for a node to count as provisioned with the wanted stack.
RECORD_KEYS = ("build", "accelerator", "packages")


def stack_unchanged(node, wanted):
    """Whether the node is as role stack's last run left it, for the stack wanted now: its venv's fingerprint (every
    dist-info name, the Python and the trainer's version) is the one recorded then, and so are the build, the
    accelerator, the pinned packages and the CUDA settings.  Then pip has nothing to install and the versions
    recorded are the ones an import would read.  ``node``: node_facts' ``multinode_node`` (with ``stack_record``);
    ``wanted``: build, accelerator, packages, cuda_env."""
    record = node.get("stack_record") or {}
    fingerprint = node.get("stack_fingerprint")
    if not fingerprint or record.get("fingerprint") != fingerprint:
        return False
    if any(record.get(key) != wanted.get(key) for key in RECORD_KEYS):
        return False
    if (record.get("cuda_env") or {}) != (wanted.get("cuda_env") or {}):
        return False
    versions = record.get("versions")
    return isinstance(versions, dict) and "error" not in versions
