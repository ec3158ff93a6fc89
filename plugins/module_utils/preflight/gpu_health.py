# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A GPU node's health in preflight (issue 47, point 3): what ``nvidia-smi --query-gpu`` says of each GPU and the
Xid events in the node's kernel log, as multinode_ds/health.py read them on the node, judged here.

Refused (``health_action=fail``; a warning with ``warn``): uncorrected ECC errors since the driver loaded, a page
retirement or row remap waiting for a GPU reset, a failed row remap, a recovery action the driver asks for (GPU
reset, node reboot, drain), clocks held back by the hardware (HW slowdown, HW thermal slowdown, power brake), a PCIe
link narrower than the device's maximum where another GPU of the node runs wider, nvidia-smi not answering, fewer
GPUs than the node's last passing preflights saw, a GPU whose matmul pace is far below the node's fastest, and an
Xid event that NVIDIA's catalog says needs a reset or a new GPU (or the driver's "fallen off the bus" message, which
newer drivers print without an Xid), unless the node's last passing preflights already saw that line of the log.
Only named: a software thermal slowdown, every GPU of the node narrower than its maximum (how some servers and cloud
instances wire them), a PCIe link slower than its maximum while the GPU runs at full clocks (an idle or power-capped
GPU lowers its link speed to save power: not judged then), other Xid events, a kernel log the run account cannot
read.  Xid events that are the application's own (13, 31, 43, 45) are not the node's fault.

The readings' formats are those of real nodes' output (tests/fixtures/nvidia-smi/README.md): ``[N/A]`` where a GPU
has no such counter, ``Yes``/``No`` flags, the clock reasons as ``0x%016X``, Xid lines in every prefix dmesg,
journalctl and syslog print, a MIG instance's ``(PCI:0000:01:00 GPU-I:05)``.

Pure functions, no Ansible import.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

# NVML's clock event reasons (nvmlClocksEventReasons, formerly nvmlClocksThrottleReasons): bit, what it means,
# whether it refuses the node.
THROTTLE = (
    (0x08, "a hardware slowdown (HW Slowdown: overheating or the power supply)", True),
    (0x40, "a hardware thermal slowdown (HW Thermal Slowdown)", True),
    (0x80, "a hardware power brake (HW Power Brake Slowdown: the power supply asked for it)", True),
    (0x20, "a software thermal slowdown (SW Thermal Slowdown)", False),
)
# Xid: what NVIDIA's Xid catalog says it is, whether it refuses the node.
XIDS = {
    48: ("a double-bit ECC error", True),
    62: ("an internal micro-controller halted", True),
    63: ("a page retirement or row remap was recorded", False),
    64: ("a page retirement or row remap failed", True),
    74: ("an NVLink error", True),
    79: ("the GPU fell off the bus", True),
    92: ("a high single-bit ECC error rate", False),
    94: ("a contained ECC error", False),
    95: ("an uncontained ECC error", True),
    119: ("a GSP RPC timeout", True),
    109: ("a context switch timeout", False),
    120: ("a GSP error", True),
    145: ("an NVLink error", None),
    149: ("an NVLink error", None),
    154: ("the driver asks for a recovery action", None),
}
# The application's own faults (an engine exception, an MMU fault, a stopped or cleaned-up channel): not the node's.
APPLICATION_XIDS = (13, 31, 43, 45)
# Xid lines kept per passing preflight in the node's history.
XID_KEPT = 50
XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f:.]+)[^)]*\): (\d+)")
# Drivers from 570 on say it in three lines and no Xid: "NVRM: The NVIDIA GPU 0000:b3:00.0", "NVRM: (PCI ID: ...)
# installed in this system has", "NVRM: fallen off the bus and is not responding to commands."
OFF_BUS_GPU = re.compile(r"NVRM: The NVIDIA GPU ([0-9A-Fa-f:.]+)")
OFF_BUS = "fallen off the bus"
RECOVERY_NONE = ("", "none", "[n/a]", "n/a", "[not supported]")
THROTTLE_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
RESET_FIX = "drain it and reset the GPU (nvidia-smi -r -i %s) or reboot the node"
COOLING_FIX = "check its cooling, fans and power supply (nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER)"
LINK_FIX = "reseat the GPU or its riser and check the slot (lspci -vv: LnkSta against LnkCap)"


def _int(text, base=10):
    try:
        return int(str(text).strip(), base)
    except (TypeError, ValueError):
        return None


