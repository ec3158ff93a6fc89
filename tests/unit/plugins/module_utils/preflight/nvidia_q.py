"""The fields of ``nvidia-smi --query-gpu`` that preflight's health check asks for, read from ``nvidia-smi -q``.

Some real captures of faulty GPUs exist only as ``nvidia-smi -q`` (tests/fixtures/nvidia-smi/README.md); this turns
each GPU of such a capture into the row the node side's query would have printed, so that the controller's judge
(module_utils/preflight/gpu_health.py) reads them as it reads a node.  test_preflight_gpu_health checks it against
every capture that has both (``q.txt`` and ``full.csv`` taken at the same moment): the same values, field by field.
"""
import re

# nvmlClocksEventReasons: the -q label of each bit of clocks_event_reasons.active.
REASON_BITS = {"Idle": 0x1, "Applications Clocks Setting": 0x2, "SW Power Cap": 0x4, "HW Slowdown": 0x8,
               "Sync Boost": 0x10, "SW Thermal Slowdown": 0x20, "HW Thermal Slowdown": 0x40,
               "HW Power Brake Slowdown": 0x80, "Display Clock Setting": 0x100}
REASON_SECTIONS = ("Clocks Event Reasons", "Clocks Throttle Reasons")
# (section path, label) -> field, for the values copied as they are (-q's "N/A" is the CSV's "[N/A]").
COPIED = {
    (("PCI", "GPU Link Info", "PCIe Generation"), "Max"): "pcie.link.gen.max",
    (("PCI", "GPU Link Info", "PCIe Generation"), "Current"): "pcie.link.gen.current",
    (("PCI", "GPU Link Info", "Link Width"), "Max"): "pcie.link.width.max",
    (("PCI", "GPU Link Info", "Link Width"), "Current"): "pcie.link.width.current",
    (("Retired Pages",), "Pending Page Blacklist"): "retired_pages.pending",
    (("Retired Pages",), "Pending"): "retired_pages.pending",
    (("Remapped Rows",), "Pending"): "remapped_rows.pending",
    (("Remapped Rows",), "Remapping Failure Occurred"): "remapped_rows.failure",
    ((), "GPU Recovery Action"): "gpu_recovery_action",
}
LINE = re.compile(r"^( *)(\S.*?)\s*(?::\s*(.*))?$")
GPU = re.compile(r"^GPU ([0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")


def _value(text):
    text = text.strip()
    if text == "N/A":
        return "[N/A]"
    return text[:-1] if re.fullmatch(r"\d+x", text) else text


def _finish(gpu):
    reasons, volatile = gpu.pop("_reasons"), gpu.pop("_ecc")
    if reasons is not None:
        gpu["clocks_event_reasons.active"] = "0x%016X" % reasons
    counts = [int(v) for v in volatile if v.isdigit()]
    gpu["ecc.errors.uncorrected.volatile.total"] = str(sum(counts)) if counts else "[N/A]"
    return gpu


def fields(text):
    """One dict per GPU of an ``nvidia-smi -q`` text: index, pci.bus_id and the health fields found."""
    out, gpu, path = [], None, []
    for raw in text.splitlines():
        found = GPU.match(raw)
        if found:
            if gpu is not None:
                out.append(_finish(gpu))
            gpu = {"index": str(len(out)), "pci.bus_id": found.group(1), "_reasons": None, "_ecc": []}
            path = []
            continue
        parsed = LINE.match(raw)
        if gpu is None or not parsed:
            continue
        depth, label, value = len(parsed.group(1)) // 4 - 1, parsed.group(2), parsed.group(3)
        path = path[:max(depth, 0)]
        if value is None:
            path.append(label)
            continue
        where = tuple(path)
        if where == () and label == "Remapped Rows":  # "N/A": no row remapper (no ECC, or MIG on)
            gpu["remapped_rows.pending"] = gpu["remapped_rows.failure"] = _value(value)
        elif where in COPIED_PATHS and (where, label) in COPIED:
            gpu[COPIED[(where, label)]] = _value(value)
        elif where and where[0] in REASON_SECTIONS and label in REASON_BITS:
            gpu["_reasons"] = (gpu["_reasons"] or 0) | (REASON_BITS[label] if value.strip() == "Active" else 0)
        elif where == ("ECC Errors", "Volatile") and "Uncorrectable" in label:
            gpu["_ecc"].append(value.strip())
    if gpu is not None:
        out.append(_finish(gpu))
    return out


COPIED_PATHS = set(where for where, _label in COPIED)
