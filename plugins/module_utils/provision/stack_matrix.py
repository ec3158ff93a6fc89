# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Choose one driver -> CUDA -> PyTorch -> DeepSpeed stack for a whole cluster.

Pure Python, no Ansible import: unit-tested on the controller.  The facts live in
``stack_matrix_data.MATRIX``; ``select_stack`` picks the newest consistent set from them, or
raises ``StackError`` with a table of the nodes and one line per problem naming the host, the
variable and the fix.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy
import re

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.stack_matrix_data import MATRIX

# The variables a user sets, as the problems name them.
VAR_TORCH = "stack_torch_version"
VAR_CUDA = "stack_cuda_version"
VAR_DEEPSPEED = "stack_deepspeed_version"
VAR_PYTHON = "stack_python_version"
VAR_ACCELERATOR = "stack_accelerator"
VAR_EXTRA = "stack_matrix_extra"

ACCELERATORS = ("cuda", "cpu")

_VERSION_RE = re.compile(r"^\d+(\.\d+)*$")
_BUILD_RE = re.compile(r"^cu(\d+)(\d)$")
_CLAUSE_RE = re.compile(r"^(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)(\.\*)?$")

COLUMNS = [
    ("host", "HOST"),
    ("python", "PYTHON"),
    ("accelerator", "ACCEL"),
    ("driver", "DRIVER"),
    ("max_cuda", "MAX CUDA"),
    ("torch", "TORCH"),
    ("deepspeed", "DEEPSPEED"),
    ("needs", "NEEDS"),
    ("status", "STATUS"),
]


class StackError(ValueError):
    """No consistent stack: the message holds the node table and the problems, ``rows`` the table."""

    def __init__(self, message, rows=None):
        super(StackError, self).__init__(message)
        self.message = message
        self.rows = list(rows or [])


# ---------------------------------------------------------------- versions and ranges


def parse_version(text):
    """``'12.4'`` -> ``(12, 4)``; ``ValueError`` for anything but dot-separated numbers."""
    text = str(text).strip()
    if not _VERSION_RE.match(text):
        raise ValueError("not a version: %r" % (text,))
    return tuple(int(p) for p in text.split("."))


def _cmp(a, b):
    width = max(len(a), len(b))
    a = a + (0,) * (width - len(a))
    b = b + (0,) * (width - len(b))
    return (a > b) - (a < b)


def _clauses(spec):
    out = []
    for clause in (spec or "").split(","):
        clause = clause.strip()
        if not clause:
            continue
        m = _CLAUSE_RE.match(clause)
        if not m or (m.group(3) and m.group(1) not in ("==", "!=")):
            raise ValueError("not a version range: %r" % (spec,))
        out.append((m.group(1), parse_version(m.group(2)), bool(m.group(3))))
    return out


def in_range(version, spec):
    """Whether ``version`` (text or tuple) satisfies ``spec`` (``'>=3.10,<3.16'``; empty: any)."""
    v = parse_version(version) if not isinstance(version, tuple) else version
    for op, bound, prefix in _clauses(spec):
        if prefix:
            hit = v[:len(bound)] == bound
            ok = hit if op == "==" else not hit
        else:
            c = _cmp(v, bound)
            ok = {">=": c >= 0, ">": c > 0, "<=": c <= 0, "<": c < 0, "==": c == 0, "!=": c != 0}[op]
        if not ok:
            return False
    return True


def _vtext(version):
    return ".".join(str(p) for p in version)


def build_name(cuda):
    """``'12.8'`` -> ``'cu128'``."""
    v = parse_version(cuda)
    return "cu%d%d" % (v[0], v[1] if len(v) > 1 else 0)


def build_cuda(build):
    """``'cu128'`` -> ``'12.8'``; ``ValueError`` for anything else."""
    m = _BUILD_RE.match(str(build))
    if not m:
        raise ValueError("not a CUDA build tag: %r" % (build,))
    return "%d.%d" % (int(m.group(1)), int(m.group(2)))


def _newest(versions):
    return max(versions, key=parse_version)


def _releases(table):
    """Release keys of ``table``, newest first."""
    return sorted(table, key=parse_version, reverse=True)


# ---------------------------------------------------------------- the matrix