def gpus(gpu):
    """One dict per GPU (field -> its text) from the node's ``gpu`` readings; raises ValueError on a table that is
    not the query's."""
    fields = [str(f) for f in gpu.get("fields") or []] if isinstance(gpu.get("fields"), list) else []
    rows = [ln for ln in str(gpu.get("query") or "").splitlines() if ln.strip()]
    out = []
    for row in rows:
        cells = [c.strip() for c in row.split(",")]
        if len(cells) != len(fields):
            raise ValueError("nvidia-smi printed %r for the fields %s" % (row[:120], ",".join(fields)))
        out.append(dict(zip(fields, cells)))
    return out


def _gpu_problems(host, g, widest_link=None):
    """(message, fix, refuses) for one GPU's row; ``widest_link``: the widest PCIe link of the node's GPUs."""
    index = g.get("index", "?")
    name = "%s GPU %s (%s)" % (host, index, g.get("pci.bus_id", "?"))
    out = []
    ecc = _int(g.get("ecc.errors.uncorrected.volatile.total"))
    if ecc:
        out.append(("%s has %d uncorrected ECC error(s) since the driver loaded" % (name, ecc),
                    RESET_FIX % index + "; if they come back, replace the GPU", True))
    for field, what in (("retired_pages.pending", "page retirement"), ("remapped_rows.pending", "row remap")):
        if str(g.get(field, "")).lower() == "yes":
            out.append(("%s has a %s waiting for a GPU reset" % (name, what), RESET_FIX % index, True))
    if str(g.get("remapped_rows.failure", "")).lower() == "yes":
        out.append(("%s failed to remap a row of its memory" % name,
                    "the GPU needs replacing; keep the node out of runs (-e exclude=%s)" % host, True))
    action = str(g.get("gpu_recovery_action", "")).strip()
    if action.lower() not in RECOVERY_NONE:
        out.append(("%s's driver asks for a recovery action: %s" % (name, action[:60]),
                    RESET_FIX % index + " as the action says, and check dmesg | grep NVRM for the Xid behind it",
                    True))
    reasons = [_int(g.get(f), 16) for f in THROTTLE_FIELDS if f in g]
    reasons = reasons[0] if reasons and reasons[0] is not None else 0
    held = [(what, refuses) for bit, what, refuses in THROTTLE if reasons & bit]
    if held:
        out.append(("%s is held back by %s (clock event reasons 0x%x)" % (
            name, " and ".join(what for what, _r in held), reasons), COOLING_FIX, any(r for _w, r in held)))
    width, widest = _int(g.get("pcie.link.width.current")), _int(g.get("pcie.link.width.max"))
    if width and widest and width < widest:
        # Narrower than another GPU of this node: this one's slot, riser or seating.  All of them alike: the way
        # the platform wires them (named: the figure is still the job's bandwidth).
        lone = widest_link is not None and width < widest_link
        out.append(("%s's PCIe link runs at x%d of its x%d%s" % (
            name, width, widest, "" if lone else " (as every GPU of the node: the platform's wiring?)"),
            LINK_FIX, lone))
    gen, fastest = _int(g.get("pcie.link.gen.current")), _int(g.get("pcie.link.gen.max"))
    if gen and fastest and gen < fastest and reasons == 0:
        out.append(("%s's PCIe link runs at gen %d of its gen %d while busy" % (name, gen, fastest), LINK_FIX,
                    False))
    return out


def xid_events(lines):
    """(line, Xid, PCI address) of each kernel log line that reports an Xid; the driver's "fallen off the bus"
    message without one counts as Xid 79, with the line that names the GPU as its line."""
    out, gpu_line = [], None
    for line in lines if isinstance(lines, list) else []:
        line = str(line)
        found = XID_LINE.search(line)
        if found:
            out.append((line, int(found.group(2)), found.group(1)))
        elif OFF_BUS_GPU.search(line):
            gpu_line = line
        elif OFF_BUS in line and gpu_line is not None:
            # (An older driver's "NVRM: GPU 0000:ba:00.0: GPU has fallen off the bus." follows its Xid 79: not
            # another event.)
            out.append((gpu_line, 79, OFF_BUS_GPU.search(gpu_line).group(1)))
            gpu_line = None
    return out


