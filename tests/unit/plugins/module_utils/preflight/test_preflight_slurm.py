"""module_utils/preflight/slurm.py: sinfo read back, the partition and preflight verdicts."""
from pathlib import Path

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight import slurm

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures" / "slurm"


def test_an_idle_node_that_does_not_answer_fails():
    rows = slurm.parse_sinfo("worker1|gpu*|idle*|none\n")
    (v,) = slurm.partition_verdicts(rows, "gpu", ["worker1"], "coord")
    assert v["status"] == "fail" and v["detail"] == "worker1 is idle* in Slurm"


def test_sinfo_read_back():
    rows = slurm.parse_sinfo((FIXTURES / "sinfo-idle.txt").read_text())
    assert rows == [{"node": "worker1", "partition": "gpu", "default": True, "state": "idle", "raw_state": "idle",
                     "reason": ""},
                    {"node": "worker2", "partition": "gpu", "default": True, "state": "idle", "raw_state": "idle",
                     "reason": ""}]


def test_partition_verdicts_per_node_state():
    rows = slurm.parse_sinfo((FIXTURES / "sinfo-mixed.txt").read_text())
    got = dict((v["host"], v) for v in slurm.partition_verdicts(
        rows, "gpu", ["worker1", "worker2", "worker3", "worker4", "worker5", "worker6"], "coord"))
    assert got["worker1"]["status"] == "pass"
    assert got["worker2"]["status"] == "fail" and got["worker2"]["detail"] == \
        "worker2 is down* in Slurm (Not responding)"
    assert "scontrol update nodename=worker2 state=resume" in got["worker2"]["fix"]
    assert got["worker3"]["status"] == "fail" and "e2e-maintenance" in got["worker3"]["detail"]
    assert got["worker4"]["status"] == "warn" and "squeue -w worker4" in got["worker4"]["fix"]
    assert got["worker5"]["detail"] == "worker5 is not in partition gpu (it is in debug)"
    assert got["worker6"]["detail"].endswith("nor in any partition: slurm.conf does not define it")
    assert "-e exclude=worker6" in got["worker6"]["fix"]


def test_an_unknown_partition_lists_the_known_ones():
    rows = slurm.parse_sinfo((FIXTURES / "sinfo-mixed.txt").read_text())
    (v,) = slurm.partition_verdicts(rows, "a100", ["worker1"], "coord")
    assert v["status"] == "fail" and v["detail"] == "partition a100 does not exist (sinfo shows debug, gpu)"
    assert v["fix"] == "-e slurm_partition=<one of debug, gpu>"


def test_no_slurm_at_all():
    (v,) = slurm.partition_verdicts([], "gpu", ["worker1"], "coord")
    assert v["status"] == "fail" and "sinfo lists no nodes" in v["detail"]


def test_preflight_munge_and_versions():
    verdicts = slurm.preflight_verdicts(
        "coord",
        {"coord": {"rc": 0}, "worker1": {"rc": 0},
         "worker2": {"rc": 15, "stderr": "unmunge: Error: Invalid credential\n"},
         "worker3": {"rc": 15, "stderr": "unmunge: Error: Expired credential"},
         "worker4": {"rc": 1, "stderr": "unmunge: Error: Failed to access /run/munge/munge.socket.2: "
                                        "No such file or directory"}},
        {"coord": "slurm-wlm 22.05.8", "worker1": "slurm-wlm 22.05.8", "worker2": "slurm 23.02.1",
         "worker3": None})
    got = dict(((v["check"], v["host"]), v) for v in verdicts)
    assert got[("slurm munge", "worker1")]["status"] == "pass"
    assert got[("slurm munge", "worker2")]["detail"] == \
        "cannot decode coord's munge credential: unmunge: Error: Invalid credential"
    assert "copy coord's /etc/munge/munge.key to worker2" in got[("slurm munge", "worker2")]["fix"]
    assert "synchronize the clocks" in got[("slurm munge", "worker3")]["fix"]
    assert got[("slurm munge", "worker4")]["fix"] == "start munged on worker4 (service munge start)"
    assert got[("slurm version", "worker1")]["status"] == "pass"
    assert got[("slurm version", "worker2")]["detail"] == "runs Slurm 23.02.1 but coord runs 22.05.8"
    assert got[("slurm version", "worker3")]["status"] == "fail"
