"""Preflight decisions: bandwidth arithmetic on real all-reduce results, link speeds from the real sysfs
fixtures, and every verdict (versions, SSH, names, clock, disks, memlock, accelerators, master port),
then ``evaluate`` end to end on the data playbooks/preflight.yml gathers."""
import copy
import json
from pathlib import Path

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import nccl

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight import evaluate as preflight
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.evaluate import PreflightError

from tests.unit.plugins.module_utils.sysfs_facts import facts

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures"
PREFLIGHT = FIXTURES / "preflight"
KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def load(name):
    return json.loads((PREFLIGHT / name).read_text())


def raw_of(world_size, pairs):
    """A raw result as multinode_ds.allreduce_perf writes it: (bytes, seconds) pairs."""
    return {"world_size": world_size,
            "results": [{"bytes": b, "count": b // 4, "dtype": "float32", "iters": 10, "seconds": s}
                        for b, s in pairs]}


def passing_test(label, busbw_gbps, world_size=2):
    """A finished test whose only (64 MiB) message reaches busbw_gbps on world_size ranks."""
    nbytes = 64 * MIB
    algbw = busbw_gbps / preflight.bus_factor(world_size)
    return {"label": label, "ok": True, "error": "", "raw": raw_of(world_size, [(nbytes, nbytes / algbw / 1e9)])}


# --------------------------------------------------------------------------- bandwidth arithmetic

@pytest.mark.parametrize("ranks, factor", [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75), ("16", 1.875)])
def test_bus_factor(ranks, factor):
    assert preflight.bus_factor(ranks) == pytest.approx(factor)


@pytest.mark.parametrize("ranks", [0, -2])
def test_bus_factor_needs_a_rank(ranks):
    with pytest.raises(PreflightError, match="at least one rank"):
        preflight.bus_factor(ranks)


def test_bandwidth_rows_exact_numbers():
    raw = {"world_size": 4, "results": [
        {"bytes": 4096, "count": 1024, "iters": 50, "seconds": 4.096e-6},     # 1 GB/s
        {"bytes": 1000000000, "iters": 3, "seconds": 0.5},                     # 2 GB/s, no count
        {"bytes": 3000000, "count": 750000, "iters": 7, "seconds": 0.004},     # 0.75 GB/s
    ]}
    rows = preflight.bandwidth_rows(raw)
    assert rows == [
        {"bytes": 4096, "count": 1024, "iters": 50, "time_us": 4.1, "algbw_gbps": 1.0, "busbw_gbps": 1.5},
        {"bytes": 1000000000, "count": 250000000, "iters": 3, "time_us": 500000.0, "algbw_gbps": 2.0,
         "busbw_gbps": 3.0},
        {"bytes": 3000000, "count": 750000, "iters": 7, "time_us": 4000.0, "algbw_gbps": 0.75,
         "busbw_gbps": 1.125},
    ]


def test_bandwidth_rows_rounds_to_four_decimals():
    rows = preflight.bandwidth_rows(raw_of(3, [(1000000, 0.003)]))   # algbw 0.3333.., busbw x 4/3
    assert rows[0]["algbw_gbps"] == 0.3333 and rows[0]["busbw_gbps"] == 0.4444


def test_bandwidth_rows_without_results_is_empty():
    assert preflight.bandwidth_rows({"world_size": 2}) == []
    assert preflight.bandwidth_rows({"world_size": 2, "results": None}) == []


@pytest.mark.parametrize("secs", [0, 0.0, -1e-6])
def test_bandwidth_rows_non_positive_time_raises(secs):
    with pytest.raises(PreflightError, match="non-positive time .* for 4096 bytes"):
        preflight.bandwidth_rows(raw_of(2, [(8192, 0.001), (4096, secs)]))


def test_bandwidth_rows_bad_world_size_raises():
    with pytest.raises(PreflightError):
        preflight.bandwidth_rows(raw_of(0, [(4096, 0.001)]))


def row(nbytes, busbw):
    return {"bytes": nbytes, "busbw_gbps": busbw}


def test_large_message_busbw_is_the_best_of_the_top_quarter():
    rows = [row(1 * MIB, 9.0), row(8 * MIB, 8.0), row(16 * MIB, 5.0), row(32 * MIB, 3.0), row(64 * MIB, 4.0)]
    # 1 MiB and 8 MiB are faster but smaller than a quarter of 64 MiB; 16 MiB is exactly a quarter.
    assert preflight.large_message_busbw(rows) == 5.0
    assert preflight.large_message_busbw(rows[:-1]) == 8.0   # largest 32 MiB: 8 MiB counts now
    assert preflight.large_message_busbw([row(4096, 0.25)]) == 0.25
    assert preflight.large_message_busbw([]) is None


@pytest.mark.parametrize("n, text", [(0, "0B"), (512, "512B"), (1536, "1536B"), (4096, "4K"), (MIB, "1M"),
                                     (3 * MIB, "3M"), (64 * MIB, "64M"), (GIB, "1G"), (GIB + KIB, "1048577K"),
                                     (MIB + 1, "1048577B")])
def test_human_bytes(n, text):
    assert preflight.human_bytes(n) == text


def test_format_bandwidth_table():
    rows = preflight.bandwidth_rows(raw_of(4, [(4096, 4.096e-6), (64 * MIB, 0.05)]))
    text = preflight.format_bandwidth_table(rows, "all_reduce tcp: PASS")
    lines = text.splitlines()
    assert lines[0] == "all_reduce tcp: PASS"
    assert lines[1].split() == ["size", "count", "iters", "time(us)", "algbw(GB/s)", "busbw(GB/s)"]
    assert lines[2] == "%10s %12d %6s %12.1f %12.3f %12.3f" % ("4K", 1024, 10, 4.1, 1.0, 1.5)
    assert lines[3].split() == ["64M", "16777216", "10", "50000.0", "1.342", "2.013"]
    assert len(lines) == 4
    # Without a title the header comes first.
    assert preflight.format_bandwidth_table(rows).splitlines()[0] == lines[1]
    assert preflight.format_bandwidth_table([]) == lines[1]


# --------------------------------------------------------------------------- the real results

SIZES_64M = [4 * KIB << i for i in range(15)]     # 4 KiB .. 64 MiB, doubling


@pytest.mark.parametrize("name", ["gloo-2node-podman.json", "h100-nccl-1rank.json", "h100-host-gloo-2rank.json"])
def test_real_results_rows_match_an_independent_computation(name):
    raw = load(name)
    rows = preflight.bandwidth_rows(raw)
    n = raw["world_size"]
    assert len(rows) == len(raw["results"]) >= 15
    sizes = [r["bytes"] for r in rows]
    assert sizes[0] == 4096 and sizes[-1] >= 64 * MIB
    assert all(b == a * 2 for a, b in zip(sizes, sizes[1:]))
    for r, res in zip(rows, raw["results"]):
        algbw = res["bytes"] / res["seconds"] / 1e9
        assert r["algbw_gbps"] == round(algbw, 4) and r["algbw_gbps"] > 0
        assert r["busbw_gbps"] == round(algbw * 2 * (n - 1) / n, 4)
        assert r["count"] == res["count"] == res["bytes"] // 4 and r["iters"] == res["iters"]
        assert r["time_us"] == round(res["seconds"] * 1e6, 1)


def test_gloo_across_two_podman_containers():
    raw = load("gloo-2node-podman.json")
    assert raw["world_size"] == 2 and raw["nodes"] == 2 and raw["backend"] == "gloo"
    rows = preflight.bandwidth_rows(raw)
    assert [r["bytes"] for r in rows] == SIZES_64M
    assert all(r["busbw_gbps"] == r["algbw_gbps"] for r in rows)     # 2 ranks: factor 1
    best = max(res["bytes"] / res["seconds"] / 1e9 for res in raw["results"] if res["bytes"] >= 16 * MIB)
    assert preflight.large_message_busbw(rows) == round(best, 4)
    assert 1.0 < preflight.large_message_busbw(rows) < 1.1           # ~1.05 GB/s measured
    # Judged as gloo across two nodes: fine on a 10 Gb/s link, below 5% of a 200 Gb/s one.
    test = {"label": raw["label"], "ok": True, "raw": raw}
    assert preflight.judge_bandwidth(test, 2, "tcp", "gloo", 10.0)["status"] == "pass"
    low = preflight.judge_bandwidth(test, 2, "tcp", "gloo", 200.0)
    assert low["status"] == "fail" and low["threshold_gbps"] == 1.25


def test_nccl_on_one_h100_rank_crosses_no_link():
    raw = load("h100-nccl-1rank.json")
    rows = preflight.bandwidth_rows(raw)
    assert raw["world_size"] == 1
    assert [r["bytes"] for r in rows] == [4 * KIB << i for i in range(17)]    # .. 256 MiB
    assert all(r["busbw_gbps"] == 0 for r in rows)
    assert all(r["algbw_gbps"] > 0 for r in rows)
    assert rows[-1]["algbw_gbps"] > 1000          # in-GPU: TB/s territory, nothing crossed a link
    assert preflight.large_message_busbw(rows) == 0
    judged = preflight.judge_bandwidth({"label": "tcp", "ok": True, "raw": raw}, 1, "tcp", "nccl", 100.0)
    assert judged["status"] == "pass" and judged["threshold_gbps"] is None and judged["busbw_gbps"] == 0
    assert "one rank node" in judged["reason"]


