"""slurm_facts: Slurm's commands (fakes printing real output) read back and judged."""
import os
from pathlib import Path

from ansible_collections.multinode.deepspeed.plugins.modules import slurm_facts

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "slurm"


def fake_slurm(tmp_path, monkeypatch, sinfo_rows):
    """sinfo and scontrol on PATH: sinfo --version, sinfo -N (the rows' file), scontrol ping."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sinfo").write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo "slurm-wlm 22.05.8"; exit 0; fi\n'
                                  'cat %s\n' % sinfo_rows)
    (bindir / "scontrol").write_text("#!/bin/sh\necho 'Slurmctld(primary) at coord is UP'\n")
    for name in ("sinfo", "scontrol"):
        (bindir / name).chmod(0o755)
    monkeypatch.setenv("PATH", "%s%s%s" % (bindir, os.pathsep, os.environ.get("PATH", "")))


def test_idle_partition_passes(tmp_path, monkeypatch, run_module):
    fake_slurm(tmp_path, monkeypatch, FIXTURES / "sinfo-idle.txt")
    res = run_module(slurm_facts, {"partition": "gpu", "nodes": ["worker1", "worker2"], "fail": True})
    assert not res.get("failed") and res["changed"] is False
    assert res["version"] == "22.05.8" and res["controller"] == "Slurmctld(primary) at coord is UP"
    assert [v["status"] for v in res["verdicts"]] == ["pass", "pass"] and res["message"] == ""


def test_a_down_node_fails_naming_it_and_the_fix(tmp_path, monkeypatch, run_module):
    fake_slurm(tmp_path, monkeypatch, FIXTURES / "sinfo-mixed.txt")
    res = run_module(slurm_facts, {"partition": "gpu", "nodes": ["worker1", "worker2"], "fail": True})
    assert res["failed"]
    assert res["msg"].startswith("Slurm is not ready (partition gpu): worker2: worker2 is down* in Slurm "
                                 "(Not responding). Fix: look at slurmd on worker2")


def test_without_sinfo_it_says_what_to_install(tmp_path, monkeypatch, run_module):
    monkeypatch.setenv("PATH", str(tmp_path))
    res = run_module(slurm_facts, {"partition": "gpu"})
    assert res["failed"] and "install slurm-client" in res["msg"]
