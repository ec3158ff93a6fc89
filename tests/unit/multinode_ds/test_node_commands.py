"""The small commands the roles run on the nodes instead of inline Python: ``multinode_ds.versions`` (role stack's
version table) and ``multinode_ds.bench_worker.check`` (role benchmark's check of the model and prompts file)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import deepspeed
import torch
import transformers

import multinode_ds
from multinode_ds import versions
from multinode_ds.bench_worker import check

ROOT = Path(__file__).resolve().parents[3]


def run(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", *args], env=env, capture_output=True, text=True, timeout=120,
                          check=False)


def test_versions_are_the_venvs_own():
    found = versions.versions()
    assert found["torch"] == torch.__version__ and found["deepspeed"] == deepspeed.__version__
    assert found["transformers"] == transformers.__version__ and found["trainer"] == multinode_ds.__version__
    assert found["cuda"] == (torch.version.cuda or "none")
    assert found["nccl"] == "none" if not torch.version.cuda else found["nccl"].count(".") == 2
    assert found["python"] == "%d.%d.%d" % sys.version_info[:3]


def test_versions_prints_one_json_line(capsys):
    assert versions.main() == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and json.loads(lines[0]) == versions.versions()


def test_bench_check_passes_a_registry_model_and_a_readable_prompts_file(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    assert check.main(["llama-tiny", "", str(prompts)]) == 0
    assert check.main(["anything", "/models/mine", ""]) == 0  # a model_path is checked where it loads


def test_bench_check_names_the_setting_and_the_fix(tmp_path, capsys):
    assert check.main(["no-such-model", "", ""]) == 1
    err = capsys.readouterr().err
    assert "no-such-model" in err and "model_path" in err
    assert check.main(["llama-tiny", "", str(tmp_path / "missing.txt")]) == 1
    assert "prompts_file=%s is not a readable file on this coordinator" % (tmp_path / "missing.txt") in \
        capsys.readouterr().err
    assert check.main(["llama-tiny", ""]) == 2


def test_bench_check_runs_as_the_role_runs_it():
    res = run("multinode_ds.bench_worker.check", "no-such-model", "", "")
    assert res.returncode == 1 and "no-such-model" in res.stderr and not res.stdout
    assert run("multinode_ds.bench_worker.check", "llama-tiny", "", "").returncode == 0


def test_health_measures_compute_memory_and_the_shared_write_and_leaves_nothing(tmp_path, capsys):
    from multinode_ds import health

    assert health.main(["--shared", str(tmp_path), "--seconds", "0.2"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert set(figures) - {"gpu"} == {"host", "compute_gflops", "memory_gbps", "shared_write_mbps"}
    assert all(figures[k] > 0 for k in ("compute_gflops", "memory_gbps", "shared_write_mbps"))
    assert list(tmp_path.iterdir()) == []


def test_health_names_what_it_could_not_measure(tmp_path):
    from multinode_ds import health

    figures = health.measure(str(tmp_path / "missing"), 0.1)
    assert figures["shared_write_mbps"] is None and figures["compute_gflops"] > 0
    assert figures["errors"]["shared_write_mbps"].startswith("FileNotFoundError")


def test_the_compute_figure_is_the_best_window_so_a_moment_of_load_does_not_count():
    from multinode_ds import health
    import time as clock

    # One window of four stalls (a neighbour's moment of load): the figure is the others' pace.
    calls = iter([0.06, 0.01, 0.01, 0.01])
    assert 0.01 <= health.best_window(lambda: clock.sleep(next(calls)), 0.0, windows=4) < 0.03
    # A quota slows every window: the figure is slow.
    calls = iter([0.04, 0.05, 0.04, 0.045])
    assert health.best_window(lambda: clock.sleep(next(calls)), 0.0, windows=4) >= 0.04


def test_sustained_is_the_mean_time_of_the_repetitions_stalls_included():
    from multinode_ds import health

    calls = iter([0.05, 0.01, 0.03])
    import time as clock
    assert 0.03 <= health.sustained(lambda: clock.sleep(next(calls)), 0.0) < 0.045


def _tools(tmp_path, monkeypatch, fixture, dmesg=None):
    """A PATH of only the fake nvidia-smi (replaying ``fixture``) and, where given, a dmesg printing ``dmesg``."""
    fixtures = Path(__file__).resolve().parents[2] / "fixtures"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").symlink_to(fixtures / "bin" / "nvidia-smi")
    if dmesg is not None:
        (bin_dir / "dmesg").write_text("#!/bin/sh\n" + dmesg)
        (bin_dir / "dmesg").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % bin_dir if dmesg is None else str(bin_dir) + ":/bin")
    monkeypatch.setenv("NVIDIA_SMI_FIXTURE", str(fixture))
    return fixtures


def test_health_reads_the_gpus_and_the_kernel_logs_xid_lines_where_nvidia_smi_is(tmp_path, monkeypatch):
    from multinode_ds import health

    fixtures = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi"
    _tools(tmp_path, monkeypatch, fixtures / "h100-8-faults",
           dmesg="cat %s\n" % (fixtures / "h100-8-faults" / "dmesg.txt"))
    gpu = health.gpu_readings()
    # Its 550.90.07 driver does not know gpu_recovery_action (the fixture's unknown-fields): asked without it.
    assert gpu["fields"][6] == "clocks_event_reasons.active" and gpu["fields"] == [
        f[0] if isinstance(f, tuple) else f for f in health.GPU_FIELDS if f != "gpu_recovery_action"]
    assert gpu["query"] == (fixtures / "h100-8-faults" / "health.csv").read_text()
    assert [ln.split("]")[0] for ln in gpu["xid"]] == ["[ 8812.334015", "[ 9120.778410", "[10451.002981",
                                                       "[10451.003112"]


def test_health_reads_a_real_nodes_nvidia_smi_and_kernel_log(tmp_path, monkeypatch):
    # The fake nvidia-smi answers from a real H100's capture as that node's nvidia-smi did (590.48.01 knows every
    # field); the kernel log is real lines of many nodes, with the driver's three-line "fallen off the bus".
    from multinode_ds import health

    fixtures = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi"
    log = fixtures / "real-xid" / "kernel-log.txt"
    _tools(tmp_path, monkeypatch, fixtures / "real-h100-590.48.01-load", dmesg="cat %s\n" % log)
    gpu = health.gpu_readings()
    assert len(gpu["fields"]) == len(health.GPU_FIELDS) and gpu["fields"][-1] == "gpu_recovery_action"
    assert gpu["query"] == "0, 00000000:00:09.0, 0, [N/A], No, No, 0x0000000000000000, 5, 5, 16, 16, None\n"
    # Every line but the middle one of the three (which says neither Xid, nor the GPU, nor "fallen off the bus").
    assert gpu["xid"] == [ln.strip() for ln in log.read_text().splitlines() if "(PCI ID: " not in ln]


def test_health_asks_an_older_driver_for_the_fields_it_knows(tmp_path, monkeypatch):
    import shutil as sh

    from multinode_ds import health

    fixture = tmp_path / "old-driver"
    sh.copytree(Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi" / "h100-8", fixture)
    (fixture / "unknown-fields").write_text("gpu_recovery_action\nclocks_event_reasons.active\nremapped_rows.failure\n")
    _tools(tmp_path, monkeypatch, fixture, dmesg="echo 'dmesg: read kernel buffer failed: Operation not "
                                                 "permitted' >&2; exit 1\n")
    gpu = health.gpu_readings()
    assert "clocks_throttle_reasons.active" in gpu["fields"] and "remapped_rows.failure" not in gpu["fields"]
    assert "clocks_event_reasons.active" not in gpu["fields"]
    # (then journalctl, where this machine has it)
    assert gpu["xid_error"].startswith("dmesg: dmesg: read kernel buffer failed: Operation not permitted")


def test_health_names_an_nvidia_smi_that_fails_or_hangs(tmp_path, monkeypatch):
    from multinode_ds import health

    fixtures = Path(__file__).resolve().parents[2] / "fixtures" / "nvidia-smi"
    _tools(tmp_path, monkeypatch, fixtures / "driver-failed")
    failed = health.gpu_query("nvidia-smi")
    assert failed["rc"] == 9 and failed["error"].startswith("NVIDIA-SMI has failed because it couldn't communicate")
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nexec sleep 30\n")
    hang.chmod(0o755)
    monkeypatch.setattr(health, "GPU_SECONDS", 0.5)
    assert health.gpu_query(str(hang))["error"].startswith("nvidia-smi did not answer within 0 s")


class _FakeCuda:
    """torch.cuda of a node with GPUs whose matmuls take ``seconds[i]`` each (a stand-in: CI has no GPU)."""

    def __init__(self, seconds):
        self.seconds, self.current, self.synced = seconds, None, 0

    def is_available(self):
        return bool(self.seconds)

    def device_count(self):
        return len(self.seconds)

    def device(self, index):
        import contextlib

        cuda = self

        @contextlib.contextmanager
        def on():
            cuda.current = index
            yield
            cuda.current = None
        return on()

    def synchronize(self):
        import time as clock

        self.synced += 1
        clock.sleep(self.seconds[self.current])


class _FakeTorch:
    float16 = "float16"

    def __init__(self, seconds):
        self.cuda = _FakeCuda(seconds)
        self.made = []

    def randn(self, shape, device, dtype):
        assert device == "cuda" and dtype == "float16" and self.cuda.current is not None
        self.made.append((shape, self.cuda.current))
        return object()

    def matmul(self, a, b):
        return a


def test_health_times_a_matmul_on_each_gpu_and_none_without_cuda(monkeypatch):
    from multinode_ds import health

    monkeypatch.setattr(health, "GPU_MATMUL", 1000)
    fake = _FakeTorch([0.002, 0.002, 0.008])
    gflops = health.gpu_gflops(0.06, torch=fake)
    assert len(gflops) == 3 and [d for _s, d in fake.made] == [0, 0, 1, 1, 2, 2]
    # 2 x 1000^3 flops in about 2 ms: about 1000 GFLOP/s; the GPU four times slower shows it.
    assert 100 < gflops[0] <= 1000 and gflops[2] < 0.5 * min(gflops[:2])
    assert health.gpu_gflops(0.06, torch=_FakeTorch([])) is None