def test_gloo_two_ranks_on_one_h100_host():
    raw = load("h100-host-gloo-2rank.json")
    rows = preflight.bandwidth_rows(raw)
    assert raw["world_size"] == 2 and raw["nodes"] == 1
    assert [r["bytes"] for r in rows] == SIZES_64M
    assert all(r["busbw_gbps"] == r["algbw_gbps"] for r in rows)
    by_size = dict((r["bytes"], r["busbw_gbps"]) for r in rows)
    # The real data peaks at 16 MiB, exactly a quarter of the largest size: it is still counted.
    assert by_size[16 * MIB] > by_size[32 * MIB] > by_size[64 * MIB]
    assert preflight.large_message_busbw(rows) == by_size[16 * MIB]
    # Bigger messages move faster than the smallest one on this host.
    assert by_size[64 * MIB] > 50 * by_size[4096]


# --------------------------------------------------------------------------- judge_bandwidth

def test_judge_pass_above_threshold():
    res = preflight.judge_bandwidth(passing_test("tcp", 1.0), 2, "tcp", "nccl", 10.0)
    assert res["status"] == "pass"
    assert res["threshold_gbps"] == 0.375           # 10 Gb/s / 8 x 0.3
    assert res["busbw_gbps"] == 1.0 and res["fraction"] == 0.3 and res["key"] == "tcp"
    assert res["link_gbps"] == 10.0 and res["label"] == "tcp" and len(res["rows"]) == 1
    assert res["reason"] == "bus bandwidth 1.000 GB/s >= 0.375 GB/s (0.3 of 10 Gb/s, tcp)"


def test_judge_fail_below_threshold():
    res = preflight.judge_bandwidth(passing_test("ib", 20.0), 2, "ib", "nccl", 400.0)
    assert res["status"] == "fail" and res["threshold_gbps"] == 25.0    # 400 / 8 x 0.5
    assert res["reason"] == "bus bandwidth 20.000 GB/s < 25.000 GB/s (0.5 of the 400 Gb/s link, ib)"


def test_judge_exactly_at_threshold_passes():
    res = preflight.judge_bandwidth(passing_test("roce", 20.0), 2, "roce", "nccl", 400.0)   # 400/8*0.4 = 20
    assert res["threshold_gbps"] == 20.0 and res["status"] == "pass"


def test_judge_one_node_passes_without_threshold():
    res = preflight.judge_bandwidth(passing_test("ib", 0.001), 1, "ib", "nccl", 400.0)
    assert res["status"] == "pass" and res["threshold_gbps"] is None
    assert res["busbw_gbps"] == 0.001


def test_judge_unknown_link_warns():
    res = preflight.judge_bandwidth(passing_test("tcp", 0.001), 2, "tcp", "gloo", None)
    assert res["status"] == "warn" and res["threshold_gbps"] is None
    assert "preflight_link_gbps" in res["reason"]


@pytest.mark.parametrize("test, why", [
    ({"label": "ib", "ok": False, "error": "  worker1: NCCL WARN Call to ibv_modify_qp failed  ", "raw": None},
     "worker1: NCCL WARN Call to ibv_modify_qp failed"),
    ({"label": "ib", "ok": False, "error": "worker2: exit 1", "raw": raw_of(2, [(4096, 0.001)])}, "worker2: exit 1"),
    ({"label": "ib", "ok": True, "raw": None}, "no result"),
    ({}, "no result"),
])
def test_judge_unfinished_test_fails_with_its_error(test, why):
    res = preflight.judge_bandwidth(test, 2, "ib", "nccl", 400.0)
    assert res["status"] == "fail"
    assert res["reason"] == "the all-reduce test did not finish: %s" % why
    assert res["rows"] == [] and res["busbw_gbps"] is None and res["threshold_gbps"] is None


def test_judge_gloo_uses_the_gloo_fraction():
    test = passing_test("tcp", 0.1)
    gloo = preflight.judge_bandwidth(test, 2, "tcp", "gloo", 10.0)
    assert gloo["key"] == "gloo" and gloo["fraction"] == 0.05
    assert gloo["threshold_gbps"] == 0.0625 and gloo["status"] == "pass"
    # The same numbers on NCCL's tcp profile need 0.375 GB/s.
    assert preflight.judge_bandwidth(test, 2, "tcp", "nccl", 10.0)["status"] == "fail"


def test_judge_custom_fractions_override_only_their_keys():
    test = passing_test("tcp", 1.0)
    res = preflight.judge_bandwidth(test, 2, "tcp", "nccl", 10.0, {"tcp": 0.9})
    assert res["fraction"] == 0.9 and res["threshold_gbps"] == 1.125 and res["status"] == "fail"
    # Other keys keep their defaults, and the defaults are not modified.
    ib = preflight.judge_bandwidth(passing_test("ib", 30.0), 2, "ib", "nccl", 400.0, {"tcp": 0.9})
    assert ib["fraction"] == 0.5 and ib["status"] == "pass"
    assert preflight.DEFAULT_FRACTIONS == {"ib": 0.5, "roce": 0.4, "tcp": 0.3, "gloo": 0.05}


def test_judge_without_a_fraction_for_the_key_warns():
    res = preflight.judge_bandwidth(passing_test("tcp", 1.0), 2, "tcp", "nccl", 10.0, {"tcp": None})
    assert res["status"] == "warn" and "no key tcp" in res["reason"]


# --------------------------------------------------------------------------- fallback to tcp

def failed_rdma(profile="ib"):
    return preflight.judge_bandwidth({"label": profile, "ok": False, "raw": None,
                                      "error": "worker1: NCCL WARN Call to ibv_modify_qp failed"},
                                     2, profile, "nccl", 400.0)


def tcp_judged(busbw, link=10.0):
    return preflight.judge_bandwidth(passing_test("tcp", busbw), 2, "tcp", "nccl", link)


@pytest.mark.parametrize("profile, backend, status, expected", [
    ("ib", "nccl", "fail", True), ("roce", "nccl", "fail", True),
    ("tcp", "nccl", "fail", False), ("ib", "gloo", "fail", False),
    ("ib", "nccl", "pass", False), ("roce", "nccl", "warn", False),
])
def test_needs_fallback_test(profile, backend, status, expected):
    assert preflight.needs_fallback_test(profile, backend, {"status": status}) is expected


@pytest.mark.parametrize("profile", ["ib", "roce"])
def test_rdma_failing_to_init_with_tcp_working_pins_tcp(profile):
    primary, tcp = failed_rdma(profile), tcp_judged(1.0)
    assert primary["status"] == "fail" and tcp["status"] == "pass"
    advice = preflight.fallback_advice(profile, primary, tcp, ["worker1", "worker2"])
    assert advice["variable"] == "nccl_profile" and advice["value"] == "tcp"
    msg = advice["message"]
    assert "NCCL's %s profile fails to initialise" % profile in msg
    assert "on worker1, worker2" in msg and "nccl_profile: tcp" in msg
    assert "ibv_modify_qp" in msg and "site.yml" in msg and tcp["reason"] in msg


def test_rdma_far_below_threshold_and_slower_than_tcp_pins_tcp():
    primary = preflight.judge_bandwidth(passing_test("ib", 0.5), 2, "ib", "nccl", 400.0)
    advice = preflight.fallback_advice("ib", primary, tcp_judged(1.0), ["w1", "w2"])
    assert advice["variable"] == "nccl_profile" and advice["value"] == "tcp"
    assert "runs at 0.500 GB/s, far below its threshold" in advice["message"]


def test_rdma_below_threshold_but_faster_than_tcp_does_not_pin():
    primary = preflight.judge_bandwidth(passing_test("ib", 10.0), 2, "ib", "nccl", 400.0)
    tcp = tcp_judged(1.0)
    assert primary["status"] == "fail" and tcp["status"] == "pass"
    advice = preflight.fallback_advice("ib", primary, tcp, ["w1", "w2"])
    assert advice["variable"] is None and advice["value"] is None
    assert "TCP is slower still (1.000 GB/s)" in advice["message"] and "keep ib" in advice["message"]


def test_tcp_failing_too_means_the_network_is_broken():
    tcp = tcp_judged(0.01)
    assert tcp["status"] == "fail"
    advice = preflight.fallback_advice("roce", failed_rdma("roce"), tcp, ["w1", "w2"])
    assert advice["variable"] is None and advice["value"] is None
    assert "broken" in advice["message"] and "between w1, w2" in advice["message"]
    assert "fix the network first" in advice["message"]


