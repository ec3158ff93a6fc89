# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVIDIA accelerator facts from ``nvidia-smi`` output.

Pure Python, no Ansible import: unit-tested on the controller against captured
``nvidia-smi`` output (tests/fixtures/nvidia-smi).  The module runs the two
commands and hands their results to ``accelerator_facts``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import re

# nvidia-smi arguments of the per-GPU query (the module and the tests share them).
QUERY_FIELDS = ["index", "uuid", "name", "memory.total", "compute_cap", "driver_version", "pci.bus_id"]
QUERY_ARGS = ["--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader,nounits"]

OK = "ok"
ABSENT = "absent"
NO_DEVICES = "no_devices"
DRIVER_ERROR = "driver_error"

NO_DEVICES_TEXT = "No devices were found"
NO_DEVICES_RC = 6

_DRIVER_RE = re.compile(r"Driver Version:\s*([0-9][0-9.]*)")
_CUDA_RE = re.compile(r"CUDA Version:\s*([0-9][0-9.]*)")


def _na(value):
    """``None`` for nvidia-smi's placeholders (``[N/A]``, ``[Not Supported]``, ``N/A``) and blanks."""
    value = value.strip()
    if not value or value == "N/A" or (value.startswith("[") and value.endswith("]")):
        return None
    return value


def _int(value):
    value = _na(value)
    if value is None:
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def parse_query_csv(text):
    """GPUs from the output of the ``QUERY_ARGS`` query.

    Returns a list of dicts: ``index`` (int), ``uuid``, ``name``, ``memory_mib`` (int),
    ``compute_capability`` (``"9.0"``), ``driver_version``, ``pci_bus_id``; a field that
    nvidia-smi reports as ``[N/A]`` is ``None``.  Blank lines and lines that are not
    query rows (an error message, say) are skipped.
    """
    gpus = []
    for line in (text or "").splitlines():
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < len(QUERY_FIELDS):
            continue
        # A comma inside the name would split it: the name takes what the other fields leave.
        extra = len(fields) - len(QUERY_FIELDS)
        name = ", ".join(fields[2:3 + extra])
        index, uuid = fields[0], fields[1]
        memory, cc, driver, bus = fields[3 + extra:]
        if not index.isdigit():
            continue
        gpus.append({
            "index": int(index),
            "uuid": _na(uuid),
            "name": _na(name),
            "memory_mib": _int(memory),
            "compute_capability": _na(cc),
            "driver_version": _na(driver),
            "pci_bus_id": _na(bus),
        })
    return sorted(gpus, key=lambda g: g["index"])


def parse_banner(text):
    """``(driver_version, cuda_version)`` from plain ``nvidia-smi`` output; ``None`` where absent.

    ``cuda_version`` is the highest CUDA version the driver supports (the banner's
    ``CUDA Version``), not the toolkit installed.
    """
    text = text or ""
    driver = _DRIVER_RE.search(text)
    cuda = _CUDA_RE.search(text)
    return (driver.group(1) if driver else None, cuda.group(1) if cuda else None)


def _version_tuple(value):
    if value is None:
        return None
    match = re.match(r"^\s*(\d+(?:\.\d+)*)", str(value))
    if not match:
        return None
    return tuple(int(part) for part in match.group(1).split("."))


def cuda_tuple(value):
    """``"12.4"`` -> ``(12, 4)``; ``"13"`` -> ``(13, 0)``; ``None`` for ``None`` or non-version text."""
    parts = _version_tuple(value)
    if parts is None:
        return None
    return (parts + (0,))[:2]


def driver_tuple(value):
    """``"550.90.07"`` -> ``(550, 90, 7)``; ``None`` for ``None`` or non-version text."""
    return _version_tuple(value)


def _first_line(*texts):
    for text in texts:
        for line in (text or "").splitlines():
            if line.strip():
                return line.strip()
    return None


