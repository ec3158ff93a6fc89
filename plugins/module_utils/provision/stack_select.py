# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Choose one driver -> CUDA -> PyTorch -> DeepSpeed stack for a whole cluster.

Pure Python, no Ansible import: unit-tested on the controller.  ``select_stack`` reads each node's facts (its
Python, its driver's highest CUDA), the releases the pins name, and picks the newest consistent set from the matrix
(``stack_matrix.load_matrix``), with the requirements and package index of each node; when there is none it raises
the ``StackError`` of ``stack_misfit``: a table of the nodes and one line per problem naming the host, the variable
and the fix.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.stack_matrix import (
    ACCELERATORS, VAR_ACCELERATOR, VAR_CUDA, VAR_DEEPSPEED, VAR_EXTRA, VAR_PYTHON, VAR_TORCH, StackError,
    all_builds, allowed_builds, build_cuda, build_name, compare_versions, driver_max_cuda, fitting_build, in_range,
    load_matrix, min_driver, newest, newest_first, node_fits, parse_version, version_text)
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.stack_misfit import (
    check_pins, explain_no_fit, raise_no_stack)
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.stack_table import node_row


def select_stack(nodes, pins=None, matrix=None):
    """The newest consistent stack for ``nodes``; ``StackError`` when there is none.

    ``nodes``: ``{host: {'python': '3.11.2', 'accelerator': 'cuda'|'cpu',
    'cuda_driver_version': '12.4'|None, 'driver_version': '550.90.07'|None}}`` (no accelerator:
    cpu; a cuda node needs one of the two versions).
    ``pins``: ``{'torch': '2.13.0'|'2.13'|None, 'cuda': '12.8'|None, 'deepspeed': '0.19.8'|None,
    'python': None}`` (``python``: the Python every node's venv uses, instead of the node's own).
    ``matrix``: from ``load_matrix`` (default: the bundled one).

    One torch release for all nodes; one CUDA build for all GPU nodes, the highest that every GPU
    node's driver runs (the driver's highest CUDA: nvidia-smi's, else derived from the driver
    version); CPU nodes get the CPU build of the same release; one DeepSpeed release whose torch
    and Python ranges hold that torch and every node's Python.
    """
    matrix = load_matrix() if matrix is None else matrix
    pins = pins or {}
    if not nodes:
        raise StackError("no nodes to choose a stack for. Fix: put the nodes in the inventory.")
    return _select(nodes, pins, matrix)


def _select(nodes, pins, matrix):
    """``select_stack`` past its arguments: the nodes' facts, the pins, what contradicts them, the newest fit."""
    python_pin = pins.get("python")
    facts = _nodes_facts(nodes, python_pin, matrix)
    named = _named_releases(pins, matrix, facts)
    torch_release, torch_version, ds_release, ds_version, cuda_pin = named
    check_pins(facts, pins, named, matrix)
    releases = [torch_release] if torch_release else newest_first(matrix["torch"])
    ds_releases = [ds_release] if ds_release else newest_first(matrix["deepspeed"])
    found = _newest_stack(facts, matrix, releases, ds_releases, torch_version, cuda_pin, ds_version)
    if found is not None:
        return found
    explain_no_fit(facts, matrix, releases, ds_releases, torch_version, cuda_pin, ds_version, python_pin)
    return None  # not reached: explain_no_fit raises


# ---------------------------------------------------------------- the nodes' facts


def _nodes_facts(nodes, python_pin, matrix):
    """Every node's facts (``_node_facts``), in the order of ``nodes``; ``StackError`` naming each bad one."""
    facts = []
    problems = []
    bad_hosts = {}
    for host in nodes:
        f, problem = _node_facts(host, nodes[host], python_pin, matrix)
        facts.append(f)
        if problem:
            problems.append(problem)
            bad_hosts[host] = "no driver" if "no NVIDIA driver" in problem else "bad facts"
    if problems:
        raise_no_stack(problems, facts, matrix, None, None, None, None, bad_hosts)
    return facts