def _merge(base, extra):
    for key, value in extra.items():
        if value is None:
            base.pop(key, None)
        elif isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def validate_matrix(matrix):
    """Raise ``StackError`` naming each malformed entry of ``matrix``."""
    problems = []

    def bad(what, fix="fix the entry"):
        problems.append("matrix: %s. Fix: %s in %s." % (what, fix, VAR_EXTRA))

    for section in ("cuda", "torch", "deepspeed"):
        if not isinstance(matrix.get(section), dict):
            bad("section %r is missing or not a mapping" % section, "give it as a mapping")
    if problems:
        raise StackError("\n".join(problems))
    for cuda, driver in matrix["cuda"].items():
        try:
            parse_version(cuda)
            parse_version(driver)
        except ValueError:
            bad("cuda %r -> driver %r is not version -> version" % (cuda, driver))
    for kind, keys in (("torch", ("versions", "python", "builds")),
                       ("deepspeed", ("versions", "torch", "python"))):
        for release, entry in matrix[kind].items():
            where = "%s %s" % (kind, release)
            if not isinstance(entry, dict):
                bad("%s is not a mapping" % where)
                continue
            missing = [k for k in keys if k not in entry]
            if missing:
                bad("%s lacks %s" % (where, ", ".join(missing)))
                continue
            try:
                parse_version(release)
                versions = list(entry["versions"])
                for v in versions:
                    parse_version(v)
                    if not in_range(v, "==%s.*" % release):
                        bad("%s lists version %s of another release" % (where, v))
                if not versions:
                    bad("%s lists no versions" % where)
                _clauses(entry["python"])
                if kind == "deepspeed":
                    _clauses(entry["torch"])
            except (ValueError, TypeError) as exc:
                bad("%s: %s" % (where, exc))
                continue
            if kind == "torch":
                for build in entry["builds"]:
                    try:
                        cuda = build_cuda(build)
                    except ValueError as exc:
                        bad("%s: %s" % (where, exc))
                        continue
                    if cuda not in matrix["cuda"]:
                        bad("%s has build %s but the cuda table has no %s row" % (where, build, cuda),
                            "add cuda: {'%s': '<minimum driver>'}" % cuda)
    for key in ("cuda_requirement", "cpu_requirement", "deepspeed_requirement", "index_url"):
        if not isinstance(matrix.get(key), str):
            bad("%s is missing or not a string" % key)
    if problems:
        raise StackError("\n".join(problems))
    return matrix


def load_matrix(extra=None):
    """A copy of ``MATRIX`` with ``extra`` (same shape) merged over it, validated."""
    matrix = copy.deepcopy(MATRIX)
    if extra is not None:
        if not isinstance(extra, dict):
            raise StackError("matrix: the extension is a %s, not a mapping. Fix: give %s as a mapping "
                             "shaped like the matrix (cuda, torch, deepspeed)."
                             % (type(extra).__name__, VAR_EXTRA))
        _merge(matrix, extra)
    return validate_matrix(matrix)


def driver_max_cuda(driver, matrix=None):
    """The highest CUDA (``'12.4'``) whose minimum driver ``driver`` meets; ``None`` if none."""
    matrix = load_matrix() if matrix is None else matrix
    d = parse_version(driver)
    ok = [c for c, need in matrix["cuda"].items() if _cmp(d, parse_version(need)) >= 0]
    return _newest(ok) if ok else None


def min_driver(build, matrix):
    """The minimum Linux driver for a build (``'cu128'`` -> ``'570.26'``)."""
    return matrix["cuda"][build_cuda(build)]


def format_table(rows):
    """A fixed-width text table of ``rows`` (the ``rows`` of a result or of a ``StackError``)."""
    cells = [[title for key, title in COLUMNS]]
    for row in rows:
        cells.append([str(row.get(key) if row.get(key) not in (None, "") else "-") for key, title in COLUMNS])
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() for line in cells)


