# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The stack's image, decided before anything is built: which stack the matrix selects for the image's
accelerator (the same ``select_stack`` as site.yml), the Debian base it starts from, the tag (the stack's
fingerprint, predicted from the wheels pip would install, the same one preflight compares between nodes), and the
Containerfile that installs the venv from the wheelhouse.

Pure functions; the modules ``image_plan``, ``image_base`` and ``image_context`` run them on the build host.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import glob
import hashlib
import json
import os
import re
import tarfile
import zipfile

from urllib.parse import unquote

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import registry as reg
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import node, stack_matrix, stack_select

# Debian suites the base can be, and the Python their python3 is (the wheelhouse's Python must be it).
SUITE_PYTHON = {"bookworm": "3.11", "trixie": "3.13"}
# What the base holds: Python and its venv module, a compiler for DeepSpeed's ops, ps for the agent.
BASE_PACKAGES = ("python3", "python3-venv", "python3-dev", "g++", "procps", "ca-certificates", "netbase")
ACCELERATORS = ("cuda", "cpu")
# Left out of the base: apt's caches and lists, the machine id (made at first start), logs.
BASE_REMOVE = ("var/cache/apt/archives", "var/lib/apt/lists", "var/log", "etc/machine-id", "var/cache/debconf/"
               "templates.dat-old", "etc/resolv.conf", "etc/hostname")
# The collection's pure logic the node package uses, copied next to it (as role stack's trainer.yml does).
NODE_EXTRA = {"benchcore.py": "bench/core.py", "dsconfigcore.py": "plan/dsconfig.py"}
NAME_RE = re.compile(r"^[a-z0-9]+(?:[._-]+[a-z0-9]+)*(?:/[a-z0-9]+(?:[._-]+[a-z0-9]+)*)*$")
# A mirror URL with no credentials in it (debootstrap writes it into the image's apt sources).
MIRROR_RE = re.compile(r"^(https?|file)://[^\s'\"@]+$")
# The image's own account (no login shell, a home of its own): the USER its containers run as unless told.
IMAGE_USER, IMAGE_UID, IMAGE_HOME = "mnds", 65532, "/home/mnds"
# What goes into the Containerfile's RUN lines unquoted: absolute paths and op builder names.
PATH_RE = re.compile(r"^/[A-Za-z0-9._/+-]+$")
OP_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# A wheel's file name: <name>-<version>(-<build>)?-<python>-<abi>-<platform>.whl
WHEEL_RE = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")
DPKG_VERSION_RE = re.compile(r"^(?:\d+:)?(\d+\.\d+\.\d+)")
LABEL_PREFIX = "io.github.multinode.deepspeed."


class ImageError(ValueError):
    """The inputs cannot make an image: one line per problem, each naming the variable and the fix."""