def test_no_advice_when_not_needed():
    tcp = tcp_judged(1.0)
    assert preflight.fallback_advice("tcp", failed_rdma(), tcp, ["w1"]) is None
    passed = preflight.judge_bandwidth(passing_test("ib", 300.0), 2, "ib", "nccl", 400.0)
    assert passed["status"] == "pass"
    assert preflight.fallback_advice("ib", passed, tcp, ["w1"]) is None
    assert preflight.fallback_advice("ib", failed_rdma(), None, ["w1"]) is None
    assert preflight.fallback_advice("ib", None, tcp, ["w1"]) is None


# --------------------------------------------------------------------------- link speeds from the facts

def test_link_of_the_4_port_infiniband_node_is_the_sum_of_its_ports():
    f = facts("ib-mlx5-4port")
    node = nccl.node_profile(f, host="gpu1")
    assert node["profile"] == "ib" and len(node["rdma_ports"]) == 4
    assert preflight.node_link_gbps(f, node) == 1600.0        # 4 x 400 Gb/s NDR
    # Only the ports the profile uses count.
    assert preflight.node_link_gbps(f, dict(node, rdma_ports=["mlx5_0:1", "mlx5_2:1"])) == 800.0


def test_link_of_the_roce_node():
    f = facts("roce")
    node = nccl.node_profile(f, host="r1")
    assert node["profile"] == "roce"
    assert preflight.node_link_gbps(f, node) == 400.0         # 2 x 200 Gb/s


def test_link_of_an_rdma_port_with_unknown_rate_is_unknown():
    f = copy.deepcopy(facts("roce"))
    node = nccl.node_profile(f, host="r1")
    f["rdma"][1]["ports"][0]["rate_gbps"] = None
    assert preflight.node_link_gbps(f, node) is None
    assert preflight.node_link_gbps(facts("roce"), dict(node, rdma_ports=["mlx5_9:1"])) is None


def test_link_of_the_ethernet_only_node_is_its_cluster_interface():
    f = facts("ethernet-only")
    node = nccl.node_profile(f, host="jw2")
    assert node["env"]["NCCL_SOCKET_IFNAME"] == "=eno1"
    assert preflight.node_link_gbps(f, node) == 1.0           # eno1/speed: 1000 (Mb/s)
    # docker0's sysfs speed is -1 (no speed): unknown.
    docker = nccl.node_profile(f, host="jw2", socket_ifname="docker0")
    assert preflight.node_link_gbps(f, docker) is None


def test_link_of_tcp_nodes_with_and_without_rdma_hardware():
    assert preflight.node_link_gbps(facts("ib-down"), nccl.node_profile(facts("ib-down"), host="w3")) == 25.0
    ib = facts("ib-mlx5-4port")
    assert preflight.node_link_gbps(ib, nccl.node_profile(ib, host="g", requested="tcp")) == 10.0    # eno1
    # eno2 is DOWN and its sysfs speed is -1.
    assert preflight.node_link_gbps(ib, nccl.node_profile(ib, host="g", requested="tcp",
                                                          socket_ifname="eno2")) is None


def test_link_of_tcp_without_env_uses_the_cluster_interface():
    assert preflight.node_link_gbps(facts("roce"), {"profile": "tcp"}) == 200.0        # ens1f0np0
    assert preflight.node_link_gbps({"interfaces": [], "cluster_interface": "eth0", "cluster_speed_mbps": 25000},
                                    {"profile": "tcp", "env": {}}) == 25.0
    assert preflight.node_link_gbps({"interfaces": [], "cluster_interface": None}, {"profile": "tcp"}) is None


def test_job_link_is_the_slowest_node_or_unknown():
    ib, roce = facts("ib-mlx5-4port"), facts("roce")
    speeds = {"gpu1": preflight.node_link_gbps(ib, nccl.node_profile(ib, host="gpu1")),
              "r1": preflight.node_link_gbps(roce, nccl.node_profile(roce, host="r1"))}
    assert preflight.job_link_gbps(speeds) == 400.0
    assert preflight.job_link_gbps(dict(speeds, jw2=1.0)) == 1.0
    assert preflight.job_link_gbps(dict(speeds, jw2=None)) is None
    assert preflight.job_link_gbps({}) is None


# --------------------------------------------------------------------------- versions

STACK = {"python": "3.11.2", "torch": "2.13.0+cu128", "cuda": "12.8", "nccl": "2.27.3", "deepspeed": "0.19.8",
         "transformers": "4.57.1", "trainer": "0.3.0"}
CPU_COORD = dict(STACK, torch="2.13.0+cpu", cuda=None, nccl=None)


def by_host(verdicts):
    return dict((v["host"], v) for v in verdicts)


def test_versions_cpu_coordinator_with_gpu_workers_pass():
    res = preflight.version_verdicts({"coord": CPU_COORD, "w1": STACK, "w2": dict(STACK)}, ["w1", "w2"], ["coord"])
    assert [v["host"] for v in res] == ["w1", "w2", "coord"]
    assert all(v["status"] == "pass" and v["check"] == "versions" for v in res)
    assert "torch" not in by_host(res)["coord"]["detail"] and "deepspeed 0.19.8" in by_host(res)["coord"]["detail"]
    assert "torch 2.13.0+cu128" in by_host(res)["w2"]["detail"]


def test_versions_worker_with_another_deepspeed_fails():
    res = by_host(preflight.version_verdicts({"coord": CPU_COORD, "w1": STACK, "w2": dict(STACK, deepspeed="0.19.7")},
                                             ["w1", "w2"], ["coord"]))
    assert res["w1"]["status"] == "pass" and res["coord"]["status"] == "pass"
    assert res["w2"]["status"] == "fail"
    assert res["w2"]["detail"] == "differs: deepspeed 0.19.7 (w1 has 0.19.8)"
    assert "site.yml" in res["w2"]["fix"] and "w2" in res["w2"]["fix"]


def test_versions_worker_with_a_cpu_torch_fails_on_rank_keys():
    res = by_host(preflight.version_verdicts({"w1": STACK, "w2": CPU_COORD}, ["w1", "w2"], []))
    assert res["w2"]["status"] == "fail"
    for key in ("torch 2.13.0+cpu", "cuda None", "nccl None"):
        assert key in res["w2"]["detail"]


def test_versions_coordinator_differing_on_a_common_key_fails():
    res = by_host(preflight.version_verdicts({"coord": dict(CPU_COORD, transformers="4.56.0"), "w1": STACK},
                                             ["w1"], ["coord"]))
    assert res["coord"]["status"] == "fail" and "transformers 4.56.0 (w1 has 4.57.1)" in res["coord"]["detail"]


@pytest.mark.parametrize("value, why", [({"error": "no venv at /opt/multinode-deepspeed/venv"},
                                         "no venv at /opt/multinode-deepspeed/venv"),
                                        ("python not found", "python not found"),
                                        (None, "no answer")])
def test_versions_unreadable_fail(value, why):
    versions = {"w1": STACK, "w2": value}
    if value is None:
        del versions["w2"]
    res = by_host(preflight.version_verdicts(versions, ["w1", "w2"], []))
    assert res["w2"]["status"] == "fail"
    assert res["w2"]["detail"] == "cannot read the stack's versions: %s" % why
    assert "site.yml" in res["w2"]["fix"] and "w2" in res["w2"]["fix"]


def test_versions_coordinator_that_is_also_a_worker_is_judged_once():
    res = preflight.version_verdicts({"w1": STACK, "w2": STACK}, ["w1", "w2"], ["w1"])
    assert [v["host"] for v in res] == ["w1", "w2"]


# --------------------------------------------------------------------------- ssh

def test_ssh_pairs_for_pdsh():
    assert preflight.ssh_required_pairs("pdsh", ["coord"], ["w1", "w2"]) == [
        ("coord", "coord"), ("coord", "w1"), ("coord", "w2"), ("w1", "w1"), ("w2", "w2")]
    # The coordinator is a rank node too: no duplicate pair.
    assert preflight.ssh_required_pairs("pdsh", ["w1"], ["w1", "w2"]) == [("w1", "w1"), ("w1", "w2"), ("w2", "w2")]


def test_ssh_pairs_for_ssh_free():
    assert preflight.ssh_required_pairs("ssh-free", ["coord"], ["w1", "w2"]) == []


@pytest.mark.parametrize("src, dst, stderr, rc, want", [
    ("coord", "worker1", "ssh: connect to host worker1 port 22: Connection refused", 255,
     ["sshd is not running", "on worker1", "systemctl start ssh"]),
    ("coord", "worker1", "Host key verification failed.", 255,
     ["coord does not know worker1's host key", "ssh_mesh", "known_hosts", "never turn StrictHostKeyChecking off"]),
    ("coord", "worker2", "root@worker2: Permission denied (publickey).", 255,
     ["coord's cluster key is not accepted on worker2", "authorized_keys", "ssh_mesh_user"]),
    ("coord", "worker2", "ssh: Could not resolve hostname worker2: Name or service not known", 255,
     ["coord cannot resolve the name worker2", "/etc/hosts on coord"]),
    ("coord", "worker1", "ssh: connect to host worker1 port 22: Connection timed out", 255,
     ["coord cannot reach worker1 on port 22", "firewall"]),
    ("coord", "worker1", "Connection timed out during banner exchange", 255,
     ["coord cannot reach worker1 on port 22"]),
    ("coord", "worker1", "ssh: connect to host worker1 port 22: No route to host", 255,
     ["coord cannot reach worker1 on port 22"]),
    ("coord", "worker1", "ssh worker1: timed out after 15 s", 124, ["coord cannot reach worker1"]),
    ("coord", "worker1", "", 124, ["coord cannot reach worker1"]),
    ("coord", "worker1", "kex_exchange_identification: read: Connection reset by peer", 255,
     ["ssh from coord to worker1 failed (exit 255)", "ssh worker1 true on coord"]),
])
def test_ssh_fix_from_real_openssh_errors(src, dst, stderr, rc, want):
    fix = preflight.ssh_fix(src, dst, stderr, rc)
    for text in want:
        assert text in fix