def _node_facts(host, node, python_pin, matrix):
    """(facts, problem or None) for one node."""
    node = node or {}
    accel = str(node.get("accelerator") or "cpu").strip().lower()
    python_text = python_pin if python_pin is not None else node.get("python")
    facts = {
        "host": host,
        "accelerator": accel,
        "python_text": str(python_text) if python_text is not None else None,
        "python": None,
        "driver": node.get("driver_version") or None,
        "max_cuda": None,
    }
    if accel not in ACCELERATORS:
        return facts, ("%s: %s %r is not one the matrix knows (%s). Fix: set %s for %s to cuda or cpu."
                       % (host, VAR_ACCELERATOR, accel, ", ".join(ACCELERATORS), VAR_ACCELERATOR, host))
    try:
        facts["python"] = parse_version(python_text)
    except ValueError:
        if python_pin is not None:
            return facts, ("%s: %s %r is not a Python version. Fix: set %s to a version such as 3.11, "
                           "or unset it." % (host, VAR_PYTHON, python_pin, VAR_PYTHON))
        return facts, ("%s: python %r: no Python version known for the node. Fix: install python3 on %s "
                       "(the facts need it)." % (host, python_text, host))
    if accel != "cuda":
        return facts, None
    smi = node.get("cuda_driver_version") or None
    if smi is None and facts["driver"] is None:
        return facts, ("%s: accelerator cuda but no NVIDIA driver found (no driver version, no CUDA "
                       "version from nvidia-smi). Fix: install the NVIDIA driver on %s, or set its %s "
                       "to cpu." % (host, host, VAR_ACCELERATOR))
    try:
        if smi is not None:
            facts["max_cuda"] = version_text(parse_version(smi)[:2])
        else:
            facts["max_cuda"] = driver_max_cuda(facts["driver"], matrix)
    except ValueError:
        return facts, ("%s: driver %r / CUDA %r from nvidia-smi is not a version. Fix: check nvidia-smi "
                       "on %s (reinstall the NVIDIA driver)." % (host, facts["driver"], smi, host))
    if facts["max_cuda"] is None:
        oldest = min(matrix["cuda"], key=parse_version)
        return facts, ("%s: driver %s is older than every CUDA in the matrix (CUDA %s needs >= %s). "
                       "Fix: upgrade the NVIDIA driver on %s to >= %s, or set its %s to cpu."
                       % (host, facts["driver"], oldest, matrix["cuda"][oldest], host,
                          matrix["cuda"][oldest], VAR_ACCELERATOR))
    return facts, None


# ---------------------------------------------------------------- the releases the pins name


def _named_releases(pins, matrix, facts):
    """Which releases the pins name: (torch release, torch version, deepspeed release, deepspeed version,
    cuda 'X.Y'), each None when unpinned; ``StackError`` for a pin the matrix does not hold."""
    problems = []
    torch_release = torch_version = ds_release = ds_version = cuda_pin = None
    if pins.get("torch"):
        torch_release, torch_version, problem = _torch_pin(pins["torch"], matrix)
        if problem:
            problems.append(problem)
    if pins.get("deepspeed"):
        ds_release, ds_version, problem = _deepspeed_pin(pins["deepspeed"], matrix)
        if problem:
            problems.append(problem)
    if pins.get("cuda") and not problems:
        cuda_pin, problem = _cuda_pin(pins["cuda"], matrix, torch_release)
        if problem:
            problems.append(problem)
    if problems:
        raise_no_stack(problems, facts, matrix, torch_release, torch_version, None, ds_version, {})
    return torch_release, torch_version, ds_release, ds_version, cuda_pin


def _torch_pin(pin, matrix):
    """(release, version, problem)."""
    text = str(pin).strip()
    if "+" in text:
        version, tag = text.split("+", 1)
        try:
            fix = "set %s to %s and %s to %s" % (VAR_TORCH, version, VAR_CUDA, build_cuda(tag))
        except ValueError:
            fix = "set %s to %s" % (VAR_TORCH, version)
        return None, None, ("all nodes: %s %s carries a build tag; the build is chosen per node. Fix: %s."
                            % (VAR_TORCH, text, fix))
    return _pinned_release(matrix, "torch", text, VAR_TORCH)


def _pinned_release(matrix, table, text, variable):
    """(release, version, problem) of a pin like 2.13 (its newest version) or 2.13.0 in matrix[table]."""
    try:
        v = parse_version(text)
    except ValueError:
        v = None
    for release in matrix[table]:
        versions = matrix[table][release]["versions"]
        if v is not None and len(v) == 2 and v == parse_version(release):
            return release, newest(versions), None
        if v is not None and len(v) == 3:
            same = [x for x in versions if compare_versions(v, parse_version(x)) == 0]
            if same:
                return release, same[0], None
    known = ", ".join(newest(matrix[table][r]["versions"]) for r in newest_first(matrix[table]))
    return None, None, ("all nodes: %s %s is not in the matrix (known: %s). Fix: set %s to one of them, "
                        "or add it to the matrix with %s." % (variable, text, known, variable, VAR_EXTRA))