def plan(p, worker_nodes=None, controller_python=None):
    """The image's decision from the role's variables ``p`` (``accelerator``, ``cuda``, ``registry``, ``name``,
    ``push``, ``insecure``, ``suite``, ``mirror``, ``torch``, ``deepspeed``, ``matrix_extra``,
    ``extra_packages``, ``venv``, ``home``, ``ops``, ``build_ops``, ``cache_dir``) and the workers' facts
    ``worker_nodes`` (host -> ``select_stack``'s node dict, for the accelerator and the CUDA their drivers
    run); ``ImageError`` with every problem."""
    problems = []
    suite = str(p.get("suite") or "bookworm")
    python = SUITE_PYTHON.get(suite)
    if python is None:
        problems.append("image_base_suite=%r is not a Debian suite the image knows (%s). Fix: -e image_base_suite="
                        "bookworm" % (suite, ", ".join(sorted(SUITE_PYTHON))))
    elif controller_python and controller_python != python:
        problems.append("image_base_suite=%s has Python %s but the controller builds the wheelhouse with Python %s. "
                        "Fix: run ansible-playbook from a Python %s venv, or -e image_base_suite=<the suite with "
                        "Python %s>" % (suite, python, controller_python, python, controller_python))
    mirror = str(p.get("mirror") or "")
    if not MIRROR_RE.match(mirror):
        shown = re.sub(r"//[^/@]*@", "//<credentials>@", mirror)
        problems.append("image_base_mirror=%r is not a Debian mirror URL without credentials in it (they would be "
                        "written into the image's apt sources). Fix: -e image_base_mirror=http://deb.debian.org/debian, "
                        "credentials in /etc/apt/auth.conf.d" % (shown,))
    accelerator, cuda_driver, where = image_accelerator(p, worker_nodes or {}, problems)
    registry, name = destination(p, problems)
    selection = select(p, accelerator, cuda_driver, python, problems) if accelerator and python else None
    if problems:
        raise ImageError("\n".join(problems))
    build = selection["builds"]["image"]
    packages = list(selection["packages"]["image"]) + list(p.get("extra_packages") or [])
    repository = ("%s/%s" % (registry, name)) if registry else "localhost/" + name
    base_key = hashlib.sha256(json.dumps([suite, mirror, sorted(BASE_PACKAGES), BASE_REMOVE]).encode()).hexdigest()[:12]
    cache = str(p.get("cache_dir")).rstrip("/")
    return {
        "accelerator": accelerator, "accelerator_from": where, "build": build, "packages": packages,
        "torch": selection["torch"], "deepspeed": selection["deepspeed"], "cuda": selection["cuda"],
        "cuda_toolkit": (selection.get("cuda_toolkit") or {}).get("image"),
        "index_url": (selection.get("index_urls") or {}).get("image"),
        "python": python, "repository": repository, "registry": registry or None,
        "base": {"suite": suite, "mirror": mirror, "packages": list(BASE_PACKAGES),
                 "tarball": "%s/base-%s-%s.tar" % (cache, suite, base_key), "key": base_key},
        "context": "%s/context-%s" % (cache, build),
        # CUDA ops need nvcc, which the Debian base has not (the torch wheel brings the CUDA runtime only): they
        # are built where they are first used, on a node with the toolkit.
        "ops": list((p.get("ops") or {}).get(accelerator) or []) if p.get("build_ops") and accelerator == "cpu"
        else [],
        "venv": p["venv"], "home": p["home"],
    }


def destination(p, problems):
    """``(registry, name)``, each checked: a registry to push to (host or host:port), a repository name."""
    registry = str(p.get("registry") or "")
    name = str(p.get("name") or "")
    if p.get("push") and not reg.REGISTRY_RE.match(registry):
        problems.append("image_registry=%r is not a registry (host or host:port). Fix: -e image_registry="
                        "registry.example.org:5000, or -e push=false to keep the image on the build host"
                        % (registry,))
    if not NAME_RE.match(name):
        problems.append("image_name=%r is not an image name (lower-case letters, digits, '.', '_', '-', '/'). "
                        "Fix: -e image_name=multinode-deepspeed" % (name,))
    return registry, name


def select(p, accelerator, cuda_driver, python, problems):
    """The matrix's stack for one node, the image (its Python, its accelerator, the CUDA its driver must run), with
    the pins of role stack; None, and the matrix's problems worded for the image, when there is none."""
    node_facts = {"image": {"python": python + ".0", "accelerator": accelerator,
                            "cuda_driver_version": cuda_driver, "driver_version": None}}
    pins = {"torch": p.get("torch") or None, "deepspeed": p.get("deepspeed") or None, "cuda": p.get("cuda") or None}
    try:
        return stack_select.select_stack(node_facts, pins, stack_matrix.load_matrix(p.get("matrix_extra") or None))
    except stack_matrix.StackError as exc:
        # The matrix's own lines (its table names one node, the image): the problems, with their fixes.
        lines = [line.strip() for line in str(exc).replace("stack_cuda_version", "image_cuda").splitlines()
                 if "Fix:" in line] or [str(exc).strip()]
        problems.extend("the matrix has no stack for this image (accelerator %s%s): %s" % (
            accelerator, ", CUDA " + str(p["cuda"]) if p.get("cuda") else "",
            re.sub(r"^(all nodes|image): ", "", line)) for line in lines)
        return None


