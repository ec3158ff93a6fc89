"""A GPU node's health in preflight (issue 47, point 3): module_utils/preflight/gpu_health.py judges what
multinode_ds.health read of nvidia-smi and the kernel log.  health.csv in tests/fixtures/nvidia-smi/h100-8 is eight
idle, healthy H100s in the CSV that `nvidia-smi --query-gpu=<multinode_ds.health.GPU_FIELDS> --format=csv,noheader`
prints; h100-8-faults is the same node with one fault per GPU, and a kernel log with Xid events."""
from pathlib import Path

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight import gpu_health, health

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "nvidia-smi"
FIELDS = ["index", "pci.bus_id", "ecc.errors.uncorrected.volatile.total", "retired_pages.pending",
          "remapped_rows.pending", "remapped_rows.failure", "clocks_event_reasons.active", "pcie.link.gen.current",
          "pcie.link.gen.max", "pcie.link.width.current", "pcie.link.width.max"]
# What the node asks for; the 550.90.07 driver of h100-8 does not know the last (its unknown-fields).
ASKED = FIELDS + ["gpu_recovery_action"]
FIGURES = {"compute_gflops": 150.0, "memory_gbps": 40.0, "shared_write_mbps": 1200.0}


def readings(name, xid=None, **extra):
    gpu = {"fields": FIELDS, "query": (FIXTURES / name / "health.csv").read_text()}
    if xid is not None:
        gpu["xid"] = xid
    gpu.update(extra)
    return gpu


def fault_xids():
    return [ln for ln in (FIXTURES / "h100-8-faults" / "dmesg.txt").read_text().splitlines() if "NVRM: Xid" in ln]


def test_the_fields_are_the_ones_the_node_asks_for():
    from multinode_ds import health as node_health  # pylint: disable=import-outside-toplevel

    asked = [f[0] if isinstance(f, tuple) else f for f in node_health.GPU_FIELDS]
    assert asked == ASKED
    assert (FIXTURES / "h100-8" / "unknown-fields").read_text().split() == ASKED[len(FIELDS):]
    assert gpu_health.THROTTLE_FIELDS == node_health.GPU_FIELDS[6]


def test_healthy_idle_gpus_pass_and_an_idle_link_speed_is_not_judged():
    found, note = gpu_health.problems("worker1", readings("h100-8", xid=[]))
    assert found == [] and note == "8 GPU(s) healthy"
    verdicts = health.health_verdicts({"worker1": dict(FIGURES, gpu=readings("h100-8", xid=[]))})
    assert verdicts[0]["status"] == "pass"
    assert verdicts[0]["detail"] == "150 GFLOP/s, 40 GB/s, 1200 MB/s, 8 GPU(s) healthy"


def test_each_gpu_fault_is_named_with_the_gpu_and_refused_or_warned_as_it_deserves():
    found, _note = gpu_health.problems("worker2", readings("h100-8-faults", xid=[]))
    by_gpu = dict((msg.split(" (", maxsplit=1)[0], (msg, refuses)) for msg, _fix, refuses in found)
    assert "worker2 GPU 0" not in by_gpu and "worker2 GPU 1" not in by_gpu  # idle; SW power cap is not a fault
    assert by_gpu["worker2 GPU 2"] == (
        "worker2 GPU 2 (00000000:3A:00.0) has 2 uncorrected ECC error(s) since the driver loaded", True)
    assert by_gpu["worker2 GPU 3"] == ("worker2 GPU 3 (00000000:5D:00.0) has a row remap waiting for a GPU reset",
                                       True)
    assert by_gpu["worker2 GPU 4"] == ("worker2 GPU 4 (00000000:9A:00.0) failed to remap a row of its memory", True)
    assert by_gpu["worker2 GPU 5"] == ("worker2 GPU 5 (00000000:AB:00.0)'s PCIe link runs at x8 of its x16", True)
    assert by_gpu["worker2 GPU 6"] == (
        "worker2 GPU 6 (00000000:BA:00.0) is held back by a hardware slowdown (HW Slowdown: overheating or the power "
        "supply) and a hardware thermal slowdown (HW Thermal Slowdown) (clock event reasons 0x48)", True)
    assert len(found) == 6
    # Busy (no idle reason) at gen 3 of gen 5: named, not refused.
    assert by_gpu["worker2 GPU 7"] == (
        "worker2 GPU 7 (00000000:DB:00.0)'s PCIe link runs at gen 3 of its gen 5 while busy", False)
    fixes = dict((m.split(" (", maxsplit=1)[0], f) for m, f, _r in found)
    assert fixes["worker2 GPU 2"].startswith("drain it and reset the GPU (nvidia-smi -r -i 2) or reboot the node")
    assert fixes["worker2 GPU 5"].startswith("reseat the GPU or its riser")