# ---------------------------------------------------------------- selection


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
            facts["max_cuda"] = _vtext(parse_version(smi)[:2])
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
            return release, _newest(versions), None
        if v is not None and len(v) == 3:
            same = [x for x in versions if _cmp(v, parse_version(x)) == 0]
            if same:
                return release, same[0], None
    known = ", ".join(_newest(matrix[table][r]["versions"]) for r in _releases(matrix[table]))
    return None, None, ("all nodes: %s %s is not in the matrix (known: %s). Fix: set %s to one of them, "
                        "or add it to the matrix with %s." % (variable, text, known, variable, VAR_EXTRA))


def _deepspeed_pin(pin, matrix):
    """(release, version, problem)."""
    return _pinned_release(matrix, "deepspeed", str(pin).strip(), VAR_DEEPSPEED)


def _cuda_pin(pin, matrix, torch_release):
    """(cuda 'X.Y', problem)."""
    text = str(pin).strip()
    try:
        cuda = build_cuda(text) if text.startswith("cu") else _vtext(parse_version(text)[:2])
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
    every = _all_builds(matrix)
    return None, ("all nodes: %s %s: no torch release in the matrix has a %s build (builds: %s). Fix: set "
                  "%s to one of %s, or unset it."
                  % (VAR_CUDA, text, build, ", ".join(every), VAR_CUDA, ", ".join(build_cuda(b) for b in every)))


def _all_builds(matrix):
    """Every CUDA build of every torch release, oldest CUDA first."""
    return sorted(set(b for r in matrix["torch"] for b in matrix["torch"][r]["builds"]),
                  key=lambda b: parse_version(build_cuda(b)))


def _allowed_builds(entry, cuda_pin):
    builds = sorted(entry["builds"], key=lambda b: parse_version(build_cuda(b)))
    if cuda_pin is not None:
        builds = [b for b in builds if b == build_name(cuda_pin)]
    return builds


def _fitting_build(builds, max_cuda):
    """The highest of ``builds`` (oldest first) a driver whose highest CUDA is ``max_cuda`` runs."""
    ok = [b for b in builds if _cmp(parse_version(build_cuda(b)), parse_version(max_cuda)) <= 0]
    return ok[-1] if ok else None


def _host_fits(f, entry, cuda_pin):
    if not in_range(f["python"], entry["python"]):
        return False
    if f["accelerator"] == "cuda":
        return _fitting_build(_allowed_builds(entry, cuda_pin), f["max_cuda"]) is not None
    return entry.get("cpu", True)


def _span(releases):
    """'2.9-2.13' for a list of release keys."""
    if not releases:
        return "none"
    ordered = sorted(releases, key=parse_version)
    return ordered[0] if len(ordered) == 1 else "%s-%s" % (ordered[0], ordered[-1])


def _python_text(f):
    return f["python_text"] if f["python_text"] is not None else "-"


def _row(f, torch_text=None, deepspeed=None, needs=None, status="ok"):
    gpu = f["accelerator"] == "cuda"
    return {
        "host": f["host"],
        "python": _python_text(f),
        "accelerator": f["accelerator"],
        "driver": f["driver"] if gpu else None,
        "max_cuda": f["max_cuda"] if gpu else None,
        "torch": torch_text,
        "deepspeed": deepspeed,
        "needs": needs,
        "status": status,
    }


def _error_rows(facts, matrix, release, version, cuda_pin, deepspeed, bad_hosts):
    rows = []
    for f in facts:
        if release is None or f["python"] is None or f["accelerator"] not in ACCELERATORS:
            rows.append(_row(f, deepspeed=deepspeed, status=bad_hosts.get(f["host"], "ok")))
            continue
        entry = matrix["torch"][release]
        needs = []
        torch_text = "%s+cpu" % version
        if f["accelerator"] == "cuda":
            builds = _allowed_builds(entry, cuda_pin)
            build = (_fitting_build(builds, f["max_cuda"]) if f["max_cuda"] else None) or (
                builds[0] if builds else None)
            if build:
                torch_text = "%s+%s" % (version, build)
                needs.append("driver >= %s for %s" % (min_driver(build, matrix), build))
        if not in_range(f["python"], entry["python"]):
            needs.append("python %s" % entry["python"])
        rows.append(_row(f, torch_text, deepspeed, "; ".join(needs) or None,
                         bad_hosts.get(f["host"], "ok")))
    return rows