def image_accelerator(p, worker_nodes, problems):
    """``(accelerator, cuda the image's driver must run, where it came from)``: ``image_accelerator``, else what
    the workers' facts say (one GPU worker makes it cuda, at the highest CUDA every GPU worker's driver runs)."""
    given = str(p.get("accelerator") or "")
    cuda = str(p.get("cuda") or "")
    worker_nodes = dict((host, worker_node(facts)) for host, facts in (worker_nodes or {}).items() if facts)
    if given and given not in ACCELERATORS:
        problems.append("image_accelerator=%r: the matrix has stacks for %s only. Fix: -e image_accelerator=cuda "
                        "or -e image_accelerator=cpu" % (given, " and ".join(ACCELERATORS)))
        return None, None, None
    if given:
        where = "image_accelerator"
        accelerator = given
        drivers = [n.get("cuda_driver_version") for n in worker_nodes.values()
                   if n.get("accelerator") == "cuda" and n.get("cuda_driver_version")]
    elif worker_nodes:
        where = "the workers' facts (%s)" % ", ".join(sorted(worker_nodes))
        gpus = [n for n in worker_nodes.values() if n.get("accelerator") == "cuda"]
        accelerator = "cuda" if gpus else "cpu"
        drivers = [n.get("cuda_driver_version") for n in gpus if n.get("cuda_driver_version")]
    else:
        problems.append("no worker answered and image_accelerator is not set: the image's accelerator is unknown. "
                        "Fix: -e image_accelerator=cpu, or -e image_accelerator=cuda -e image_cuda=<CUDA, e.g. 13.0>")
        return None, None, None
    if accelerator == "cpu":
        if cuda:
            problems.append("image_cuda=%s is set for a CPU image. Fix: -e image_accelerator=cuda, or leave "
                            "image_cuda unset" % cuda)
        return accelerator, None, where
    if cuda:
        return accelerator, cuda, where
    if drivers:
        return accelerator, min(drivers, key=stack_matrix.parse_version), where
    # No driver to fit: the newest CUDA build the matrix has.
    return accelerator, "999.0", where


def apt_mirror(root="/"):
    """The Debian mirror this host's apt reads (sources.list and deb822 .sources files), else deb.debian.org."""
    paths = [os.path.join(root, "etc/apt/sources.list")]
    paths += sorted(glob.glob(os.path.join(root, "etc/apt/sources.list.d/*")))
    for path in paths:
        try:
            with open(path) as fh:
                text = fh.read()
        except (OSError, IOError):
            continue
        for uri in mirror_uris(text):
            if "/debian" in uri and "security" not in uri:
                return uri
    return "http://deb.debian.org/debian"


