"""Preflight's GPU health judge (module_utils/preflight/gpu_health.py) on real nodes' output: nvidia-smi captures of
H100, H200, L40S, RTX 2080 SUPER and RTX 4090 nodes (healthy, under load, with MIG on, and eight H100s held back by
a hardware slowdown and power brake) and kernel log lines of Xid events from many nodes, as
tests/fixtures/nvidia-smi/README.md lists them with their sources."""
from pathlib import Path

import pytest
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight import gpu_health, health
from tests.unit.plugins.module_utils.preflight import nvidia_q

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "nvidia-smi"
ASKED = ["index", "pci.bus_id", "ecc.errors.uncorrected.volatile.total", "retired_pages.pending",
         "remapped_rows.pending", "remapped_rows.failure", "clocks_event_reasons.active", "pcie.link.gen.current",
         "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max", "gpu_recovery_action"]
PAIRS = sorted(p.name for p in FIXTURES.glob("real-*") if (p / "full.csv").exists())
FIGURES = {"compute_gflops": 150.0, "memory_gbps": 40.0, "shared_write_mbps": 1200.0}


def full_row(name):
    """The capture's --query-gpu of every field, as {field: value} (the header's units left out of the names)."""
    head, row = (FIXTURES / name / "full.csv").read_text().splitlines()[:2]
    return dict(zip([h.split(" [")[0] for h in head.split(", ")], row.split(", ")))


def as_queried(rows):
    """The node side's readings (multinode_ds.health) for GPUs given as {field: value}."""
    return {"fields": ASKED, "query": "".join(", ".join(g.get(f, "[N/A]") for f in ASKED) + "\n" for g in rows),
            "xid": []}


def from_q(name):
    return as_queried(nvidia_q.fields((FIXTURES / name / "q.txt").read_text()))


def test_the_captures_are_pairs_of_every_kind():
    assert len(PAIRS) == 10 and {p.rsplit("-", 1)[1] for p in PAIRS} == {"idle", "load"}


@pytest.mark.parametrize("name", PAIRS)
def test_the_q_reader_gives_what_the_same_node_printed_for_the_query(name):
    # The tests below read the captures that exist only as -q through nvidia_q: here it meets each capture that has
    # both, taken at the same moment.  An idle GPU's clock reasons may change between the two commands (the RTX
    # 2080's went from Idle to SW Power Cap): there, both must be reasons of an idle GPU.
    read, = nvidia_q.fields((FIXTURES / name / "q.txt").read_text())
    row = full_row(name)
    differ = [f for f in ASKED if read.get(f) != row[f]]
    if name.endswith("-idle") and differ == ["clocks_event_reasons.active"]:
        assert int(read[differ[0]], 16) | int(row[differ[0]], 16) <= 0x5
    else:
        assert differ == []


@pytest.mark.parametrize("name", PAIRS)
def test_real_healthy_gpus_pass_idle_and_under_load(name):
    # The H100 and H200 have no page retirement ([N/A]: rows are remapped), MIG hides the row remapper, the
    # consumer card has no ECC; the idle RTX 2080's link runs at gen 1 of 3 with SW Power Cap (not Idle) active.
    gpu = as_queried([full_row(name)])
    assert gpu_health.problems("worker1", gpu) == ([], "1 GPU(s) healthy")
    assert health.health_verdicts({"worker1": dict(FIGURES, gpu=gpu)})[0]["status"] == "pass"


def test_eight_real_h100s_held_back_by_a_hardware_slowdown_and_power_brake_are_each_refused():
    found, _note = gpu_health.problems("worker1", from_q("real-8xh100-535.161.08-hw-slowdown"))
    buses = ["19", "3B", "4C", "5D", "9B", "BB", "CB", "DB"]
    assert [(m, r) for m, _f, r in found] == [
        ("worker1 GPU %d (00000000:%s:00.0) is held back by a hardware slowdown (HW Slowdown: overheating or the power "
         "supply) and a hardware power brake (HW Power Brake Slowdown: the power supply asked for it) (clock event "
         "reasons 0x88)" % (i, bus), True) for i, bus in enumerate(buses)]
    assert all(f == gpu_health.COOLING_FIX for _m, f, _r in found)
    verdict = health.health_verdicts({"worker1": dict(FIGURES, gpu=from_q("real-8xh100-535.161.08-hw-slowdown"))})
    assert verdict[0]["status"] == "fail" and verdict[0]["detail"].count("power brake") == 8