def _fail(problems, facts, matrix, release, version, cuda_pin, deepspeed, bad_hosts):
    rows = _error_rows(facts, matrix, release, version, cuda_pin, deepspeed, bad_hosts)
    message = "No consistent driver/CUDA/PyTorch/DeepSpeed stack for these nodes:\n\n%s\n\n%s" % (
        format_table(rows), "\n".join(problems))
    raise StackError(message, rows)


def _newest_with_build(matrix, f, cuda_pin):
    """The newest torch version with a build the node runs and its Python fits."""
    for release in _releases(matrix["torch"]):
        entry = matrix["torch"][release]
        if not in_range(f["python"], entry["python"]):
            continue
        if _fitting_build(_allowed_builds(entry, cuda_pin), f["max_cuda"]):
            return _newest(entry["versions"])
    return None


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
    gpus = [f for f in facts if f["accelerator"] == "cuda"]
    torch_release, torch_version, ds_release, ds_version, cuda_pin = _named_releases(pins, matrix, facts)

    # Pins that a node contradicts.
    bad_hosts = {}
    problems = _cuda_pin_misfits(gpus, cuda_pin, torch_release, matrix, bad_hosts)
    if torch_release:
        problems.extend(_torch_pin_misfits(facts, pins, torch_release, cuda_pin, matrix, bad_hosts))
        if ds_release is None:
            problems.extend(_deepspeed_for_torch_pin(pins, torch_version, matrix))
    if ds_release:
        problems.extend(_deepspeed_pin_misfits(facts, pins, ds_release, ds_version, torch_release, torch_version,
                                               matrix, bad_hosts))
    if problems:
        _fail(problems, facts, matrix, torch_release, torch_version, cuda_pin, ds_version, bad_hosts)

    releases = [torch_release] if torch_release else _releases(matrix["torch"])
    ds_releases = [ds_release] if ds_release else _releases(matrix["deepspeed"])
    found = _newest_stack(facts, matrix, releases, ds_releases, torch_version, cuda_pin, ds_version)
    if found is not None:
        return found
    _diagnose(facts, matrix, releases, ds_releases, torch_version, cuda_pin, ds_version, python_pin, bad_hosts)
    return None  # not reached: _diagnose raises


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
        _fail(problems, facts, matrix, None, None, None, None, bad_hosts)
    return facts


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
        _fail(problems, facts, matrix, torch_release, torch_version, None, ds_version, {})
    return torch_release, torch_version, ds_release, ds_version, cuda_pin


def _cuda_pin_misfits(gpus, cuda_pin, torch_release, matrix, bad_hosts):
    """One problem per GPU node whose driver does not run the pinned CUDA (marked in ``bad_hosts``)."""
    problems = []
    for f in gpus:
        if cuda_pin and _cmp(parse_version(cuda_pin), parse_version(f["max_cuda"])) > 0:
            build = build_name(cuda_pin)
            # A build the pinned torch has, when torch is pinned too.
            candidates = (_allowed_builds(matrix["torch"][torch_release], None) if torch_release
                          else _all_builds(matrix))
            lower = _fitting_build(candidates, f["max_cuda"])
            problems.append(
                "%s: %s %s needs driver >= %s (%s); %s has driver %s (max CUDA %s). Fix: upgrade the "
                "NVIDIA driver on %s to >= %s, or %s, or unset it."
                % (f["host"], VAR_CUDA, cuda_pin, min_driver(build, matrix), build, f["host"],
                   f["driver"] or "-", f["max_cuda"], f["host"], min_driver(build, matrix),
                   ("set %s to %s (the newest CUDA build its driver runs)" % (VAR_CUDA, build_cuda(lower)))
                   if lower else ("set its %s to cpu" % VAR_ACCELERATOR)))
            bad_hosts[f["host"]] = "driver too old"
    return problems


def _pin_python_problem(f, variable, pin, python_range, python_pin, other):
    """The problem that release ``pin`` of ``variable`` takes Python ``python_range`` and node ``f``'s
    Python is outside it; ``other`` names what else to set ``variable`` to."""
    return ("%s: %s %s takes Python %s; %s has %s %s. Fix: use a Python in that range on %s, or set %s to %s "
            "(or unset it)." % (f["host"], variable, pin, python_range, f["host"],
                                VAR_PYTHON if python_pin else "python", f["python_text"], f["host"],
                                variable, other))