def test_ssh_fix_causes_do_not_overlap():
    fixes = [preflight.ssh_fix("c", "w", e, 255) for e in (
        "ssh: connect to host w port 22: Connection refused", "Host key verification failed.",
        "root@w: Permission denied (publickey).", "ssh: Could not resolve hostname w: Name or service not known",
        "ssh: connect to host w port 22: Connection timed out", "something else")]
    assert len(set(fixes)) == len(fixes)


OK = {"rc": 0, "stdout": "unlimited", "stderr": ""}


def test_ssh_verdicts_pass_and_fail_with_fix():
    required = preflight.ssh_required_pairs("pdsh", ["coord"], ["w1", "w2"])
    refused = {"rc": 255, "stdout": "",
               "stderr": "Warning: Permanently added 'w2' (ED25519) to the list of known hosts.\n"
                         "ssh: connect to host w2 port 22: Connection refused\n"}
    results = {"coord": {"coord": OK, "w1": OK, "w2": refused}, "w1": {"w1": OK}, "w2": {"w2": OK}}
    res = preflight.ssh_verdicts(results, required, "pdsh")
    assert len(res) == 5 and all(v["check"] == "ssh" for v in res)
    failed = [v for v in res if v["status"] == "fail"]
    assert len(failed) == 1 and failed[0]["host"] == "coord"
    assert failed[0]["detail"] == "coord -> w2: ssh: connect to host w2 port 22: Connection refused"
    assert "sshd is not running" in failed[0]["fix"]
    assert [v["detail"] for v in res if v["status"] == "pass"] == ["coord -> coord", "coord -> w1", "w1 -> w1",
                                                                   "w2 -> w2"]


def test_ssh_verdicts_without_stderr_name_the_exit_code():
    res = preflight.ssh_verdicts({"w1": {"w1": {"rc": 1, "stderr": ""}}}, [("w1", "w1")], "pdsh")
    assert res[0]["status"] == "fail" and res[0]["detail"] == "w1 -> w1: exit 1"


def test_ssh_verdicts_missing_source_fails():
    res = preflight.ssh_verdicts({"coord": {"w1": OK}}, [("coord", "w1"), ("w1", "w1")], "pdsh")
    assert res[0]["status"] == "pass"
    assert res[1]["status"] == "fail" and "not tested (w1 gave no answer)" in res[1]["detail"]
    assert res[1]["fix"] == "check that Ansible reaches w1"


def test_ssh_verdicts_ssh_free_is_one_skip():
    res = preflight.ssh_verdicts({}, [], "ssh-free")
    assert len(res) == 1 and res[0]["status"] == "skip" and res[0]["host"] == "*"
    assert "ssh-free" in res[0]["detail"]


def test_ssh_matrix_table():
    nodes = ["coord", "worker1", "worker2"]
    required = preflight.ssh_required_pairs("pdsh", ["coord"], ["worker1", "worker2"])
    results = {"coord": {"coord": OK, "worker1": {"rc": 255, "stderr": "x"}, "worker2": OK},
               "worker1": {"worker1": OK}}           # worker2 gave no answer
    lines = preflight.ssh_matrix_table(nodes, results, required).splitlines()
    assert lines[0].split() == ["from\\to", "coord", "worker1", "worker2"]
    assert lines[1].split() == ["coord", "ok", "FAIL", "ok"]
    assert lines[2].split() == ["worker1", "-", "ok", "-"]
    assert lines[3].split() == ["worker2", "-", "-", "FAIL"]
    assert len(lines) == 4
    # Columns line up: every cell starts where its header does.
    col = lines[0].index("worker1")
    assert lines[1][col:col + 4] == "FAIL" and lines[2][col:col + 2] == "ok"


# --------------------------------------------------------------------------- names

EXPECTED = {"coord": "10.89.0.2", "worker1": "10.89.0.3", "worker2": "10.89.0.4"}
OWN = {"coord": ["10.89.0.2"], "worker1": ["10.89.0.3", "192.168.7.3"], "worker2": ["10.89.0.4"]}


def lookups(**changes):
    res = dict((n, {"addresses": [a]}) for n, a in EXPECTED.items())
    res.update(changes)
    return res


def test_names_all_resolve_right():
    res = preflight.name_verdicts({h: lookups() for h in EXPECTED}, EXPECTED, OWN)
    assert [v["host"] for v in res] == ["coord", "worker1", "worker2"]
    assert all(v["status"] == "pass" and v["check"] == "names" for v in res)
    assert res[0]["detail"] == "resolves coord, worker1, worker2"


def test_names_unresolvable_fails_naming_etc_hosts():
    res = by_host(preflight.name_verdicts(
        {"worker1": lookups(worker2={"error": "Name or service not known"}), "worker2": lookups()}, EXPECTED, OWN))
    assert res["worker2"]["status"] == "pass"
    v = res["worker1"]
    assert v["status"] == "fail" and v["detail"] == "worker2 does not resolve (Name or service not known)"
    assert v["fix"] == ("run site.yml: with cluster_hosts_file: true (the default) its cluster_hosts role writes "
                        "every inventory name into /etc/hosts on worker1 (10.89.0.4 worker2); or add worker2 to the "
                        "site's DNS and set cluster_hosts_file: false")
    empty = preflight.name_verdicts({"w1": lookups(worker2={"addresses": []})}, EXPECTED, OWN)[0]
    assert empty["status"] == "fail" and "(no address)" in empty["detail"]


def test_names_fix_says_dns_must_do_it_when_the_hosts_file_is_off():
    res = preflight.name_verdicts({"worker1": lookups(worker2={"error": "Name or service not known"})}, EXPECTED, OWN,
                                  hosts_file_off=["worker1"])
    fix = res[0]["fix"]
    assert fix.startswith("cluster_hosts_file is false for worker1, so the site's DNS must resolve worker2")
    assert "add them to DNS (10.89.0.4 worker2), or set cluster_hosts_file: true" in fix
    # Several names: one fix that lists them all.
    res = preflight.name_verdicts({"coord": lookups(worker1={"error": "x"}, worker2={"error": "x"})}, EXPECTED, OWN)
    assert res[0]["fix"].count("run site.yml") == 1
    assert "(10.89.0.3 worker1, 10.89.0.4 worker2); or add worker1, worker2 to" in res[0]["fix"]


def test_names_foreign_address_fails():
    v = preflight.name_verdicts({"coord": lookups(worker1={"addresses": ["10.89.0.99"]})}, EXPECTED, OWN)[0]
    assert v["status"] == "fail"
    assert v["detail"] == "worker1 resolves to 10.89.0.99, not 10.89.0.3 (the address the cluster uses)"
    assert "/etc/hosts or DNS on coord" in v["fix"] and "should be 10.89.0.3" in v["fix"]
    assert "cluster_hosts_file" in v["fix"]


def test_names_first_address_decides():
    good = lookups(worker1={"addresses": ["10.89.0.3", "10.89.0.99"]})
    bad = lookups(worker1={"addresses": ["10.89.0.99", "10.89.0.3"]})
    assert preflight.name_verdicts({"coord": good}, EXPECTED, OWN)[0]["status"] == "pass"
    assert preflight.name_verdicts({"coord": bad}, EXPECTED, OWN)[0]["status"] == "fail"


def test_names_own_name_on_loopback_warns_but_anothers_fails():
    own = preflight.name_verdicts({"worker1": lookups(worker1={"addresses": ["127.0.1.1"]})}, EXPECTED, OWN)[0]
    assert own["status"] == "warn" and "127.0.1.1 (loopback" in own["detail"] and own["fix"] is None
    other = preflight.name_verdicts({"coord": lookups(worker1={"addresses": ["127.0.1.1"]})}, EXPECTED, OWN)[0]
    assert other["status"] == "fail"


def test_names_another_address_of_the_same_node_warns():
    v = preflight.name_verdicts({"coord": lookups(worker1={"addresses": ["192.168.7.3"]})}, EXPECTED, OWN)[0]
    assert v["status"] == "warn"
    assert v["detail"] == "worker1 resolves to 192.168.7.3, another address of worker1 (the cluster uses 10.89.0.3)"


