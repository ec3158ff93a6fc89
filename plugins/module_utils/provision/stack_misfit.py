# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Why no row of the matrix fits the nodes: the problems, one line each naming the host, the variable and the fix.

``check_pins`` names each node a pin (``stack_torch_version``, ``stack_cuda_version``, ``stack_deepspeed_version``)
contradicts; ``explain_no_fit`` says why no stack fits when ``stack_select`` found none (a node no torch release
fits, no release common to all nodes, no DeepSpeed release that takes it).  Both raise through
``raise_no_stack``: a ``StackError`` with the node table (``stack_table``, each row saying what the node would need
and its status), then the problems.  Pure Python, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.stack_matrix import (
    ACCELERATORS, VAR_ACCELERATOR, VAR_CUDA, VAR_DEEPSPEED, VAR_EXTRA, VAR_PYTHON, VAR_TORCH, StackError,
    all_builds, allowed_builds, build_cuda, build_name, compare_versions, fitting_build, in_range, min_driver,
    newest, newest_first, node_fits, parse_version)
from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.stack_table import (
    format_table, node_row)


# ---------------------------------------------------------------- the error


def _error_rows(facts, matrix, release, version, cuda_pin, deepspeed, bad_hosts):
    """The node table of the error: per node, the build of torch ``release`` it would get and what that needs."""
    rows = []
    for f in facts:
        if release is None or f["python"] is None or f["accelerator"] not in ACCELERATORS:
            rows.append(node_row(f, deepspeed=deepspeed, status=bad_hosts.get(f["host"], "ok")))
            continue
        entry = matrix["torch"][release]
        needs = []
        torch_text = "%s+cpu" % version
        if f["accelerator"] == "cuda":
            builds = allowed_builds(entry, cuda_pin)
            build = (fitting_build(builds, f["max_cuda"]) if f["max_cuda"] else None) or (
                builds[0] if builds else None)
            if build:
                torch_text = "%s+%s" % (version, build)
                needs.append("driver >= %s for %s" % (min_driver(build, matrix), build))
        if not in_range(f["python"], entry["python"]):
            needs.append("python %s" % entry["python"])
        rows.append(node_row(f, torch_text, deepspeed, "; ".join(needs) or None,
                             bad_hosts.get(f["host"], "ok")))
    return rows


def raise_no_stack(problems, facts, matrix, release, version, cuda_pin, deepspeed, bad_hosts):
    """Raise the ``StackError``: the node table (for torch ``release``/``version``, what each node would need,
    its status from ``bad_hosts``), then the ``problems``."""
    rows = _error_rows(facts, matrix, release, version, cuda_pin, deepspeed, bad_hosts)
    message = "No consistent driver/CUDA/PyTorch/DeepSpeed stack for these nodes:\n\n%s\n\n%s" % (
        format_table(rows), "\n".join(problems))
    raise StackError(message, rows)


# ---------------------------------------------------------------- the nodes a pin contradicts


def check_pins(facts, pins, named, matrix):
    """Raise the ``StackError`` naming each node a pin contradicts, and a pinned torch no DeepSpeed takes.

    ``named``: the releases the pins name (torch release, torch version, deepspeed release, deepspeed version,
    cuda 'X.Y'), each None when unpinned."""
    torch_release, torch_version, ds_release, ds_version, cuda_pin = named
    gpus = [f for f in facts if f["accelerator"] == "cuda"]
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
        raise_no_stack(problems, facts, matrix, torch_release, torch_version, cuda_pin, ds_version, bad_hosts)


def _cuda_pin_misfits(gpus, cuda_pin, torch_release, matrix, bad_hosts):
    """One problem per GPU node whose driver does not run the pinned CUDA (marked in ``bad_hosts``)."""
    problems = []
    for f in gpus:
        if cuda_pin and compare_versions(parse_version(cuda_pin), parse_version(f["max_cuda"])) > 0:
            build = build_name(cuda_pin)
            # A build the pinned torch has, when torch is pinned too.
            candidates = (allowed_builds(matrix["torch"][torch_release], None) if torch_release
                          else all_builds(matrix))
            lower = fitting_build(candidates, f["max_cuda"])
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
    builds = allowed_builds(entry, cuda_pin)
    for f in facts:
        if not in_range(f["python"], entry["python"]):
            problems.append(_pin_python_problem(f, VAR_TORCH, pins["torch"], entry["python"], pins.get("python"),
                                                "a release for Python %s" % f["python_text"]))
            bad_hosts[f["host"]] = "python out of range"
        elif f["accelerator"] == "cuda" and not cuda_pin and not fitting_build(builds, f["max_cuda"]):
            alt = _newest_with_build(matrix, f, None)
            problems.append(
                "%s: %s %s needs driver >= %s (%s, its oldest CUDA build); %s has driver %s (max CUDA %s). "
                "Fix: upgrade the NVIDIA driver on %s to >= %s, or %s, or unset it."
                % (f["host"], VAR_TORCH, pins["torch"], min_driver(builds[0], matrix), builds[0],
                   f["host"], f["driver"] or "-", f["max_cuda"], f["host"], min_driver(builds[0], matrix),
                   ("set %s to %s (the newest torch with a build that a driver for CUDA %s runs)"
                    % (VAR_TORCH, alt, f["max_cuda"])) if alt else "set its %s to cpu" % VAR_ACCELERATOR))
            bad_hosts[f["host"]] = "driver too old"
    return problems