def _torch_pin_misfits(facts, pins, torch_release, cuda_pin, matrix, bad_hosts):
    """One problem per node the pinned torch does not take: its Python, else (unless CUDA is pinned too)
    its driver, which runs none of the release's builds (marked in ``bad_hosts``)."""
    problems = []
    entry = matrix["torch"][torch_release]
    builds = _allowed_builds(entry, cuda_pin)
    for f in facts:
        if not in_range(f["python"], entry["python"]):
            problems.append(_pin_python_problem(f, VAR_TORCH, pins["torch"], entry["python"], pins.get("python"),
                                                "a release for Python %s" % f["python_text"]))
            bad_hosts[f["host"]] = "python out of range"
        elif f["accelerator"] == "cuda" and not cuda_pin and not _fitting_build(builds, f["max_cuda"]):
            alt = _newest_with_build(matrix, f, None)
            problems.append(
                "%s: %s %s needs driver >= %s (%s, its oldest CUDA build); %s has driver %s (max CUDA %s). "
                "Fix: upgrade the NVIDIA driver on %s to >= %s, or %s, or unset it."
                % (f["host"], VAR_TORCH, pins["torch"], min_driver(builds[0], matrix), builds[0],
                   f["host"], f["driver"] or "-", f["max_cuda"], f["host"], min_driver(builds[0], matrix),
                   ("set %s to %s (the newest torch with a build that a driver for CUDA %s runs)" % (VAR_TORCH, alt, f["max_cuda"]))
                   if alt else "set its %s to cpu" % VAR_ACCELERATOR))
            bad_hosts[f["host"]] = "driver too old"
    return problems


def _deepspeed_for_torch_pin(pins, torch_version, matrix):
    """The problem (a list of zero or one) that no DeepSpeed release takes the pinned torch."""
    takers = [r for r in matrix["deepspeed"]
              if in_range(torch_version, matrix["deepspeed"][r]["torch"])]
    if takers:
        return []
    ranges = "; ".join("%s: torch %s" % (_newest(matrix["deepspeed"][r]["versions"]),
                                         matrix["deepspeed"][r]["torch"])
                       for r in _releases(matrix["deepspeed"]))
    return ["all nodes: %s %s is outside every DeepSpeed release's torch range (%s). Fix: set %s to "
            "a torch in one of those ranges, or add a DeepSpeed release that takes it with %s."
            % (VAR_TORCH, pins["torch"], ranges, VAR_TORCH, VAR_EXTRA)]


def _deepspeed_pin_misfits(facts, pins, ds_release, ds_version, torch_release, torch_version, matrix, bad_hosts):
    """The problems of the pinned DeepSpeed: a pinned torch outside its torch range, then one per node
    whose Python it does not take (marked in ``bad_hosts``)."""
    problems = []
    ds = matrix["deepspeed"][ds_release]
    if torch_release and not in_range(torch_version, ds["torch"]):
        problems.append(
            "all nodes: %s %s is outside deepspeed %s's torch range %s. Fix: set %s to a torch in %s, "
            "or set %s to a release that takes torch %s (or unset it)."
            % (VAR_TORCH, pins["torch"], ds_version, ds["torch"], VAR_TORCH, ds["torch"],
               VAR_DEEPSPEED, torch_version))
    for f in facts:
        if not in_range(f["python"], ds["python"]):
            problems.append(_pin_python_problem(f, VAR_DEEPSPEED, pins["deepspeed"], ds["python"], pins.get("python"),
                                                "another release"))
            bad_hosts[f["host"]] = "python out of range"
    return problems