def test_names_not_looked_up_fails_without_fix():
    res = lookups()
    del res["worker2"]
    v = preflight.name_verdicts({"coord": res}, EXPECTED, OWN)[0]
    assert v["status"] == "fail" and v["detail"] == "worker2: not looked up" and v["fix"] is None


def test_names_problems_beat_notes():
    res = lookups(worker1={"addresses": ["192.168.7.3"]}, worker2={"error": "Temporary failure in name resolution"})
    v = preflight.name_verdicts({"coord": res}, EXPECTED, OWN)[0]
    assert v["status"] == "fail" and "worker2 does not resolve" in v["detail"]


# --------------------------------------------------------------------------- clock

def probe_at(node, before, after):
    return {"time": node, "controller_before": before, "controller_after": after}


def test_clock_skew_arithmetic():
    est, half, certain = preflight.clock_skew(probe_at(1010.25, 1000.0, 1000.5))
    assert est == pytest.approx(10.0) and half == pytest.approx(0.25) and certain == pytest.approx(9.75)
    est, half, certain = preflight.clock_skew(probe_at(996.0, 1000.0, 1002.0))     # behind
    assert est == pytest.approx(-5.0) and half == pytest.approx(1.0) and certain == pytest.approx(4.0)
    assert preflight.clock_skew(probe_at("1000.1", "1000", "1000.2"))[2] == 0.0       # strings as Ansible may pass


def test_clock_within_bracket_passes():
    res = preflight.clock_verdicts({"w1": probe_at(1000.1, 1000.0, 1000.2)}, 2.0)
    assert res[0]["status"] == "pass" and res[0]["check"] == "clock" and res[0]["fix"] is None
    assert res[0]["detail"] == "+0.000 s from the nodes' median (+/- 0.200 s); +0.000 s vs the controller"


def test_clock_ten_seconds_ahead_fails():
    res = preflight.clock_verdicts({"w2": probe_at(1010.25, 1000.0, 1000.5), "w1": probe_at(1000.1, 1000.0, 1000.2)},
                                   2.0)
    assert [v["host"] for v in res] == ["w1", "w2"]
    assert res[1]["status"] == "fail" and "+10.000 s" in res[1]["detail"] and "bound of 2 s" in res[1]["detail"]
    assert "chrony" in res[1]["fix"] and "w2" in res[1]["fix"]


def test_clock_uncertain_over_the_bound_warns():
    # Read 1.5 s after the bracket's middle with a 4 s bracket: maybe skewed, maybe latency.
    res = preflight.clock_verdicts({"w1": probe_at(1003.5, 1000.0, 1004.0)}, 2.0)
    assert res[0]["status"] == "warn" and "cannot confirm it is within 2 s" in res[0]["detail"]


def test_clock_bracket_backwards_raises():
    with pytest.raises(PreflightError, match="controller_after < controller_before"):
        preflight.clock_skew(probe_at(1000.0, 1000.5, 1000.0))


# --------------------------------------------------------------------------- disks, memlock, accelerators

PATHS = {"shared": "/srv/multinode-deepspeed", "local": "/opt/multinode-deepspeed"}
MINIMUMS = {"shared": 5.0, "local": 5.0}


def test_disk_verdicts():
    probes = {"w1": {"disk": {PATHS["shared"]: {"free_bytes": 10 * GIB, "total_bytes": 100 * GIB},
                              PATHS["local"]: {"free_bytes": 1 * GIB, "total_bytes": 100 * GIB}}},
              "w2": {"disk": {PATHS["shared"]: {"error": "/srv/multinode-deepspeed: No such file or directory"},
                              PATHS["local"]: {"free_bytes": 5 * GIB}}}}
    res = preflight.disk_verdicts(probes, PATHS, MINIMUMS)
    got = [(v["host"], v["detail"].split()[0], v["status"]) for v in res]
    assert got == [("w1", "local", "fail"), ("w1", "shared", "pass"), ("w2", "local", "pass"),
                   ("w2", "shared", "fail")]
    assert res[0]["detail"] == "local /opt/multinode-deepspeed: 1.0 GiB free, needs 5 GiB"
    assert "preflight_min_free_gib_local" in res[0]["fix"]
    assert res[1]["detail"] == "shared /srv/multinode-deepspeed: 10.0 GiB free"
    assert "No such file" in res[3]["detail"] and "create /srv/multinode-deepspeed on w2" in res[3]["fix"]


def test_disk_path_missing_from_the_probe_counts_as_no_space():
    res = preflight.disk_verdicts({"w1": {}}, {"local": "/opt"}, {"local": 1})
    assert res[0]["status"] == "fail" and "0.0 GiB free" in res[0]["detail"]
    assert preflight.disk_verdicts({"w1": {}}, {"local": "/opt"}, {})[0]["status"] == "pass"


def test_memlock_tcp_is_skipped():
    res = preflight.memlock_verdicts({"w1": 8192, "w2": -1}, "tcp")
    assert [v["status"] for v in res] == ["skip", "skip"]
    assert res[0]["detail"] == "8192 KiB (the tcp profile pins no memory)"


@pytest.mark.parametrize("profile", ["ib", "roce"])
def test_memlock_rdma_needs_unlimited(profile):
    res = by_host(preflight.memlock_verdicts({"w1": 8192, "w2": -1, "w3": "-1"}, profile))
    assert res["w1"]["status"] == "fail"
    assert res["w1"]["detail"] == "8192 KiB, the %s profile needs unlimited" % profile
    assert "site.yml" in res["w1"]["fix"] and "on w1" in res["w1"]["fix"]
    assert res["w2"]["status"] == "pass" and res["w2"]["detail"] == "unlimited"
    assert res["w3"]["status"] == "pass"


def test_memlock_minimum_setting():
    res = by_host(preflight.memlock_verdicts({"w1": 65536, "w2": 65535}, "ib", minimum_kib=65536))
    assert res["w1"]["status"] == "pass" and res["w2"]["status"] == "fail"


def test_memlock_unknown_on_rdma_fails():
    assert preflight.memlock_verdicts({"w1": None}, "ib")[0]["status"] == "fail"


def test_accelerators_cuda():
    gpus = {"w1": 2, "w2": 8, "w3": 0, "w3:status": "nvidia-smi failed: driver mismatch", "w4": None}
    res = by_host(preflight.accelerator_verdicts({"w1": 4, "w2": 8, "w3": 1, "w4": 1}, gpus, "cuda"))
    assert res["w1"]["status"] == "fail" and res["w1"]["detail"] == "the hostfile promises 4 GPU rank(s); nvidia-smi lists 2"
    assert "deepspeed_slots for w1 to 2 or less" in res["w1"]["fix"]
    assert res["w2"]["status"] == "pass" and res["w2"]["detail"] == "8 rank(s), 8 GPU(s)"
    assert res["w3"]["status"] == "fail" and "finds no GPU (nvidia-smi failed: driver mismatch)" in res["w3"]["detail"]
    assert "deepspeed_accelerator: cpu" in res["w3"]["fix"]
    assert res["w4"]["status"] == "fail" and "(none)" in res["w4"]["detail"]


def test_accelerators_cpu_pass_without_gpus():
    res = preflight.accelerator_verdicts({"w1": 2, "w2": "1"}, {}, "cpu")
    assert [(v["host"], v["status"]) for v in res] == [("w1", "pass"), ("w2", "pass")]
    assert res[0]["detail"] == "2 rank(s) on the cpu accelerator"


# --------------------------------------------------------------------------- master port

# What Ansible registers: async_status of the listener (poll 0), and the loop of connections.
LISTENER_OK = {"ansible_job_id": "j123.456", "finished": 1, "started": 1, "changed": False, "rc": 0,
               "stdout": "", "stderr": "", "cmd": ["python3", "-c", "...", "29500", "20", "2"]}
LISTENER_TAKEN = dict(LISTENER_OK, rc=1,
                      stderr="port 29500 is not free: [Errno 98] Address already in use\n")
PROBES_OK = [{"item": "worker1", "ansible_loop_var": "item", "changed": False, "rc": 0, "stdout": "", "stderr": ""},
             {"item": "worker2", "ansible_loop_var": "item", "changed": False, "rc": 0, "stdout": "", "stderr": ""}]


def test_normalize_port_from_registered_results():
    probes = copy.deepcopy(PROBES_OK)
    probes[1].update(rc=1, stderr="cannot reach 10.89.0.3:29500: [Errno 111] Connection refused\n")
    res = preflight.normalize_port({"listener": LISTENER_OK, "probes": probes})
    assert res == {"listener": {"rc": 0, "msg": ""},
                   "probes": {"worker1": {"rc": 0, "msg": ""},
                              "worker2": {"rc": 1, "msg": "cannot reach 10.89.0.3:29500: [Errno 111] Connection refused"}}}
    taken = preflight.normalize_port({"listener": LISTENER_TAKEN, "probes": PROBES_OK})
    assert taken["listener"] == {"rc": 1, "msg": "port 29500 is not free: [Errno 98] Address already in use"}