def test_the_node_is_refused_with_every_fault_and_the_first_refusing_fix_or_only_warned():
    figures = {"worker1": dict(FIGURES, gpu=readings("h100-8", xid=[])),
               "worker2": dict(FIGURES, gpu=readings("h100-8-faults", xid=[]))}
    verdicts = health.health_verdicts(figures)
    assert [(v["host"], v["status"]) for v in verdicts] == [("worker1", "pass"), ("worker2", "fail")]
    assert verdicts[1]["detail"].startswith("worker2 GPU 2 (00000000:3A:00.0) has 2 uncorrected ECC error(s)")
    assert verdicts[1]["fix"].startswith("drain it and reset the GPU (nvidia-smi -r -i 2)")
    assert verdicts[1]["fix"].endswith("or run without it (-e exclude=worker2), or -e preflight_health_action=warn")
    assert health.health_verdicts(figures, action="warn")[1]["status"] == "warn"


def test_xid_events_refuse_once_and_a_passing_preflight_records_them_as_seen():
    lines = fault_xids()
    assert [(x, pci) for _l, x, pci in gpu_health.xid_events(lines)] == [
        (13, "0000:18:00"), (63, "0000:5d:00"), (79, "0000:ba:00")]
    found, _note = gpu_health.problems("worker1", readings("h100-8", xid=lines))
    # 13 is the application's fault; 63 is named; 79 refuses.
    assert [(m.split(": Xid (", maxsplit=1)[0], r) for m, _f, r in found] == [
        ("worker1's GPU at PCI:0000:5d:00 logged Xid 63 (a page retirement or row remap was recorded)", False),
        ("worker1's GPU at PCI:0000:ba:00 logged Xid 79 (the GPU fell off the bus)", True)]
    assert "GPU has fallen off the bus" in found[1][0]
    figures = {"worker1": dict(FIGURES, gpu=readings("h100-8", xid=lines))}
    assert health.health_verdicts(figures)[0]["status"] == "fail"
    # With -e preflight_health_action=warn the preflight passes; its history then holds the lines, and the next
    # preflight does not judge them again.
    assert health.health_verdicts(figures, action="warn")[0]["status"] == "warn"
    history = health.updated_history({}, figures)
    assert history["worker1"] == [dict(FIGURES, xid=lines, gpus=8)]
    assert health.health_verdicts(figures, history)[0]["status"] == "pass"
    newer = lines + ["[20000.1] NVRM: Xid (PCI:0000:2a:00): 95, pid=1, name=python, Uncontained: FBHUB. RST: Yes"]
    again = health.health_verdicts({"worker1": dict(FIGURES, gpu=readings("h100-8", xid=newer))}, history)[0]
    assert again["status"] == "fail" and again["detail"].startswith(
        "worker1's GPU at PCI:0000:2a:00 logged Xid 95 (an uncontained ECC error)")