def mirror_uris(text):
    """The archive URIs of an apt sources text (one-line ``deb`` lines and deb822 ``URIs:`` fields)."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("URIs:"):
            out += line.split()[1:]
        elif line.startswith("deb "):
            parts = [x for x in line.split()[1:] if not x.startswith("[")]
            out += parts[:1]
    return out


def worker_node(facts):
    """A worker's accelerator facts (M(accelerator_facts)) as the image sees them: ``accelerator`` (cuda where a
    driver answers, as role stack decides) and ``cuda_driver_version``."""
    facts = facts or {}
    accelerator = "cuda" if facts.get("status") in ("ok", "driver_error") else "cpu"
    return {"accelerator": accelerator, "cuda_driver_version": facts.get("cuda_driver_version")}


def base_argv(base, rootfs):
    """debootstrap of the base (minbase, the base's packages) into ``rootfs``."""
    return ["debootstrap", "--variant=minbase", "--include=" + ",".join(base["packages"]), base["suite"],
            rootfs, base["mirror"]]


def dist_info_name(wheel_path):
    """The ``*.dist-info`` directory a wheel installs (read from the wheel, as pip names it)."""
    with zipfile.ZipFile(wheel_path) as zf:
        for member in zf.namelist():
            top = member.split("/", 1)[0]
            if top.endswith(".dist-info"):
                return top
    match = WHEEL_RE.match(wheel_path.rsplit("/", 1)[-1])
    if not match:
        raise ValueError("%s is not a wheel" % wheel_path)
    return "%s-%s.dist-info" % (match.group("name"), match.group("version"))


def base_python(tarball):
    """``(python version, [(project, dist-info)], {wheel file: member})`` from the base's tarball: the interpreter's
    version (dpkg's status of ``python3.<minor>``, what ``pyvenv.cfg`` records) and the wheels ensurepip installs
    into a fresh venv (``/usr/share/python-wheels``: pip, setuptools)."""
    version, seeds, members = None, [], {}
    with tarfile.open(tarball) as tf:
        for member in tf.getmembers():
            name = member.name.lstrip("./")
            if name.startswith("usr/share/python-wheels/") and name.endswith(".whl"):
                wheel = name.rsplit("/", 1)[-1]
                match = WHEEL_RE.match(wheel)
                if match and match.group("name") in ("pip", "setuptools"):
                    info = "%s-%s.dist-info" % (match.group("name"), match.group("version"))
                    seeds.append((match.group("name"), info))
                    members[wheel] = member.name
            elif name == "var/lib/dpkg/status":
                version = python_from_status(tf.extractfile(member).read().decode("utf-8", "replace"))
    return version, seeds, members


def python_from_status(text):
    """The upstream version of the installed interpreter package ``python3.<minor>`` (the one ``python3`` depends on)
    in dpkg's status text: ``3.11.2`` of ``3.11.2-6+deb12u6``."""
    stanzas = [dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line[0].isspace())
               for stanza in text.split("\n\n")]
    installed = dict((f.get("Package"), f) for f in stanzas if "installed" in f.get("Status", "").split())
    minor = re.search(r"python3\.(\d+)", (installed.get("python3") or {}).get("Depends", ""))
    interpreter = installed.get("python3.%s" % minor.group(1)) if minor else None
    match = DPKG_VERSION_RE.match((interpreter or {}).get("Version", ""))
    return match.group(1) if match else None


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def predicted_names(seeds, report, wheel_paths):
    """The dist-info names of the venv after ``python3 -m venv`` (``seeds``: ``[(project, dist-info)]``) and
    ``pip install`` of ``report`` (pip's ``--report``: what it installs, replacing seeds of the same project)."""
    installed = dict((canonical(project), info) for project, info in seeds)
    for item in report.get("install") or []:
        meta = item.get("metadata") or {}
        project = canonical(meta.get("name") or "")
        url = ((item.get("download_info") or {}).get("url") or "")
        path = unquote(url[len("file://"):]) if url.startswith("file://") else wheel_paths.get(project)
        if not path:
            raise ValueError("pip's report names %s with no local wheel" % (meta.get("name"),))
        installed[project] = dist_info_name(path)
    return sorted(installed.values())


def fingerprint(python_version, names, trainer_version):
    """The tag: the fingerprint ``node_facts`` reads from a venv with these dist-info names."""
    return node.stack_fingerprint(python_version, names, trainer_version)


def labels(decision, tag, trainer_version):
    """The image's labels (what it holds; the kubernetes backend reads the fingerprint)."""
    out = {
        reg.FINGERPRINT_LABEL: tag,
        LABEL_PREFIX + "accelerator": decision["accelerator"],
        LABEL_PREFIX + "build": decision["build"],
        LABEL_PREFIX + "torch": decision["torch"],
        LABEL_PREFIX + "deepspeed": decision["deepspeed"],
        LABEL_PREFIX + "venv": decision["venv"],
        LABEL_PREFIX + "trainer": trainer_version or "",
        LABEL_PREFIX + "ops": ",".join(decision["ops"]),
        "org.opencontainers.image.title": "multinode.deepspeed stack (%s)" % decision["build"],
    }
    if decision.get("cuda"):
        out[LABEL_PREFIX + "cuda"] = decision["cuda"]
    return out