@pytest.mark.parametrize("listener, rc", [({"finished": 1}, 0), ({"finished": 0}, 1), ({"finished": 1, "failed": True}, 1),
                                          ({}, 1), ({"rc": "0"}, 0)])
def test_normalize_port_listener_without_rc(listener, rc):
    assert preflight.normalize_port({"listener": listener})["listener"]["rc"] == rc


def test_normalize_port_keeps_a_dict_and_reads_msg():
    probes = {"w1": {"rc": 0, "msg": ""}}
    res = preflight.normalize_port({"listener": {"rc": 1, "msg": " boom "}, "probes": probes})
    assert res["probes"] is probes and res["listener"]["msg"] == "boom"
    unreachable = preflight.normalize_port({"probes": [{"item": "w2", "unreachable": True, "msg": "timed out"}]})
    assert unreachable["probes"] == {"w2": {"rc": 1, "msg": "timed out"}}


def test_port_verdicts():
    port = preflight.normalize_port({"listener": LISTENER_OK, "probes": PROBES_OK})
    res = preflight.port_verdicts("worker1", 29500, port["listener"], port["probes"])
    assert [(v["host"], v["status"]) for v in res] == [("worker1", "pass"), ("worker1", "pass"), ("worker2", "pass")]
    assert res[0]["detail"] == "port 29500 free on the master" and res[2]["detail"] == "reaches worker1:29500"
    bad = preflight.port_verdicts("worker1", 29500, {"rc": 0}, {"worker2": {"rc": 1, "msg": "timed out"}})
    assert bad[1]["status"] == "fail" and bad[1]["detail"] == "cannot reach worker1:29500: timed out"
    assert "open port 29500 between worker2 and worker1" in bad[1]["fix"]


def test_port_taken_fails_once_on_the_master():
    port = preflight.normalize_port({"listener": LISTENER_TAKEN, "probes": PROBES_OK})
    res = preflight.port_verdicts("worker1", 29500, port["listener"], port["probes"])
    assert len(res) == 1 and res[0]["status"] == "fail" and res[0]["host"] == "worker1"
    assert "Address already in use" in res[0]["detail"] and "ss -ltnp on worker1" in res[0]["fix"]


# --------------------------------------------------------------------------- summaries

def test_summarize_findings_and_format():
    vs = [preflight.verdict("ssh", "w1", "pass", "w1 -> w1"),
          preflight.verdict("clock", "w2", "warn", "+3 s"),
          preflight.verdict("disk", "w2", "fail", "local /opt: 1.0 GiB free", "free space"),
          preflight.verdict("names", "w3", "fail", "w1: not looked up")]
    s = preflight.summarize(vs)
    assert s["status"] == "fail" and s["failed"] == vs[2:] and s["warnings"] == [vs[1]]
    assert preflight.findings(vs) == ["disk on w2: local /opt: 1.0 GiB free. Fix: free space.",
                                      "names on w3: w1: not looked up."]
    assert preflight.summarize(vs[:2])["status"] == "pass"
    table = preflight.format_verdicts(vs).splitlines()
    assert table[0].split() == ["check", "host", "detail"] and table[3].split()[:3] == ["disk", "w2", "FAIL"]


@pytest.mark.parametrize("stdout, kib", [("unlimited", -1), ("65536", 65536), ("motd line\n8192\n", 8192),
                                         ("", None), ("garbage", None)])
def test_rank_memlock_reads_ulimit_over_ssh_for_pdsh(stdout, kib):
    ssh = {"coord": {"w1": {"rc": 0, "stdout": stdout}}}
    probes = {"w1": {"memlock": {"soft": 1024, "hard": 1024}}}
    res = preflight.rank_memlock("pdsh", ["coord"], ["w1"], probes, ssh)
    assert res == {"w1": kib if kib is not None else 1024}


def test_rank_memlock_falls_back_to_the_probe():
    probes = {"w1": {"memlock": {"soft": -1}}, "w2": {"memlock": {"soft": 64}}}
    ssh = {"coord": {"w1": {"rc": 255, "stdout": "unlimited"}}}
    assert preflight.rank_memlock("pdsh", ["coord"], ["w1", "w2"], probes, ssh) == {"w1": -1, "w2": 64}
    assert preflight.rank_memlock("ssh-free", ["coord"], ["w1", "w3"], probes,
                                  {"coord": {"w1": {"rc": 0, "stdout": "8"}}}) == {"w1": -1, "w3": None}


# --------------------------------------------------------------------------- evaluate, end to end

T0 = 1767225600.0
NODES = ["coord", "worker1", "worker2"]
ADDR = {"coord": "10.89.0.2", "worker1": "10.89.0.3", "worker2": "10.89.0.4"}
SHARED, LOCAL = "/srv/multinode-deepspeed", "/opt/multinode-deepspeed"


def ssh_ok(memlock="8192"):
    return {"rc": 0, "stdout": memlock, "stderr": "", "seconds": 0.08}


def node_probe_result(host, skew=0.0):
    """A node_probe register as the action plugin returns it."""
    return {"changed": False, "hostname": host, "user": "deepspeed",
            "controller_before": T0, "controller_after": T0 + 0.3, "time": T0 + 0.15 + skew,
            "resolved": dict((n, {"addresses": [ADDR[n]]}) for n in NODES),
            "disk": {SHARED: {"free_bytes": 50 * GIB, "total_bytes": 200 * GIB},
                     LOCAL: {"free_bytes": 40 * GIB, "total_bytes": 100 * GIB}},
            "memlock": {"soft": 8192, "hard": 8192}, "ssh": {}}


def ssh_register(targets, memlock="8192"):
    return {"changed": False, "hostname": "x", "user": "deepspeed", "resolved": {}, "disk": {},
            "memlock": {"soft": 8192, "hard": 8192}, "time": T0, "controller_before": T0, "controller_after": T0,
            "ssh": dict((t, ssh_ok(memlock)) for t in targets)}


def job_data():
    """What playbooks/preflight.yml gathers for coord + worker1 + worker2 (pdsh, cpu, tcp)."""
    versions = {"coord": dict(CPU_COORD), "worker1": dict(CPU_COORD), "worker2": dict(CPU_COORD)}
    return {
        "job": {"run_id": "preflight-20260101-000000", "backend": "pdsh", "accelerator": "cpu", "profile": "tcp",
                "coordinators": ["coord"], "rank_hosts": {"worker1": 1, "worker2": 1},
                "first_ranks": {"worker1": 0, "worker2": 1}, "world_size": 2, "master": "worker1",
                "master_addr": "10.89.0.3", "master_port": 29500,
                "run_dir": SHARED + "/runs/preflight-20260101-000000", "shared_dir": SHARED, "local_dir": LOCAL,
                "venv": LOCAL + "/venv"},
        "versions": versions,
        "probes": dict((h, node_probe_result(h)) for h in NODES),
        "ssh": {"coord": ssh_register(NODES), "worker1": ssh_register(["worker1"]),
                "worker2": ssh_register(["worker2"])},
        "port": {"listener": copy.deepcopy(LISTENER_OK), "probes": copy.deepcopy(PROBES_OK)},
        "gpus": {"worker1": 0, "worker2": 0, "worker1:status": "no nvidia-smi", "worker2:status": "no nvidia-smi"},
        "expected_addresses": dict(ADDR),
        "own_addresses": dict((h, [a]) for h, a in ADDR.items()),
        "link_gbps": {"worker1": None, "worker2": None},        # podman's veth reports no speed
        "tcp_link_gbps": {"worker1": None, "worker2": None},
        "bandwidth": {"primary": {"label": "tcp", "ok": True, "error": "", "raw": load("gloo-2node-podman.json")},
                      "fallback": None},
    }


def failures(report):
    return [(v["check"], v["host"]) for v in report["verdicts"] if v["status"] == "fail"]


def test_evaluate_names_fix_follows_each_nodes_cluster_hosts_file():
    data = job_data()
    for node in ("coord", "worker1"):
        data["probes"][node]["resolved"]["worker2"] = {"error": "Name or service not known"}
    data["hosts_file"] = {"coord": "false", "worker1": True, "worker2": "no"}
    fixes = dict((v["host"], v["fix"]) for v in preflight.evaluate(data)["verdicts"]
                 if v["check"] == "names" and v["status"] == "fail")
    assert set(fixes) == {"coord", "worker1"}
    assert fixes["coord"].startswith("cluster_hosts_file is false for coord")
    assert fixes["worker1"].startswith("run site.yml: with cluster_hosts_file: true")


