"""Preflight's checks of what each node has for the ranks (module_utils/preflight/resources.py): free disk,
the memlock limit the ranks get, and the GPUs the hostfile promises."""
import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.resources import accelerator_verdicts, disk_verdicts, memlock_verdicts, rank_memlock
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.verdicts import FAIL

from tests.unit.plugins.module_utils.preflight.preflight_data import GIB, by_host, launch_of


PATHS = {"shared": "/srv/multinode-deepspeed", "local": "/opt/multinode-deepspeed"}


MINIMUMS = {"shared": 5.0, "local": 5.0}


def test_disk_verdicts():
    probes = {"w1": {"disk": {PATHS["shared"]: {"free_bytes": 10 * GIB, "total_bytes": 100 * GIB},
                              PATHS["local"]: {"free_bytes": 1 * GIB, "total_bytes": 100 * GIB}}},
              "w2": {"disk": {PATHS["shared"]: {"error": "/srv/multinode-deepspeed: No such file or directory"},
                              PATHS["local"]: {"free_bytes": 5 * GIB}}}}
    res = disk_verdicts(probes, PATHS, MINIMUMS)
    got = [(v["host"], v["detail"].split()[0], v["status"]) for v in res]
    assert got == [("w1", "local", "fail"), ("w1", "shared", "pass"), ("w2", "local", "pass"),
                   ("w2", "shared", "fail")]
    assert res[0]["detail"] == "local /opt/multinode-deepspeed: 1.0 GiB free, needs 5 GiB"
    assert "preflight_min_free_gib_local" in res[0]["fix"]
    assert res[1]["detail"] == "shared /srv/multinode-deepspeed: 10.0 GiB free"
    assert "No such file" in res[3]["detail"] and "create /srv/multinode-deepspeed on w2" in res[3]["fix"]


def test_disk_path_missing_from_the_probe_counts_as_no_space():
    res = disk_verdicts({"w1": {}}, {"local": "/opt"}, {"local": 1})
    assert res[0]["status"] == "fail" and "0.0 GiB free" in res[0]["detail"]
    assert disk_verdicts({"w1": {}}, {"local": "/opt"}, {})[0]["status"] == "pass"


def test_memlock_tcp_is_skipped():
    res = memlock_verdicts({"w1": 8192, "w2": -1}, "tcp")
    assert [v["status"] for v in res] == ["skip", "skip"]
    assert res[0]["detail"] == "8192 KiB (the tcp profile pins no memory)"


@pytest.mark.parametrize("profile", ["ib", "roce"])
def test_memlock_rdma_needs_unlimited(profile):
    res = by_host(memlock_verdicts({"w1": 8192, "w2": -1, "w3": "-1"}, profile))
    assert res["w1"]["status"] == "fail"
    assert res["w1"]["detail"] == "8192 KiB, the %s profile needs unlimited" % profile
    assert "site.yml" in res["w1"]["fix"] and "on w1" in res["w1"]["fix"]
    assert res["w2"]["status"] == "pass" and res["w2"]["detail"] == "unlimited"
    assert res["w3"]["status"] == "pass"


def test_memlock_minimum_setting():
    res = by_host(memlock_verdicts({"w1": 65536, "w2": 65535}, "ib", minimum_kib=65536))
    assert res["w1"]["status"] == "pass" and res["w2"]["status"] == "fail"


def test_memlock_unknown_on_rdma_fails():
    assert memlock_verdicts({"w1": None}, "ib")[0]["status"] == "fail"


def test_an_unknown_memlock_limit_is_called_unknown():
    [v] = memlock_verdicts({"gpu1": None}, "ib")
    assert v["status"] == FAIL and v["detail"].startswith("unknown,")


@pytest.mark.parametrize("stdout, kib", [("unlimited", -1), ("65536", 65536), ("motd line\n8192\n", 8192),
                                         ("", None), ("garbage", None)])
def test_rank_memlock_reads_ulimit_over_ssh_for_pdsh(stdout, kib):
    ssh = {"coord": {"w1": {"rc": 0, "stdout": stdout}}}
    probes = {"w1": {"memlock": {"soft": 1024, "hard": 1024}}}
    res = rank_memlock(launch_of("pdsh")["ranks_over_ssh"], ["coord"], ["w1"], probes, ssh)
    assert res == {"w1": kib if kib is not None else 1024}


def test_rank_memlock_falls_back_to_the_probe():
    probes = {"w1": {"memlock": {"soft": -1}}, "w2": {"memlock": {"soft": 64}}}
    ssh = {"coord": {"w1": {"rc": 255, "stdout": "unlimited"}}}
    assert rank_memlock(launch_of("pdsh")["ranks_over_ssh"], ["coord"], ["w1", "w2"], probes, ssh) == {
        "w1": -1, "w2": 64}
    assert rank_memlock(launch_of("ssh-free")["ranks_over_ssh"], ["coord"], ["w1", "w3"], probes,
                        {"coord": {"w1": {"rc": 0, "stdout": "8"}}}) == {"w1": -1, "w3": None}


def test_accelerators_cuda():
    gpus = {"w1": 2, "w2": 8, "w3": 0, "w3:status": "nvidia-smi failed: driver mismatch", "w4": None}
    res = by_host(accelerator_verdicts({"w1": 4, "w2": 8, "w3": 1, "w4": 1}, gpus, "cuda"))
    assert res["w1"]["status"] == "fail" and res["w1"]["detail"] == "the hostfile promises 4 GPU rank(s); nvidia-smi lists 2"
    assert "deepspeed_slots for w1 to 2 or less" in res["w1"]["fix"]
    assert res["w2"]["status"] == "pass" and res["w2"]["detail"] == "8 rank(s), 8 GPU(s)"
    assert res["w3"]["status"] == "fail" and "finds no GPU (nvidia-smi failed: driver mismatch)" in res["w3"]["detail"]
    assert "deepspeed_accelerator: cpu" in res["w3"]["fix"]
    assert res["w4"]["status"] == "fail" and "(none)" in res["w4"]["detail"]


def test_accelerators_cpu_pass_without_gpus():
    res = accelerator_verdicts({"w1": 2, "w2": "1"}, {}, "cpu")
    assert [(v["host"], v["status"]) for v in res] == [("w1", "pass"), ("w2", "pass")]
    assert res[0]["detail"] == "2 rank(s) on the cpu accelerator"
