from pathlib import Path

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision.accelerator import (
    QUERY_ARGS, accelerator_facts, cuda_tuple, driver_tuple, parse_banner, parse_query_csv)

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "nvidia-smi"
KEYS = {"status", "message", "count", "driver_version", "cuda_driver_version", "gpus", "names",
        "memory_mib_min", "compute_capability_min"}


def _text(directory, name):
    path = directory / name
    return path.read_text() if path.exists() else ""


def facts_of(name):
    """What the module computes on a node whose nvidia-smi prints the fixture ``name``."""
    d = FIXTURES / name
    if (d / "absent").exists():
        return accelerator_facts(False)
    rc = int(_text(d, "rc").strip() or 0)
    err = _text(d, "stderr")
    return accelerator_facts(True, rc, _text(d, "query.csv"), err, rc, _text(d, "nvidia-smi.txt"), err)


def test_query_args_match_the_captured_query():
    assert QUERY_ARGS == ["--query-gpu=index,uuid,name,memory.total,compute_cap,driver_version,pci.bus_id",
                          "--format=csv,noheader,nounits"]


def test_h100_1_real_capture():
    f = facts_of("h100-1")
    assert set(f) == KEYS
    assert f["status"] == "ok" and f["count"] == 1
    assert f["names"] == ["NVIDIA H100 80GB HBM3"]
    assert f["driver_version"] == "580.159.04" and f["cuda_driver_version"] == "13.0"
    assert f["memory_mib_min"] == 81559 and f["compute_capability_min"] == "9.0"
    assert f["gpus"] == [{"index": 0, "uuid": "GPU-aeca4581-8a51-b29d-f1ec-2aeddba7362b",
                          "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "compute_capability": "9.0",
                          "driver_version": "580.159.04", "pci_bus_id": "00000000:00:06.0"}]
    assert "1 GPU(s)" in f["message"] and "CUDA 13.0" in f["message"]


def test_h100_8():
    f = facts_of("h100-8")
    assert f["status"] == "ok" and f["count"] == 8
    assert [g["index"] for g in f["gpus"]] == list(range(8))
    assert f["names"] == ["NVIDIA H100 80GB HBM3"]
    assert f["driver_version"] == "550.90.07" and f["cuda_driver_version"] == "12.4"
    assert f["memory_mib_min"] == 81559 and f["compute_capability_min"] == "9.0"
    assert [g["pci_bus_id"] for g in f["gpus"]] == ["00000000:%s:00.0" % b for b in
                                                    ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]]
    assert len({g["uuid"] for g in f["gpus"]}) == 8


def test_a30_2_old_banner_layout():
    f = facts_of("a30-2")
    assert f["status"] == "ok" and f["count"] == 2
    assert f["names"] == ["NVIDIA A30"]
    assert f["memory_mib_min"] == 24576 and f["compute_capability_min"] == "8.0"
    assert f["driver_version"] == "535.183.01" and f["cuda_driver_version"] == "12.2"


def test_no_gpu_is_absent_not_an_error():
    f = facts_of("no-gpu")
    assert set(f) == KEYS
    assert f["status"] == "absent" and f["count"] == 0 and f["gpus"] == [] and f["names"] == []
    assert f["driver_version"] is None and f["cuda_driver_version"] is None
    assert f["memory_mib_min"] is None and f["compute_capability_min"] is None
    assert "CPU node" in f["message"]


def test_no_devices():
    f = facts_of("no-devices")
    assert f["status"] == "no_devices" and f["count"] == 0
    assert "No devices were found" in f["message"]


def test_driver_failed_carries_tool_line_and_fix():
    f = facts_of("driver-failed")
    assert f["status"] == "driver_error" and f["count"] == 0 and f["driver_version"] is None
    assert "rc 9" in f["message"]
    assert "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." in f["message"]
    assert "Fix:" in f["message"] and "lsmod" in f["message"]


def test_driver_library_mismatch_hint():
    out = "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 550.90\n"
    f = accelerator_facts(True, 18, out, "", 18, out, "")
    assert f["status"] == "driver_error"
    assert "Failed to initialize NVML: Driver/library version mismatch" in f["message"]
    assert "reboot" in f["message"]


def test_old_driver_without_compute_cap_field():
    out = 'Field "compute_cap" is not a valid field to query.\n'
    f = accelerator_facts(True, 2, out, "", 0, "", "")
    assert f["status"] == "driver_error" and "510" in f["message"]


def test_error_on_stderr_only_and_silent_failure():
    f = accelerator_facts(True, 255, "", "Unable to determine the device handle\n", 255, "", "")
    assert "Unable to determine the device handle" in f["message"]
    f = accelerator_facts(True, 4, "", "", 4, "", "")
    assert f["status"] == "driver_error" and "rc 4" in f["message"]


def test_banner_failure_keeps_gpus():
    query = (FIXTURES / "h100-8" / "query.csv").read_text()
    f = accelerator_facts(True, 0, query, "", 1, "", "oops")
    assert f["status"] == "ok" and f["count"] == 8
    assert f["driver_version"] == "550.90.07" and f["cuda_driver_version"] is None


def test_parse_query_csv_na_fields_and_blank_lines():
    text = ("\n0, GPU-x, NVIDIA A100-SXM4-40GB, [N/A], [N/A], 535.183.01, 00000000:07:00.0\n\n"
            "1, GPU-y, Tesla T4, 15360, 7.5, [Not Supported], 00000000:3B:00.0\n")
    gpus = parse_query_csv(text)
    assert gpus[0]["memory_mib"] is None and gpus[0]["compute_capability"] is None
    assert gpus[1]["driver_version"] is None and gpus[1]["memory_mib"] == 15360
    f = accelerator_facts(True, 0, text, "", 0, "", "")
    assert f["memory_mib_min"] == 15360 and f["compute_capability_min"] == "7.5"
    assert f["names"] == ["NVIDIA A100-SXM4-40GB", "Tesla T4"]


def test_compute_capability_min_is_numeric_not_lexical():
    text = "0, a, X, 1, 10.0, 1, b\n1, c, Y, 2, 9.0, 1, d\n"
    assert accelerator_facts(True, 0, text, "", 0, "", "")["compute_capability_min"] == "9.0"


@pytest.mark.parametrize("name, expected", [
    ("h100-1", ("580.159.04", "13.0")),
    ("h100-8", ("550.90.07", "12.4")),
    ("a30-2", ("535.183.01", "12.2")),
    ("driver-failed", (None, None)),
])
def test_parse_banner(name, expected):
    assert parse_banner((FIXTURES / name / "nvidia-smi.txt").read_text()) == expected


def test_version_tuples():
    assert cuda_tuple("12.4") == (12, 4)
    assert cuda_tuple("13") == (13, 0)
    assert cuda_tuple("12.4.1") == (12, 4)
    assert cuda_tuple(None) is None and cuda_tuple("N/A") is None
    assert driver_tuple("550.90.07") == (550, 90, 7)
    assert driver_tuple("535.183.01") > driver_tuple("535.54.03")
    assert driver_tuple(None) is None