def test_evaluate_healthy_cpu_job_passes():
    report = preflight.evaluate(job_data())
    assert report["status"] == "pass" and report["findings"] == [] and failures(report) == []
    statuses = dict(((v["check"], v["host"]), v["status"]) for v in report["verdicts"])
    for check in ("versions", "names", "clock", "disk"):
        for h in NODES:
            assert statuses[(check, h)] == "pass", (check, h)
    assert statuses[("memlock", "worker1")] == "skip"            # tcp pins no memory
    assert statuses[("accelerators", "worker2")] == "pass"
    assert statuses[("master_port", "worker2")] == "pass"
    assert sum(1 for v in report["verdicts"] if v["check"] == "ssh" and v["status"] == "pass") == 5
    # podman's links have no speed: the bandwidth is measured but not judged.
    assert statuses[("bandwidth", "worker1,worker2")] == "warn"
    assert len(report["warnings"]) == 1 and report["warnings"][0].startswith("bandwidth on worker1,worker2:")
    bw = report["bandwidth"]
    assert bw["primary"]["key"] == "gloo" and bw["fallback"] is None and report["advice"] is None
    assert bw["primary"]["busbw_gbps"] == preflight.large_message_busbw(
        preflight.bandwidth_rows(load("gloo-2node-podman.json")))
    tables = report["tables"]
    assert set(tables) == {"ssh", "verdicts", "bandwidth"}
    assert tables["ssh"].splitlines()[1].split() == ["coord", "ok", "ok", "ok"]
    assert tables["bandwidth"].splitlines()[0] == "all_reduce tcp (gloo, 2 ranks on 2 nodes): WARN"
    assert tables["bandwidth"].splitlines()[-1].split()[0] == "64M"
    assert len(tables["verdicts"].splitlines()) == len(report["verdicts"]) + 1
    assert report["settings"]["max_clock_skew"] == 2.0


def test_evaluate_with_a_known_link_judges_the_bandwidth():
    data = job_data()
    # CPU ranks (gloo) are judged on the tcp side's link.
    data["tcp_link_gbps"] = {"worker1": 10.0, "worker2": 25.0}
    report = preflight.evaluate(data)
    v = [v for v in report["verdicts"] if v["check"] == "bandwidth"][0]
    assert v["status"] == "pass" and report["bandwidth"]["link_gbps"] == 10.0
    assert report["bandwidth"]["primary"]["threshold_gbps"] == 0.0625
    # The link_gbps setting overrides the facts: 200 Gb/s x 5% = 1.25 GB/s is more than gloo reached.
    over = preflight.evaluate(data, {"link_gbps": 200.0})
    assert over["status"] == "fail" and failures(over) == [("bandwidth", "worker1,worker2")]
    assert "check the links between worker1, worker2" in over["findings"][0]


def test_evaluate_settings_none_keep_the_defaults():
    report = preflight.evaluate(job_data(), {"max_clock_skew": None, "min_free_gib_local": 100})
    assert report["settings"]["max_clock_skew"] == 2.0 and report["settings"]["min_free_gib_local"] == 100
    assert failures(report) == [("disk", "coord"), ("disk", "worker1"), ("disk", "worker2")]


def test_evaluate_sshd_down_on_worker1():
    data = job_data()
    refused = {"rc": 255, "stdout": "", "stderr": "ssh: connect to host worker1 port 22: Connection refused",
               "seconds": 0.01}
    data["ssh"]["coord"]["ssh"]["worker1"] = dict(refused)
    data["ssh"]["worker1"]["ssh"]["worker1"] = dict(refused)
    report = preflight.evaluate(data)
    assert report["status"] == "fail"
    assert failures(report) == [("ssh", "coord"), ("ssh", "worker1")]
    assert all("-> worker1" in f and "sshd is not running" in f for f in report["findings"])
    assert report["tables"]["ssh"].splitlines()[1].split() == ["coord", "ok", "FAIL", "ok"]


def test_evaluate_deepspeed_differs_on_worker2():
    data = job_data()
    data["versions"]["worker2"]["deepspeed"] = "0.19.7"
    report = preflight.evaluate(data)
    assert failures(report) == [("versions", "worker2")]
    assert len(report["findings"]) == 1
    assert "deepspeed 0.19.7 (worker1 has 0.19.8)" in report["findings"][0]
    assert "site.yml" in report["findings"][0]


def test_evaluate_master_port_taken_skips_the_bandwidth():
    data = job_data()
    data["port"]["listener"] = copy.deepcopy(LISTENER_TAKEN)
    data["bandwidth"] = {"primary": None, "fallback": None}     # the playbook does not run it
    report = preflight.evaluate(data)
    assert failures(report) == [("master_port", "worker1")]
    bw = [v for v in report["verdicts"] if v["check"] == "bandwidth"]
    assert len(bw) == 1 and bw[0]["status"] == "skip"
    assert bw[0]["detail"] == "not run: the master port is not free"
    assert "bandwidth" not in report["tables"] and report["bandwidth"]["primary"] is None


def test_evaluate_without_bandwidth_result_fails():
    # The port was free, so the test should have run: no result is a failure, never a silent pass.
    data = job_data()
    del data["bandwidth"]
    report = preflight.evaluate(data)
    bw = [v for v in report["verdicts"] if v["check"] == "bandwidth"][0]
    assert bw["status"] == "fail" and bw["detail"] == "the all-reduce test gave no result"
    assert report["status"] == "fail"


def test_evaluate_worker1_cannot_resolve_worker2():
    data = job_data()
    data["probes"]["worker1"]["resolved"]["worker2"] = {"error": "Name or service not known"}
    report = preflight.evaluate(data)
    assert failures(report) == [("names", "worker1")]
    assert "/etc/hosts on worker1" in report["findings"][0]


def test_evaluate_clock_skew_on_worker2():
    data = job_data()
    data["probes"]["worker2"] = node_probe_result("worker2", skew=30.0)
    report = preflight.evaluate(data)
    assert failures(report) == [("clock", "worker2")]
    assert preflight.evaluate(data, {"max_clock_skew": 60})["status"] == "pass"


@pytest.mark.parametrize("registered", [
    {"skipped": True, "changed": False, "skip_reason": "Conditional result was False", "false_condition": "x"},
    {"failed": True, "msg": "MODULE FAILURE", "changed": False},
    {"unreachable": True, "msg": "Failed to connect to the host via ssh", "changed": False},
    None,
])
def test_evaluate_unanswered_probe_is_a_probe_failure(registered):
    data = job_data()
    data["probes"]["worker2"] = registered
    report = preflight.evaluate(data)
    assert failures(report) == [("probe", "worker2")]
    assert report["findings"] == ["probe on worker2: the node did not answer the probe. "
                                  "Fix: check that Ansible reaches worker2."]
    # Its disks, clock and names are not judged (no made-up failures).
    assert not [v for v in report["verdicts"] if v["host"] == "worker2" and v["check"] in ("disk", "clock", "names")]


def test_evaluate_skipped_ssh_register_is_not_tested():
    data = job_data()
    data["ssh"]["worker2"] = {"skipped": True, "changed": False}
    report = preflight.evaluate(data)
    assert failures(report) == [("ssh", "worker2")]
    assert "worker2 gave no answer" in report["findings"][0]


def test_evaluate_accepts_ssh_as_host_target_results():
    data = job_data()
    data["ssh"] = dict((h, r["ssh"]) for h, r in data["ssh"].items())
    assert preflight.evaluate(data)["status"] == "pass"


def test_evaluate_ssh_free_needs_no_ssh():
    data = job_data()
    data["job"]["backend"] = "ssh-free"
    data["ssh"] = dict((h, {"skipped": True, "changed": False}) for h in NODES)
    report = preflight.evaluate(data)
    assert report["status"] == "pass"
    ssh = [v for v in report["verdicts"] if v["check"] == "ssh"]
    assert len(ssh) == 1 and ssh[0]["status"] == "skip"
    assert report["tables"]["ssh"] == "SSH: not needed by backend ssh-free"


def rdma_data():
    data = job_data()
    gpu = dict(STACK)
    data["job"].update(accelerator="cuda", profile="ib", rank_hosts={"worker1": 8, "worker2": 8})
    data["versions"].update(worker1=dict(gpu), worker2=dict(gpu))
    data["gpus"] = {"worker1": 8, "worker2": 8, "worker1:status": "ok", "worker2:status": "ok"}
    data["ssh"]["coord"] = ssh_register(NODES, memlock="unlimited")
    data["link_gbps"] = {"worker1": 1600.0, "worker2": 1600.0}
    data["tcp_link_gbps"] = {"worker1": 10.0, "worker2": 10.0}
    data["bandwidth"] = {
        "primary": {"label": "ib", "ok": False, "raw": None,
                    "error": "worker1: NCCL WARN Call to ibv_modify_qp failed with error Connection timed out "
                             "| worker1: torch.distributed.DistBackendError: NCCL error"},
        "fallback": dict(passing_test("tcp", 1.1, world_size=16), error=""),
    }
    return data