def test_nvidia_smi_failing_or_hanging_and_an_unreadable_kernel_log():
    failed = {"error": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "rc": 9}
    found, note = gpu_health.problems("worker1", failed)
    assert found == [("nvidia-smi on worker1: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                      "driver.", "check the driver (nvidia-smi; dmesg | grep NVRM) or reboot the node", False)]
    hung = {"error": "nvidia-smi did not answer within 30 s (TimeoutExpired: ...)"}
    assert gpu_health.problems("worker1", hung)[0][0][2] is True
    restricted = "dmesg: read kernel buffer failed: Operation not permitted"
    found, note = gpu_health.problems("worker1", readings("h100-8", xid_error=restricted))
    assert found == [] and note.startswith("8 GPU(s) healthy; Xid events not read (dmesg: read kernel buffer failed")
    # A table that is not the query's (another query's CSV) is named, never read column by column.
    other = {"fields": FIELDS, "query": (FIXTURES / "h100-8" / "query.csv").read_text()}
    found, _note = gpu_health.problems("worker1", other)
    assert len(found) == 1 and found[0][0].startswith("nvidia-smi printed '0, GPU-") and found[0][2] is False
    assert gpu_health.problems("worker1", None) == ([], "")


def test_an_older_drivers_throttle_field_is_read_too():
    fields = [("clocks_throttle_reasons.active" if f == "clocks_event_reasons.active" else f) for f in FIELDS]
    gpu = {"fields": fields, "query": (FIXTURES / "h100-8-faults" / "health.csv").read_text()}
    found, _note = gpu_health.problems("worker2", gpu)
    assert any("hardware thermal slowdown" in m for m, _f, _r in found)


def test_a_software_thermal_slowdown_alone_is_named_not_refused():
    gpu = {"fields": FIELDS, "query": "0, 00000000:18:00.0, 0, [N/A], No, No, 0x0000000000000020, 5, 5, 16, 16\n"}
    found, _note = gpu_health.problems("worker1", gpu)
    assert [(m, r) for m, _f, r in found] == [
        ("worker1 GPU 0 (00000000:18:00.0) is held back by a software thermal slowdown (SW Thermal Slowdown) "
         "(clock event reasons 0x20)", False)]
    assert health.health_verdicts({"worker1": dict(FIGURES, gpu=gpu)})[0]["status"] == "warn"


def test_a_node_listing_fewer_gpus_than_at_its_last_passing_preflights_is_refused():
    history = health.updated_history({}, {"worker1": dict(FIGURES, gpu=readings("h100-8", xid=[]))})
    assert history["worker1"][0]["gpus"] == 8
    seven = "".join((FIXTURES / "h100-8" / "health.csv").read_text().splitlines(True)[:7])
    now = {"worker1": dict(FIGURES, gpu={"fields": FIELDS, "query": seven, "xid": []})}
    verdict = health.health_verdicts(now, history)[0]
    assert verdict["status"] == "fail"
    assert verdict["detail"] == "nvidia-smi on worker1 lists 7 GPU(s), 8 at its last passing preflights"
    assert verdict["fix"].startswith("a GPU fell off the bus or did not initialize")
    # Without a past, seven GPUs are what the node has.
    assert health.health_verdicts(now)[0]["status"] == "pass"


def test_a_gpu_slower_than_the_nodes_fastest_and_a_node_whose_slowest_gpu_trails_its_peers():
    # The figures as multinode_ds.health writes them: each GPU's float16 matmul GFLOP/s, the slowest as gpu_gflops.
    even = [612000.0, 598000.0, 605000.0, 611000.0, 603000.0, 600000.0, 608000.0, 609000.0]
    slow = even[:3] + [201000.0] + even[4:]
    found, _note = gpu_health.problems("worker2", readings("h100-8", xid=[], gflops=slow))
    assert [(m, r) for m, _f, r in found] == [
        ("worker2 GPU 3 computes at 201000 GFLOP/s, 33% of the node's fastest GPU (612000 GFLOP/s)", True)]
    assert gpu_health.problems("worker2", readings("h100-8", xid=[], gflops=even))[0] == []
    figures = {"worker1": dict(FIGURES, gpu_gflops=min(even), gpu=readings("h100-8", xid=[], gflops=even)),
               "worker2": dict(FIGURES, gpu_gflops=min(slow), gpu=readings("h100-8", xid=[], gflops=slow))}
    verdicts = health.health_verdicts(figures)
    assert verdicts[0]["detail"] == "150 GFLOP/s, 40 GB/s, 1200 MB/s, slowest GPU 598000 GFLOP/s, 8 GPU(s) healthy"
    assert verdicts[1]["status"] == "fail"
    assert verdicts[1]["detail"] == (
        "worker2 computes on its slowest GPU at 201000 GFLOP/s, 34% of the other nodes' median 598000 GFLOP/s; "
        "worker2 GPU 3 computes at 201000 GFLOP/s, 33% of the node's fastest GPU (612000 GFLOP/s)")
    unmeasured = readings("h100-8", xid=[], gflops=None, gflops_error="RuntimeError: CUDA driver initialization failed")
    found, _note = gpu_health.problems("worker1", unmeasured)
    assert found[0][0].startswith("worker1's GPUs' matmul pace not measured: RuntimeError") and found[0][2] is False


def test_readings_that_are_not_what_the_node_side_writes_are_named_never_a_crash():
    # What comes back from a rank node is as untrusted as a -e value: its Python is the user's stack.
    for junk in ({"fields": 5, "query": 7, "xid": 3, "gflops": 9, "xid_error": 4},
                 {"fields": FIELDS, "query": (FIXTURES / "h100-8" / "health.csv").read_text(), "xid": "NVRM: Xid",
                  "gflops": "fast", "gflops_error": 12},
                 {"error": ["x"] * 1000}):
        found, note = gpu_health.problems("worker1", junk)
        assert isinstance(found, list) and isinstance(note, str)
        assert all(len(m) < 1000 for m, _f, _r in found)
        health.health_verdicts({"worker1": dict(FIGURES, gpu=junk)})
        health.updated_history({}, {"worker1": dict(FIGURES, gpu=junk)})