def test_one_real_h100_of_eight_with_a_power_brake_is_the_one_refused():
    found, _note = gpu_health.problems("worker1", from_q("real-8xh100-535.183.01-power-brake"))
    # SW Power Cap (0x4) is the driver keeping to the power limit, not a fault; the SW thermal slowdown is named
    # with the power brake that refuses the node.
    assert [(m, r) for m, _f, r in found] == [
        ("worker1 GPU 2 (00000000:75:00.0) is held back by a hardware power brake (HW Power Brake Slowdown: the power "
         "supply asked for it) and a software thermal slowdown (SW Thermal Slowdown) (clock event reasons 0xa4)",
         True)]


def test_eight_real_consumer_gpus_without_ecc_pass():
    assert gpu_health.problems("worker1", from_q("real-8xrtx4090-535.154.05")) == ([], "8 GPU(s) healthy")


def test_a_link_narrower_than_the_nodes_other_gpus_refuses_the_same_on_every_gpu_is_named():
    rows = nvidia_q.fields((FIXTURES / "real-8xrtx4090-535.154.05" / "q.txt").read_text())
    one = [dict(g, **{"pcie.link.width.current": "8"}) if g["index"] == "5" else g for g in rows]
    found, _note = gpu_health.problems("worker1", as_queried(one))
    assert [(m, r) for m, _f, r in found] == [("worker1 GPU 5 (00000000:A1:00.0)'s PCIe link runs at x8 of its x16",
                                              True)]
    every = [dict(g, **{"pcie.link.width.current": "8"}) for g in rows]
    found, _note = gpu_health.problems("worker1", as_queried(every))
    assert len(found) == 8 and not any(r for _m, _f, r in found)
    assert found[0][0].endswith("x8 of its x16 (as every GPU of the node: the platform's wiring?)")


def test_a_recovery_action_the_driver_asks_for_refuses_the_node():
    row = dict(full_row("real-h100-590.48.01-idle"), gpu_recovery_action="GPU Reset")
    found, _note = gpu_health.problems("worker1", as_queried([row]))
    assert [(m, r) for m, _f, r in found] == [
        ("worker1 GPU 0 (00000000:00:09.0)'s driver asks for a recovery action: GPU Reset", True)]


def real_kernel_log():
    return (FIXTURES / "real-xid" / "kernel-log.txt").read_text().splitlines()


def test_real_kernel_log_lines_of_every_prefix_are_read():
    events = [(xid, pci) for _line, xid, pci in gpu_health.xid_events(real_kernel_log())]
    assert events == [
        (13, "0000:38:00"), (43, "0000:38:00"), (109, "0000:cb:00"), (31, "0000:af:00"), (94, "0000:00:08"),
        (48, "0000:19:00"), (63, "0000:19:00"), (64, "0000:07:00"), (45, "0000:dc:00"), (74, "0003:00:00"),
        (79, "0000:02:00"), (95, "0000:84:00"), (119, "0000:9b:00"), (119, "0001:6c:00"), (120, "0000:06:00"),
        (62, "0000:01:00"), (154, "0000:01:00"), (145, "0018:01:00"), (149, "0000:00:00"), (94, "0000:01:00"),
        # The driver's three-line "fallen off the bus" without an Xid, as 79, under the line that names the GPU.
        (79, "0000:b3:00.0")]


def test_real_xid_events_are_refused_named_or_left_to_the_application_as_nvidias_catalog_says():
    found, _note = gpu_health.problems("worker1", as_queried([full_row("real-h100-590.48.01-idle")]) | {
        "xid": real_kernel_log()})
    verdicts = [(m.split(" logged Xid ")[1].split(" ")[0], r) for m, _f, r in found]
    # 13, 31, 43 and 45 are the application's; a contained ECC error (94), a recorded row remap (63), a context
    # switch timeout (109) and a non-fatal NVLink error (145) are named; the rest refuse the node.
    assert verdicts == [("109", False), ("94", False), ("48", True), ("63", False), ("64", True), ("74", True),
                        ("79", True), ("95", True), ("119", True), ("119", True), ("120", True), ("62", True),
                        ("154", True), ("145", False), ("149", True), ("94", False), ("79", True)]
    assert found[-1][0].startswith("worker1's GPU at PCI:0000:b3:00.0 logged Xid 79 (the GPU fell off the bus): "
                                   "The NVIDIA GPU 0000:b3:00.0")
    # An Xid 154 whose action is back to None asks for nothing.
    cleared = "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)"
    assert gpu_health.problems("worker1", {"fields": ASKED, "query": "", "xid": [cleared]})[0][0][2] is False
