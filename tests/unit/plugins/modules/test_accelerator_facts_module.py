import os
from pathlib import Path

import pytest

from ansible_collections.multinode.deepspeed.plugins.modules import accelerator_facts

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
FAKE = str(FIXTURES / "bin" / "nvidia-smi")


def use_fixture(monkeypatch, name):
    monkeypatch.setenv("NVIDIA_SMI_FIXTURE", str(FIXTURES / "nvidia-smi" / name))


def test_h100_8_through_fake_binary(monkeypatch, run_module):
    use_fixture(monkeypatch, "h100-8")
    res = run_module(accelerator_facts, {"nvidia_smi": FAKE})
    assert res["changed"] is False and not res.get("failed")
    f = res["ansible_facts"]["multinode_accelerators"]
    assert f["status"] == "ok" and f["count"] == 8
    assert f["names"] == ["NVIDIA H100 80GB HBM3"]
    assert f["driver_version"] == "550.90.07" and f["cuda_driver_version"] == "12.4"
    assert f["memory_mib_min"] == 81559 and f["compute_capability_min"] == "9.0"
    assert f["gpus"][7]["pci_bus_id"] == "00000000:DB:00.0"


def test_check_mode_gathers_the_same(monkeypatch, run_module):
    use_fixture(monkeypatch, "a30-2")
    res = run_module(accelerator_facts, {"nvidia_smi": FAKE, "_ansible_check_mode": True})
    f = res["ansible_facts"]["multinode_accelerators"]
    assert res["changed"] is False and f["count"] == 2 and f["cuda_driver_version"] == "12.2"


def test_driver_failed_does_not_fail(monkeypatch, run_module):
    use_fixture(monkeypatch, "driver-failed")
    res = run_module(accelerator_facts, {"nvidia_smi": FAKE})
    assert not res.get("failed") and res["changed"] is False
    f = res["ansible_facts"]["multinode_accelerators"]
    assert f["status"] == "driver_error" and f["count"] == 0
    assert "couldn't communicate with the NVIDIA driver" in f["message"] and "Fix:" in f["message"]


def test_no_devices_does_not_fail(monkeypatch, run_module):
    use_fixture(monkeypatch, "no-devices")
    res = run_module(accelerator_facts, {"nvidia_smi": FAKE})
    assert not res.get("failed")
    assert res["ansible_facts"]["multinode_accelerators"]["status"] == "no_devices"


@pytest.mark.parametrize("binary", ["nvidia-smi-not-installed-here", "/nonexistent/bin/nvidia-smi"])
def test_missing_binary_is_absent(run_module, binary):
    res = run_module(accelerator_facts, {"nvidia_smi": binary})
    assert not res.get("failed") and res["changed"] is False
    f = res["ansible_facts"]["multinode_accelerators"]
    assert f["status"] == "absent" and f["count"] == 0 and f["gpus"] == []


def test_binary_found_in_path(monkeypatch, run_module):
    use_fixture(monkeypatch, "h100-1")
    monkeypatch.setenv("PATH", str(FIXTURES / "bin") + ":" + os.environ.get("PATH", ""))
    res = run_module(accelerator_facts, {})
    f = res["ansible_facts"]["multinode_accelerators"]
    assert f["status"] == "ok" and f["driver_version"] == "580.159.04" and f["cuda_driver_version"] == "13.0"