def _newest_stack(facts, matrix, releases, ds_releases, torch_version, cuda_pin, ds_version):
    """The result for the newest torch release that fits every node, on the highest CUDA build every GPU
    node's driver runs, with the newest DeepSpeed that takes it; None when there is none."""
    gpus = [f for f in facts if f["accelerator"] == "cuda"]
    cap = min((f["max_cuda"] for f in gpus), key=parse_version) if gpus else None
    for release in releases:
        entry = matrix["torch"][release]
        if not all(_host_fits(f, entry, cuda_pin) for f in facts):
            continue
        build = _fitting_build(_allowed_builds(entry, cuda_pin), cap) if gpus else None
        version = torch_version or _newest(entry["versions"])
        for dsr in ds_releases:
            ds = matrix["deepspeed"][dsr]
            if in_range(version, ds["torch"]) and all(in_range(f["python"], ds["python"]) for f in facts):
                return _result(facts, matrix, entry, version, build, ds_version or _newest(ds["versions"]))
    return None


def _result(facts, matrix, entry, version, build, ds_version):
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
        out["rows"].append(_row(f, torch_text, ds_version, needs))
    return out


def _diagnose(facts, matrix, releases, ds_releases, torch_version, cuda_pin, ds_version, python_pin, bad_hosts):
    """Raise the ``StackError`` that says why no stack fits: nodes no torch fits, no torch common to all, or
    no DeepSpeed that takes it."""
    py_var = VAR_PYTHON if python_pin else "python"
    fits, py_fits = _release_fits(facts, matrix, releases, cuda_pin)
    common_py = [r for r in releases if all(r in py_fits[f["host"]] for f in facts)]
    common = [r for r in releases if all(r in fits[f["host"]] for f in facts)]
    target = (common or common_py or releases)[0]
    problems = _torchless_nodes(facts, matrix, releases, fits, py_fits, cuda_pin, python_pin, bad_hosts)
    if not problems and not common:
        problems = _no_common_torch(facts, matrix, fits, py_fits, common_py, cuda_pin, py_var, bad_hosts)
    if not problems:
        # Torch fits every node: DeepSpeed does not.
        target = common[0]
        problems = _deepspeed_refusals(facts, matrix, common, ds_releases, torch_version, ds_version, py_var,
                                       bad_hosts)
    if not problems:
        problems.append("all nodes: no combination of the matrix fits every node. Fix: unset %s, %s and %s, "
                        "or extend the matrix with %s." % (VAR_TORCH, VAR_CUDA, VAR_DEEPSPEED, VAR_EXTRA))
    version = torch_version or _newest(matrix["torch"][target]["versions"])
    _fail(problems, facts, matrix, target, version, cuda_pin, ds_version, bad_hosts)


def _release_fits(facts, matrix, releases, cuda_pin):
    """Which of the torch ``releases`` each node fits: ``(fits, py_fits)``, host -> releases, all told
    (Python, and a build its driver runs or the CPU build) and by its Python alone."""
    fits = dict((f["host"], [r for r in releases if _host_fits(f, matrix["torch"][r], cuda_pin)]) for f in facts)
    py_fits = dict((f["host"], [r for r in releases if in_range(f["python"], matrix["torch"][r]["python"])])
                   for f in facts)
    return fits, py_fits


def _cuda_hint(cuda_pin):
    return (" with %s %s" % (VAR_CUDA, cuda_pin)) if cuda_pin else ""


def _driver_fix(f, candidates, matrix, cuda_pin):
    """Which driver upgrade lets GPU node ``f`` run one of the torch releases ``candidates``: the lowest
    driver any of them needs (for the newest release that needs no more); cpu when none has a build."""
    needs = []
    for r in candidates:
        builds = _allowed_builds(matrix["torch"][r], cuda_pin)
        if builds:
            needs.append((parse_version(min_driver(builds[0], matrix)), builds[0], r))
    if not needs:
        return "set its %s to cpu" % VAR_ACCELERATOR
    lowest = min(n[0] for n in needs)
    need = max((n for n in needs if n[0] == lowest), key=lambda n: parse_version(n[2]))
    return "upgrade the NVIDIA driver on %s to >= %s (%s of torch %s)" % (
        f["host"], min_driver(need[1], matrix), need[1], _newest(matrix["torch"][need[2]]["versions"]))