def containerfile(decision, tag, trainer_version):
    """The Containerfile (its context: ``base.tar``, ``wheels/``, ``multinode_ds/``): the Debian base, the venv
    from the wheels (bind-mounted, never a layer), the node package, DeepSpeed's ops prebuilt for the accelerator
    (where the build host can build them), the labels; no key, token or password is ever in the context."""
    venv, home = decision["venv"], decision["home"]
    bad = [v for v in (venv, home) if not PATH_RE.match(str(v))] + [o for o in decision["ops"] if not OP_RE.match(o)]
    if bad:
        raise ImageError("%s: not an absolute path or an op builder's name the image can use. Fix: stack_venv_dir and "
                         "stack_home as plain absolute paths, stack_ops as DeepSpeed builder names" % ", ".join(
                             repr(b) for b in bad))
    ext = home + "/torch_extensions"
    lines = [
        "# The multinode.deepspeed stack %s (%s): written by image.yml, not by hand." % (tag, decision["build"]),
        "FROM scratch",
        "ADD base.tar /",
        "ENV LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1",
        "RUN --mount=type=bind,source=wheels,target=/wheels python3 -m venv %s && %s/bin/pip install -q "
        "--no-index --find-links /wheels %s" % (venv, venv, " ".join(_quote(p) for p in decision["packages"])),
        "COPY multinode_ds %s/lib/multinode_ds" % home,
        "RUN echo %s/lib > %s/lib/python%s/site-packages/multinode_ds.pth && find %s/lib -type d -exec chmod 0755 "
        "{} + && find %s/lib -type f -exec chmod 0644 {} +" % (home, venv, decision["python"], home, home),
    ]
    env = "DS_ACCELERATOR=%s TORCH_EXTENSIONS_DIR=%s PATH=%s/bin:/usr/sbin:/usr/bin:/sbin:/bin" % (
        decision["accelerator"], ext, venv)
    if decision["ops"]:
        lines.append("RUN mkdir -p %s && %s %s/bin/python -m multinode_ds.build_ops %s && chmod -R a+rX,a+w %s"
                     % (ext, env, venv, " ".join(decision["ops"]), ext))
    else:
        lines.append("RUN mkdir -p %s && chmod 1777 %s" % (ext, ext))
    lines.append("ENV DS_ACCELERATOR=%s TORCH_EXTENSIONS_DIR=%s PATH=%s/bin:/usr/local/sbin:/usr/local/bin:"
                 "/usr/sbin:/usr/bin:/sbin:/bin" % (decision["accelerator"], ext, venv))
    # A non-root account of its own (numeric, so that a kubelet's runAsNonRoot can check it): what a container of the
    # image runs as when nothing says otherwise (the pods of a run run as the run account's uid).
    lines.append("RUN echo '%s:x:%d:%d::%s:/usr/sbin/nologin' >> /etc/passwd && echo '%s:x:%d:' >> /etc/group && "
                 "mkdir -p %s && chown %d:%d %s && chmod 0700 %s" % (
                     IMAGE_USER, IMAGE_UID, IMAGE_UID, IMAGE_HOME, IMAGE_USER, IMAGE_UID, IMAGE_HOME, IMAGE_UID,
                     IMAGE_UID, IMAGE_HOME, IMAGE_HOME))
    lines.append("USER %d:%d" % (IMAGE_UID, IMAGE_UID))
    for key, value in sorted(labels(decision, tag, trainer_version).items()):
        lines.append("LABEL %s=%s" % (key, json.dumps(value)))
    lines.append('CMD ["%s/bin/python", "-m", "multinode_ds.k8s", "--help"]' % venv)
    return "\n".join(lines) + "\n"


def _quote(text):
    """A package requirement for the Containerfile's shell (pins are name==version: no quoting needed, refuse
    anything else)."""
    if not re.match(r"^[A-Za-z0-9_.+=<>!~,\[\]-]+$", text):
        raise ImageError("%r is not a package requirement the image can install. Fix: give pins as name==version "
                         "(stack_extra_packages)" % (text,))
    return "'%s'" % text