def _deepspeed_pin(pin, matrix):
    """(release, version, problem)."""
    return _pinned_release(matrix, "deepspeed", str(pin).strip(), VAR_DEEPSPEED)


def _cuda_pin(pin, matrix, torch_release):
    """(cuda 'X.Y', problem)."""
    text = str(pin).strip()
    try:
        cuda = build_cuda(text) if text.startswith("cu") else version_text(parse_version(text)[:2])
        build = build_name(cuda)
    except ValueError:
        return None, ("all nodes: %s %r is not a CUDA version. Fix: set %s to a version such as 12.8, "
                      "or unset it." % (VAR_CUDA, text, VAR_CUDA))
    releases = [torch_release] if torch_release else list(matrix["torch"])
    having = [r for r in releases if build in matrix["torch"][r]["builds"]]
    if having:
        return cuda, None
    if torch_release:
        builds = matrix["torch"][torch_release]["builds"]
        return None, ("all nodes: %s %s: torch %s has no %s build (it has %s). Fix: set %s to one of %s, "
                      "or change %s, or unset one of them."
                      % (VAR_CUDA, text, torch_release, build, ", ".join(builds), VAR_CUDA,
                         ", ".join(build_cuda(b) for b in builds), VAR_TORCH))
    every = all_builds(matrix)
    return None, ("all nodes: %s %s: no torch release in the matrix has a %s build (builds: %s). Fix: set "
                  "%s to one of %s, or unset it."
                  % (VAR_CUDA, text, build, ", ".join(every), VAR_CUDA, ", ".join(build_cuda(b) for b in every)))


# ---------------------------------------------------------------- the newest stack that fits


def _newest_stack(facts, matrix, releases, ds_releases, torch_version, cuda_pin, ds_version):
    """The result for the newest torch release that fits every node, on the highest CUDA build every GPU
    node's driver runs, with the newest DeepSpeed that takes it; None when there is none."""
    gpus = [f for f in facts if f["accelerator"] == "cuda"]
    cap = min((f["max_cuda"] for f in gpus), key=parse_version) if gpus else None
    for release in releases:
        entry = matrix["torch"][release]
        if not all(node_fits(f, entry, cuda_pin) for f in facts):
            continue
        build = fitting_build(allowed_builds(entry, cuda_pin), cap) if gpus else None
        version = torch_version or newest(entry["versions"])
        for dsr in ds_releases:
            ds = matrix["deepspeed"][dsr]
            if in_range(version, ds["torch"]) and all(in_range(f["python"], ds["python"]) for f in facts):
                return _result(facts, matrix, entry, version, build, ds_version or newest(ds["versions"]))
    return None


def _result(facts, matrix, entry, version, build, ds_version):
    """``select_stack``'s answer: torch ``version`` (release ``entry``) on ``build`` for the GPU nodes, the CPU build
    for the others, DeepSpeed ``ds_version``; per node its build, requirements, package index and toolkit."""
    out = {
        "torch": version,
        "deepspeed": ds_version,
        "cuda": build_cuda(build) if build else None,
        "builds": {},
        "packages": {},
        "index_urls": {},
        "cuda_toolkit": {},
        "nccl": (entry.get("nccl") or {}).get(build) if build else None,
        "rows": [],
    }
    ds_req = matrix["deepspeed_requirement"].format(version=ds_version)
    for f in facts:
        host = f["host"]
        if f["accelerator"] == "cuda":
            out["builds"][host] = build
            torch_req = matrix["cuda_requirement"].format(version=version, build=build)
            out["index_urls"][host] = matrix["index_url"].format(build=build)
            out["cuda_toolkit"][host] = build_cuda(build).replace(".", "-")
            needs = "driver >= %s for %s" % (min_driver(build, matrix), build)
            torch_text = "%s+%s" % (version, build)
        else:
            out["builds"][host] = "cpu"
            torch_req = matrix["cpu_requirement"].format(version=version, build="cpu")
            cpu_index = matrix.get("cpu_index_url")
            out["index_urls"][host] = cpu_index.format(build="cpu") if cpu_index else None
            out["cuda_toolkit"][host] = None
            needs = None
            torch_text = "%s+cpu" % version
        out["packages"][host] = [torch_req, ds_req]
        out["rows"].append(node_row(f, torch_text, ds_version, needs))
    return out
