# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The driver -> CUDA -> PyTorch -> DeepSpeed compatibility matrix: reading, checking and looking it up.

Pure Python, no Ansible import: unit-tested on the controller.  ``load_matrix`` merges the user's
``stack_matrix_extra`` over ``stack_matrix_data.MATRIX`` and ``validate_matrix`` names each malformed
entry (``StackError``).  Versions, PEP 440 style ranges (``in_range``) and build tags (``build_name``,
``build_cuda``) are read here, and the questions the choice asks of the matrix are answered here: a
driver's highest CUDA (``driver_max_cuda``), a build's minimum driver (``min_driver``), the builds of a
torch release a driver runs (``allowed_builds``, ``fitting_build``) and whether a node fits a release
(``node_fits``).  ``stack_select`` chooses the stack with them, ``stack_misfit`` says why none fits.
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


class StackError(ValueError):
    """No consistent stack (the message holds the node table and the problems, ``rows`` the table), or a
    malformed matrix (the message names each entry; no rows)."""

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


def compare_versions(a, b):
    """-1, 0 or 1 as version tuple ``a`` is older than, the same as or newer than ``b`` (``(12,)`` == ``(12, 0)``)."""
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
            c = compare_versions(v, bound)
            ok = {">=": c >= 0, ">": c > 0, "<=": c <= 0, "<": c < 0, "==": c == 0, "!=": c != 0}[op]
        if not ok:
            return False
    return True


def version_text(version):
    """``(12, 4)`` -> ``'12.4'``."""
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


def newest(versions):
    """The newest of ``versions`` (text)."""
    return max(versions, key=parse_version)


def newest_first(table):
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
    ok = [c for c, need in matrix["cuda"].items() if compare_versions(d, parse_version(need)) >= 0]
    return newest(ok) if ok else None


def min_driver(build, matrix):
    """The minimum Linux driver for a build (``'cu128'`` -> ``'570.26'``)."""
    return matrix["cuda"][build_cuda(build)]


# ---------------------------------------------------------------- which builds a node runs


def all_builds(matrix):
    """Every CUDA build of every torch release, oldest CUDA first."""
    return sorted(set(b for r in matrix["torch"] for b in matrix["torch"][r]["builds"]),
                  key=lambda b: parse_version(build_cuda(b)))


def allowed_builds(entry, cuda_pin):
    """The builds of torch release ``entry``, oldest CUDA first; only the pinned CUDA's when ``cuda_pin`` is set."""
    builds = sorted(entry["builds"], key=lambda b: parse_version(build_cuda(b)))
    if cuda_pin is not None:
        builds = [b for b in builds if b == build_name(cuda_pin)]
    return builds


def fitting_build(builds, max_cuda):
    """The highest of ``builds`` (oldest first) a driver whose highest CUDA is ``max_cuda`` runs."""
    ok = [b for b in builds if compare_versions(parse_version(build_cuda(b)), parse_version(max_cuda)) <= 0]
    return ok[-1] if ok else None


def node_fits(f, entry, cuda_pin):
    """Whether torch release ``entry`` fits a node's facts ``f`` (``python`` a version tuple, ``accelerator``,
    ``max_cuda``): its Python is in the release's range, and its driver runs one of the allowed builds (a GPU node)
    or the release has a CPU build (a CPU node)."""
    if not in_range(f["python"], entry["python"]):
        return False
    if f["accelerator"] == "cuda":
        return fitting_build(allowed_builds(entry, cuda_pin), f["max_cuda"]) is not None
    return entry.get("cpu", True)