def test_evaluate_rdma_failure_with_tcp_working_advises_pinning_tcp():
    report = preflight.evaluate(rdma_data())
    assert report["status"] == "fail"
    assert failures(report) == [("bandwidth", "worker1,worker2")]
    advice = report["advice"]
    assert advice["variable"] == "nccl_profile" and advice["value"] == "tcp"
    assert "nccl_profile: tcp" in advice["message"] and "worker1, worker2" in advice["message"]
    bw = [v for v in report["verdicts"] if v["check"] == "bandwidth"][0]
    assert bw["fix"] == advice["message"]
    assert "Call to ibv_modify_qp failed" in bw["detail"]
    want = "bandwidth on worker1,worker2: %s. Fix: %s." % (bw["detail"].rstrip("."), advice["message"].rstrip("."))
    assert report["findings"] == [want]
    fallback = report["bandwidth"]["fallback"]
    assert fallback["status"] == "pass" and fallback["link_gbps"] == 10.0 and fallback["key"] == "tcp"
    assert report["bandwidth"]["link_gbps"] == 1600.0
    # RDMA memlock came over the coordinator's SSH login: unlimited.
    assert [v["status"] for v in report["verdicts"] if v["check"] == "memlock"] == ["pass", "pass"]
    assert report["tables"]["bandwidth"].splitlines()[0] == "all_reduce ib (nccl, 0 ranks on 2 nodes): FAIL"
    assert report["tables"]["bandwidth_tcp"].splitlines()[0] == "all_reduce tcp (fallback test): PASS"


def test_evaluate_rdma_and_tcp_both_failing_gives_no_variable():
    data = rdma_data()
    data["bandwidth"]["fallback"] = {"label": "tcp", "ok": False, "error": "worker2: exit 1", "raw": None}
    report = preflight.evaluate(data)
    assert report["advice"]["variable"] is None and "broken" in report["advice"]["message"]
    assert [v["fix"] for v in report["verdicts"] if v["check"] == "bandwidth"] == [report["advice"]["message"]]


def test_evaluate_rdma_gpu_count_and_memlock_failures():
    data = rdma_data()
    data["gpus"]["worker2"] = 4
    data["ssh"]["coord"]["ssh"]["worker1"]["stdout"] = "8192"
    report = preflight.evaluate(data)
    assert set(failures(report)) == {("bandwidth", "worker1,worker2"), ("accelerators", "worker2"),
                                     ("memlock", "worker1")}


def test_evaluate_does_not_modify_its_input():
    data = job_data()
    before = copy.deepcopy(data)
    preflight.evaluate(data, {"bandwidth_fraction": {"gloo": 0.5}})
    assert data == before
    assert preflight.DEFAULT_FRACTIONS["gloo"] == 0.05


@pytest.mark.parametrize("mutate, error", [
    (lambda d: d.pop("job"), KeyError),
    (lambda d: d["job"].pop("rank_hosts"), KeyError),
    (lambda d: d["probes"]["worker1"].update(controller_after=T0 - 1), PreflightError),
])
def test_evaluate_malformed_data_raises(mutate, error):
    data = job_data()
    mutate(data)
    with pytest.raises(error):
        preflight.evaluate(data)


# --- the review's findings, fixed ------------------------------------------------------------

def test_a_finished_test_without_results_fails_instead_of_crashing():
    test = {"label": "tcp", "ok": True, "raw": {"world_size": 2, "results": []}}
    res = preflight.judge_bandwidth(test, 2, "tcp", "gloo", 10.0)
    assert res["status"] == preflight.FAIL and "no results" in res["reason"]


def test_an_unknown_memlock_limit_is_called_unknown():
    [v] = preflight.memlock_verdicts({"gpu1": None}, "ib")
    assert v["status"] == preflight.FAIL and v["detail"].startswith("unknown,")


def test_versions_compare_with_the_first_readable_worker():
    good = {"python": "3.11.2", "torch": "2.13.0", "cuda": "none", "nccl": "none", "deepspeed": "0.19.8",
            "transformers": "5.23.0", "trainer": "0.1.0"}
    out = preflight.version_verdicts({"w1": {"error": "no venv"}, "w2": good, "w3": dict(good, deepspeed="0.1")},
                                     ["w1", "w2", "w3"], [])
    assert [(v["host"], v["status"]) for v in out] == [("w1", "fail"), ("w2", "pass"), ("w3", "fail")]
    assert "w2 has 0.19.8" in out[2]["detail"]


def test_socket_ifname_exclusion_or_list_uses_the_cluster_interface():
    fab = {"cluster_interface": "eth0",
           "interfaces": [{"name": "eth0", "speed_mbps": 100000}, {"name": "docker0", "speed_mbps": 10000}]}
    assert preflight.node_link_gbps(fab, {"profile": "tcp", "env": {"NCCL_SOCKET_IFNAME": "^docker0"}}) == 100.0
    assert preflight.node_link_gbps(fab, {"profile": "tcp", "env": {"NCCL_SOCKET_IFNAME": "eth0,docker0"}}) == 100.0
    assert preflight.node_link_gbps(fab, {"profile": "tcp", "env": {"NCCL_SOCKET_IFNAME": "=docker0"}}) == 10.0


def test_a_name_without_a_known_address_is_not_compared():
    out = preflight.name_verdicts({"a": {"b": {"addresses": ["10.0.0.2"]}}}, {"b": None}, {"b": ["10.0.0.2"]})
    assert out[0]["status"] == preflight.WARN and "unknown" in out[0]["detail"]


def test_the_tcp_retest_is_judged_on_the_ethernet_speed_not_the_rdma_override():
    primary = {"label": "ib", "ok": False, "error": "NCCL WARN Call to ibv_modify_qp failed", "raw": None}
    tcp = passing_test("tcp", 1.0)
    data = {"job": {"backend": "ssh-free", "accelerator": "cuda", "profile": "ib", "coordinators": [],
                    "rank_hosts": {"w1": 1, "w2": 1}, "master": "w1", "master_port": 29500,
                    "shared_dir": "/s", "local_dir": "/l"},
            "tcp_link_gbps": {"w1": 10.0, "w2": 10.0}, "gpus": {"w1": 1, "w2": 1},
            "bandwidth": {"primary": primary, "fallback": tcp}}
    report = preflight.evaluate(data, {"link_gbps": "400"})     # a string, as -e gives it
    assert report["bandwidth"]["link_gbps"] == 400.0
    assert report["bandwidth"]["fallback"]["link_gbps"] == 10.0
    assert report["bandwidth"]["fallback"]["status"] == "pass"


def test_versions_blame_the_odd_node_out_even_when_it_is_the_first():
    odd = dict(STACK, deepspeed="0.19.7")
    res = by_host(preflight.version_verdicts({"w1": odd, "w2": STACK, "w3": STACK}, ["w1", "w2", "w3"], []))
    assert [res[h]["status"] for h in ("w1", "w2", "w3")] == ["fail", "pass", "pass"]
    assert res["w1"]["detail"] == "differs: deepspeed 0.19.7 (w2, w3 have 0.19.8)"


def test_clock_skew_is_judged_between_the_nodes_not_against_the_controller():
    # Every node 30 s ahead of the controller, in step with each other: the job is fine.
    probes = dict((h, probe_at(1030.1, 1000.0, 1000.2)) for h in ("w1", "w2", "w3"))
    res = preflight.clock_verdicts(probes, 2.0)
    assert [v["status"] for v in res] == ["warn"] * 3 and "controller's clock is off" in res[0]["detail"]
    # One node 5 s off the other two: only it fails.
    probes["w2"] = probe_at(1035.1, 1000.0, 1000.2)
    res = by_host(preflight.clock_verdicts(probes, 2.0))
    assert res["w2"]["status"] == "fail" and res["w1"]["status"] != "fail" and res["w3"]["status"] != "fail"


def test_settings_given_as_strings_are_numbers():
    data = job_data()
    data["tcp_link_gbps"] = {"worker1": 10.0, "worker2": 10.0}
    report = preflight.evaluate(data, {"max_clock_skew": "3", "bandwidth_fraction": {"gloo": "0.9"}})
    assert report["settings"]["max_clock_skew"] == 3.0
    assert report["bandwidth"]["primary"]["fraction"] == 0.9 and report["bandwidth"]["primary"]["status"] == "fail"


def test_cpu_ranks_on_rdma_nodes_are_judged_as_tcp():
    data = job_data()
    data["job"]["profile"] = "ib"
    data["link_gbps"] = {"worker1": 800.0, "worker2": 800.0}
    data["tcp_link_gbps"] = {"worker1": 10.0, "worker2": 10.0}
    report = preflight.evaluate(data)
    assert report["bandwidth"]["link_gbps"] == 10.0
    assert all(v["status"] == "skip" for v in report["verdicts"] if v["check"] == "memlock")


def test_no_fabric_advice_when_other_checks_fail():
    primary = {"label": "ib", "ok": False, "error": "NCCL WARN Call to ibv_modify_qp failed", "raw": None}
    data = {"job": {"backend": "ssh-free", "accelerator": "cuda", "profile": "ib", "coordinators": [],
                    "rank_hosts": {"w1": 1, "w2": 1}, "master": "w1", "master_port": 29500,
                    "shared_dir": "/s", "local_dir": "/l"},
            "tcp_link_gbps": {"w1": 10.0, "w2": 10.0}, "gpus": {"w1": 1, "w2": 1},
            "bandwidth": {"primary": primary, "fallback": passing_test("tcp", 1.0)}}
    report = preflight.evaluate(data)       # no probes: the probe checks fail
    assert report["advice"] is None