def _torchless_nodes(facts, matrix, releases, fits, py_fits, cuda_pin, python_pin, bad_hosts):
    """One problem per node that no torch release of ``releases`` fits on its own: its Python fits none,
    else its driver runs no build of those its Python fits (marked in ``bad_hosts``)."""
    problems = []
    py_var = VAR_PYTHON if python_pin else "python"
    for f in facts:
        host = f["host"]
        if fits[host]:
            continue
        if not py_fits[host]:
            spans = []
            for r in releases:
                if matrix["torch"][r]["python"] not in spans:
                    spans.append(matrix["torch"][r]["python"])
            problems.append("%s: %s %s fits no torch release%s (Python ranges: %s). Fix: use a Python in one "
                            "of those ranges on %s%s." % (host, py_var, f["python_text"],
                                                          " allowed by the pins" if len(releases) == 1 else "",
                                                          "; ".join(spans), host,
                                                          (" or set %s to one" % VAR_PYTHON) if python_pin else ""))
            bad_hosts[host] = "python out of range"
        elif f["accelerator"] == "cuda":
            by_driver = [r for r in releases
                         if _fitting_build(_allowed_builds(matrix["torch"][r], cuda_pin), f["max_cuda"])]
            alt = (", or use a Python that torch %s takes (%s) on %s" % (
                _newest(matrix["torch"][by_driver[0]]["versions"]), matrix["torch"][by_driver[0]]["python"],
                host)) if by_driver else ""
            problems.append("%s: driver %s (max CUDA %s) runs no CUDA build%s of the torch releases its %s %s "
                            "fits (%s). Fix: %s%s." % (host, f["driver"] or "-", f["max_cuda"], _cuda_hint(cuda_pin),
                                                       py_var, f["python_text"], _span(py_fits[host]),
                                                       _driver_fix(f, py_fits[host], matrix, cuda_pin), alt))
            bad_hosts[host] = "driver too old"
    return problems


def _no_common_torch(facts, matrix, fits, py_fits, common_py, cuda_pin, py_var, bad_hosts):
    """Why no torch release fits every node although each fits one: a GPU node whose driver runs none of
    the releases every node's Python takes, or (none such) Pythons no single release takes."""
    problems = []
    if common_py:
        for f in facts:
            if f["accelerator"] == "cuda" and not [r for r in common_py if r in fits[f["host"]]]:
                problems.append(
                    "%s: driver %s (max CUDA %s) runs torch %s only%s, but the other nodes' Python needs "
                    "torch %s. Fix: %s." % (f["host"], f["driver"] or "-", f["max_cuda"],
                                            _span(fits[f["host"]]), _cuda_hint(cuda_pin), _span(common_py),
                                            _driver_fix(f, common_py, matrix, cuda_pin)))
                bad_hosts[f["host"]] = "driver too old"
    else:
        for f in facts:
            problems.append("%s: %s %s fits torch %s; no torch release fits every node's Python. Fix: use "
                            "the same Python minor on every node (one that a torch release takes)."
                            % (f["host"], py_var, f["python_text"], _span(py_fits[f["host"]])))
            bad_hosts[f["host"]] = "python mismatch"
    return problems


def _deepspeed_refusals(facts, matrix, common, ds_releases, torch_version, ds_version, py_var, bad_hosts):
    """Which DeepSpeed releases refuse the torch releases ``common`` (those every node runs) or a node's
    Python: one problem for each (the nodes marked in ``bad_hosts``)."""
    problems = []
    version = torch_version or _newest(matrix["torch"][common[0]]["versions"])
    for dsr in ds_releases:
        ds = matrix["deepspeed"][dsr]
        name = ds_version or _newest(ds["versions"])
        if not any(in_range(torch_version or _newest(matrix["torch"][r]["versions"]), ds["torch"])
                   for r in common):
            problems.append("all nodes: deepspeed %s takes torch %s, which holds none of the torch releases "
                            "these nodes run (%s). Fix: set %s to a release that takes torch %s, or add one "
                            "with %s." % (name, ds["torch"], _span(common), VAR_DEEPSPEED, version,
                                          VAR_EXTRA))
        for f in facts:
            if not in_range(f["python"], ds["python"]):
                problems.append("%s: deepspeed %s takes Python %s; %s has %s %s. Fix: use a Python in that "
                                "range on %s, or set %s to another release."
                                % (f["host"], name, ds["python"], f["host"], py_var, f["python_text"],
                                   f["host"], VAR_DEEPSPEED))
                bad_hosts[f["host"]] = "python out of range"
    return problems