def _driver_hint(text):
    if "mismatch" in text:
        return ("Fix: the loaded NVIDIA kernel module and the installed driver libraries differ "
                "(typically after a driver update); reboot the node, or unload and reload the "
                "nvidia kernel modules.")
    if "is not a valid field" in text:
        return ("Fix: this NVIDIA driver is too old for the query (compute_cap needs driver 510 or "
                "later); update the NVIDIA driver.")
    return ("Fix: check that the NVIDIA kernel driver is installed and loaded (lsmod | grep nvidia; "
            "dmesg | grep -i nvrm), reboot after a kernel or driver update, and re-run nvidia-smi "
            "on the node.")


def _result(status, message, gpus=None, driver=None, cuda=None):
    gpus = gpus or []
    memories = [g["memory_mib"] for g in gpus if g["memory_mib"] is not None]
    ccs = [g["compute_capability"] for g in gpus if cuda_tuple(g["compute_capability"]) is not None]
    return {
        "status": status,
        "message": message,
        "count": len(gpus),
        "driver_version": driver,
        "cuda_driver_version": cuda,
        "gpus": gpus,
        "names": sorted(set(g["name"] for g in gpus if g["name"])),
        "memory_mib_min": min(memories) if memories else None,
        "compute_capability_min": min(ccs, key=cuda_tuple) if ccs else None,
    }


def accelerator_facts(binary_found, query_rc=None, query_out="", query_err="",
                      banner_rc=None, banner_out="", banner_err=""):
    """The ``multinode_accelerators`` facts from the two nvidia-smi runs.

    ``binary_found``: whether nvidia-smi exists; the query run is ``QUERY_ARGS``, the banner
    run is plain ``nvidia-smi``.  ``status`` is ``ok``, ``absent`` (no nvidia-smi: a CPU
    node), ``no_devices`` (the driver sees no GPU) or ``driver_error`` (nvidia-smi fails);
    none of them is an error of the module.
    """
    if not binary_found:
        return _result(ABSENT, "nvidia-smi not found: no NVIDIA driver on this node (normal for a CPU node).")
    texts = [query_out, query_err, banner_out, banner_err]
    if (query_rc == NO_DEVICES_RC or any(NO_DEVICES_TEXT in (t or "") for t in texts[:2])
            or (query_rc == 0 and not (query_out or "").strip())):
        return _result(NO_DEVICES, "nvidia-smi: No devices were found. The NVIDIA driver is loaded but sees "
                                   "no GPU: check that the GPUs are passed through to this node (lspci | grep "
                                   "-i nvidia) and not bound to another driver (vfio-pci).")
    gpus = parse_query_csv(query_out) if query_rc == 0 else []
    if query_rc != 0 or not gpus:
        first = _first_line(query_out, query_err, banner_out, banner_err)
        if first is None:
            first = "nvidia-smi exited with rc %s and printed nothing" % query_rc
        text = "\n".join(t or "" for t in texts)
        return _result(DRIVER_ERROR, "nvidia-smi failed (rc %s): %s %s" % (query_rc, first, _driver_hint(text)))
    banner_driver, cuda = parse_banner(banner_out) if banner_rc == 0 else (None, None)
    drivers = [g["driver_version"] for g in gpus if g["driver_version"]]
    driver = drivers[0] if drivers else banner_driver
    facts = _result(OK, "", gpus, driver, cuda)
    facts["message"] = "%d GPU(s): %s; %s MiB min, compute capability %s min; driver %s, CUDA %s." % (
        facts["count"], ", ".join(facts["names"]) or "unnamed", facts["memory_mib_min"],
        facts["compute_capability_min"], driver, cuda if cuda else "unknown")
    return facts


def locate(name, get_bin_path):
    """The nvidia-smi to run: ``name`` itself when it is a path (and executable), else looked up on PATH by
    ``get_bin_path`` (AnsibleModule.get_bin_path); None when there is none."""
    if os.path.sep in name:
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    return get_bin_path(name, required=False)


def read_accelerators(name, get_bin_path, run_command):
    """Run nvidia-smi (query, then banner) with ``run_command`` (AnsibleModule.run_command) and return the facts."""
    binary = locate(name, get_bin_path)
    if binary is None:
        return accelerator_facts(False)
    query = run_command([binary] + QUERY_ARGS)
    banner = run_command([binary])
    return accelerator_facts(True, *(tuple(query) + tuple(banner)))