def _xid_refuses(xid, line):
    """Whether Xid ``xid`` (its kernel log ``line``) refuses the node: NVIDIA's catalog, where the line says it (an
    NVLink error's Fatal or Nonfatal, the recovery action an Xid 154 asks for)."""
    refuses = XIDS.get(xid, ("", False))[1]
    if refuses is not None:
        return refuses
    if xid == 154:
        return not re.search(r"to 0x0 \(None\)", line)
    return bool(re.search(r"\bFatal\b", line))


def _xid_problems(host, lines, seen):
    out = []
    for line, xid, pci in xid_events(lines):
        if xid in APPLICATION_XIDS or line in seen:
            continue
        what, refuses = XIDS.get(xid, ("an Xid event", False))[0], _xid_refuses(xid, line)
        out.append(("%s's GPU at PCI:%s logged Xid %d (%s): %s" % (host, pci, xid, what, line.split("NVRM: ", 1)[-1][:200]),
                    "reset the GPU or reboot the node, then check nvidia-smi -q (NVIDIA's Xid catalog says what "
                    "Xid %d asks for); once dealt with, one preflight with -e preflight_health_action=warn records "
                    "the line as seen" % xid, refuses))
    return out


def _slow_gpus(host, gflops, fraction):
    """(message, fix, refuses) for each GPU whose matmul pace is below ``fraction`` of the node's fastest GPU."""
    if not isinstance(gflops, list):
        return []
    figures = [g for g in gflops if isinstance(g, (int, float)) and g > 0]
    if len(figures) != len(gflops) or len(figures) < 2:
        return []
    fastest = max(figures)
    return [("%s GPU %d computes at %.0f GFLOP/s, %.0f%% of the node's fastest GPU (%.0f GFLOP/s)" % (
        host, index, value, 100.0 * value / fastest, fastest), COOLING_FIX, True)
        for index, value in enumerate(figures) if value < fraction * fastest]


def problems(host, gpu, seen=(), had=None, fraction=0.5):
    """(message, fix, refuses) for what the node's ``gpu`` readings show, and a note for the passing detail.

    ``seen``: kernel log lines the node's last passing preflights already recorded; ``had``: the most GPUs
    nvidia-smi listed there then (fewer now: one fell off the bus or did not initialize); a GPU whose matmul pace
    (``gpu["gflops"]``) is below ``fraction`` of the node's fastest GPU's is refused too."""
    if not isinstance(gpu, dict):
        return [], ""
    out = []
    if gpu.get("error"):
        hung = "did not answer" in str(gpu["error"])
        out.append(("nvidia-smi on %s: %s" % (host, str(gpu["error"])[-300:]),
                    "check the driver (nvidia-smi; dmesg | grep NVRM) or reboot the node", hung))
        count = 0
    else:
        try:
            rows = gpus(gpu)
        except ValueError as exc:
            return [(str(exc), "check the driver's nvidia-smi on %s" % host, False)], ""
        count = len(rows)
        if had and count < had:
            out.append(("nvidia-smi on %s lists %d GPU(s), %d at its last passing preflights" % (host, count, had),
                        "a GPU fell off the bus or did not initialize: check dmesg | grep NVRM, reseat the GPU or "
                        "reboot the node", True))
        widths = [_int(g.get("pcie.link.width.current")) for g in rows]
        widest_link = max([w for w in widths if w] or [0]) or None
        for g in rows:
            out.extend(_gpu_problems(host, g, widest_link))
        out.extend(_slow_gpus(host, gpu.get("gflops"), fraction))
        if gpu.get("gflops_error"):
            out.append(("%s's GPUs' matmul pace not measured: %s" % (host, str(gpu["gflops_error"])[:300]),
                        "check torch's CUDA on %s (python -c 'import torch; print(torch.cuda.is_available())')" % host,
                        False))
    out.extend(_xid_problems(host, gpu.get("xid"), set(seen or ())))
    note = "%d GPU(s) healthy" % count if count else ""
    if gpu.get("xid_error"):
        note += "%sXid events not read (%s: add the run account to group systemd-journal for preflight to read " \
                "them)" % ("; " if note else "", str(gpu["xid_error"])[:160])
    return out, note


def listed(gpu):
    """How many GPUs the readings list (None when nvidia-smi failed or printed another table)."""
    if not isinstance(gpu, dict) or gpu.get("error"):
        return None
    try:
        return len(gpus(gpu))
    except ValueError:
        return None