def _newest_with_build(matrix, f, cuda_pin):
    """The newest torch version with a build the node runs and its Python fits."""
    for release in newest_first(matrix["torch"]):
        entry = matrix["torch"][release]
        if not in_range(f["python"], entry["python"]):
            continue
        if fitting_build(allowed_builds(entry, cuda_pin), f["max_cuda"]):
            return newest(entry["versions"])
    return None


def _deepspeed_for_torch_pin(pins, torch_version, matrix):
    """The problem (a list of zero or one) that no DeepSpeed release takes the pinned torch."""
    takers = [r for r in matrix["deepspeed"]
              if in_range(torch_version, matrix["deepspeed"][r]["torch"])]
    if takers:
        return []
    ranges = "; ".join("%s: torch %s" % (newest(matrix["deepspeed"][r]["versions"]),
                                         matrix["deepspeed"][r]["torch"])
                       for r in newest_first(matrix["deepspeed"]))
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
            problems.append(_pin_python_problem(f, VAR_DEEPSPEED, pins["deepspeed"], ds["python"],
                                                pins.get("python"), "another release"))
            bad_hosts[f["host"]] = "python out of range"
    return problems


# ---------------------------------------------------------------- why no stack fits


def explain_no_fit(facts, matrix, releases, ds_releases, torch_version, cuda_pin, ds_version, python_pin):
    """Raise the ``StackError`` that says why no stack fits: nodes no torch fits, no torch common to all, or
    no DeepSpeed that takes it."""
    py_var = VAR_PYTHON if python_pin else "python"
    bad_hosts = {}
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
    version = torch_version or newest(matrix["torch"][target]["versions"])
    raise_no_stack(problems, facts, matrix, target, version, cuda_pin, ds_version, bad_hosts)


def _release_fits(facts, matrix, releases, cuda_pin):
    """Which of the torch ``releases`` each node fits: ``(fits, py_fits)``, host -> releases, all told
    (Python, and a build its driver runs or the CPU build) and by its Python alone."""
    fits = dict((f["host"], [r for r in releases if node_fits(f, matrix["torch"][r], cuda_pin)]) for f in facts)
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
        builds = allowed_builds(matrix["torch"][r], cuda_pin)
        if builds:
            needs.append((parse_version(min_driver(builds[0], matrix)), builds[0], r))
    if not needs:
        return "set its %s to cpu" % VAR_ACCELERATOR
    lowest = min(n[0] for n in needs)
    need = max((n for n in needs if n[0] == lowest), key=lambda n: parse_version(n[2]))
    return "upgrade the NVIDIA driver on %s to >= %s (%s of torch %s)" % (
        f["host"], min_driver(need[1], matrix), need[1], newest(matrix["torch"][need[2]]["versions"]))


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
                         if fitting_build(allowed_builds(matrix["torch"][r], cuda_pin), f["max_cuda"])]
            alt = (", or use a Python that torch %s takes (%s) on %s" % (
                newest(matrix["torch"][by_driver[0]]["versions"]), matrix["torch"][by_driver[0]]["python"],
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
    version = torch_version or newest(matrix["torch"][common[0]]["versions"])
    for dsr in ds_releases:
        ds = matrix["deepspeed"][dsr]
        name = ds_version or newest(ds["versions"])
        if not any(in_range(torch_version or newest(matrix["torch"][r]["versions"]), ds["torch"])
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


def _span(releases):
    """'2.9-2.13' for a list of release keys."""
    if not releases:
        return "none"
    ordered = sorted(releases, key=parse_version)
    return ordered[0] if len(ordered) == 1 else "%s-%s" % (ordered[0], ordered[-1])
