"""Preflight's bandwidth (module_utils/preflight/bandwidth.py): the arithmetic on real all-reduce results,
judge_bandwidth, the fallback to tcp, link speeds from the real sysfs fixtures, and the bandwidth verdict."""
import copy

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.provision import nccl

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.bandwidth import (
    DEFAULT_FRACTIONS, bandwidth_rows, bandwidth_verdict, bus_factor, fabric_advice, fallback_advice,
    format_bandwidth_table, human_bytes, job_link_gbps, judge_bandwidth, large_message_busbw, needs_fallback_test,
    node_link_gbps)
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.verdicts import FAIL, PreflightError, verdict

from tests.unit.plugins.module_utils.preflight.preflight_data import KIB, MIB, GIB, load, raw_of, passing_test
from tests.unit.plugins.module_utils.sysfs_facts import facts


# --------------------------------------------------------------------------- bandwidth arithmetic

@pytest.mark.parametrize("ranks, factor", [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75), ("16", 1.875)])
def test_bus_factor(ranks, factor):
    assert bus_factor(ranks) == pytest.approx(factor)


@pytest.mark.parametrize("ranks", [0, -2])
def test_bus_factor_needs_a_rank(ranks):
    with pytest.raises(PreflightError, match="at least one rank"):
        bus_factor(ranks)


def test_bandwidth_rows_exact_numbers():
    raw = {"world_size": 4, "results": [
        {"bytes": 4096, "count": 1024, "iters": 50, "seconds": 4.096e-6},     # 1 GB/s
        {"bytes": 1000000000, "iters": 3, "seconds": 0.5},                     # 2 GB/s, no count
        {"bytes": 3000000, "count": 750000, "iters": 7, "seconds": 0.004},     # 0.75 GB/s
    ]}
    rows = bandwidth_rows(raw)
    assert rows == [
        {"bytes": 4096, "count": 1024, "iters": 50, "time_us": 4.1, "algbw_gbps": 1.0, "busbw_gbps": 1.5},
        {"bytes": 1000000000, "count": 250000000, "iters": 3, "time_us": 500000.0, "algbw_gbps": 2.0,
         "busbw_gbps": 3.0},
        {"bytes": 3000000, "count": 750000, "iters": 7, "time_us": 4000.0, "algbw_gbps": 0.75,
         "busbw_gbps": 1.125},
    ]


def test_bandwidth_rows_rounds_to_four_decimals():
    rows = bandwidth_rows(raw_of(3, [(1000000, 0.003)]))   # algbw 0.3333.., busbw x 4/3
    assert rows[0]["algbw_gbps"] == 0.3333 and rows[0]["busbw_gbps"] == 0.4444


def test_bandwidth_rows_without_results_is_empty():
    assert bandwidth_rows({"world_size": 2}) == []
    assert bandwidth_rows({"world_size": 2, "results": None}) == []


@pytest.mark.parametrize("secs", [0, 0.0, -1e-6])
def test_bandwidth_rows_non_positive_time_raises(secs):
    with pytest.raises(PreflightError, match="non-positive time .* for 4096 bytes"):
        bandwidth_rows(raw_of(2, [(8192, 0.001), (4096, secs)]))


def test_bandwidth_rows_bad_world_size_raises():
    with pytest.raises(PreflightError):
        bandwidth_rows(raw_of(0, [(4096, 0.001)]))


def row(nbytes, busbw):
    return {"bytes": nbytes, "busbw_gbps": busbw}


def test_large_message_busbw_is_the_best_of_the_top_quarter():
    rows = [row(1 * MIB, 9.0), row(8 * MIB, 8.0), row(16 * MIB, 5.0), row(32 * MIB, 3.0), row(64 * MIB, 4.0)]
    # 1 MiB and 8 MiB are faster but smaller than a quarter of 64 MiB; 16 MiB is exactly a quarter.
    assert large_message_busbw(rows) == 5.0
    assert large_message_busbw(rows[:-1]) == 8.0   # largest 32 MiB: 8 MiB counts now
    assert large_message_busbw([row(4096, 0.25)]) == 0.25
    assert large_message_busbw([]) is None


@pytest.mark.parametrize("n, text", [(0, "0B"), (512, "512B"), (1536, "1536B"), (4096, "4K"), (MIB, "1M"),
                                     (3 * MIB, "3M"), (64 * MIB, "64M"), (GIB, "1G"), (GIB + KIB, "1048577K"),
                                     (MIB + 1, "1048577B")])
def test_human_bytes(n, text):
    assert human_bytes(n) == text


def test_format_bandwidth_table():
    rows = bandwidth_rows(raw_of(4, [(4096, 4.096e-6), (64 * MIB, 0.05)]))
    text = format_bandwidth_table(rows, "all_reduce tcp: PASS")
    lines = text.splitlines()
    assert lines[0] == "all_reduce tcp: PASS"
    assert lines[1].split() == ["size", "count", "iters", "time(us)", "algbw(GB/s)", "busbw(GB/s)"]
    assert lines[2] == "%10s %12d %6s %12.1f %12.3f %12.3f" % ("4K", 1024, 10, 4.1, 1.0, 1.5)
    assert lines[3].split() == ["64M", "16777216", "10", "50000.0", "1.342", "2.013"]
    assert len(lines) == 4
    # Without a title the header comes first.
    assert format_bandwidth_table(rows).splitlines()[0] == lines[1]
    assert format_bandwidth_table([]) == lines[1]


def test_a_finished_test_without_results_fails_instead_of_crashing():
    test = {"label": "tcp", "ok": True, "raw": {"world_size": 2, "results": []}}
    res = judge_bandwidth(test, 2, "tcp", "gloo", 10.0)
    assert res["status"] == FAIL and "no results" in res["reason"]


# --------------------------------------------------------------------------- the real results

SIZES_64M = [4 * KIB << i for i in range(15)]     # 4 KiB .. 64 MiB, doubling


@pytest.mark.parametrize("name", ["gloo-2node-podman.json", "h100-nccl-1rank.json", "h100-host-gloo-2rank.json"])
def test_real_results_rows_match_an_independent_computation(name):
    raw = load(name)
    rows = bandwidth_rows(raw)
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
    rows = bandwidth_rows(raw)
    assert [r["bytes"] for r in rows] == SIZES_64M
    assert all(r["busbw_gbps"] == r["algbw_gbps"] for r in rows)     # 2 ranks: factor 1
    best = max(res["bytes"] / res["seconds"] / 1e9 for res in raw["results"] if res["bytes"] >= 16 * MIB)
    assert large_message_busbw(rows) == round(best, 4)
    assert 1.0 < large_message_busbw(rows) < 1.1           # ~1.05 GB/s measured
    # Judged as gloo across two nodes: fine on a 10 Gb/s link, below 5% of a 200 Gb/s one.
    test = {"label": raw["label"], "ok": True, "raw": raw}
    assert judge_bandwidth(test, 2, "tcp", "gloo", 10.0)["status"] == "pass"
    low = judge_bandwidth(test, 2, "tcp", "gloo", 200.0)
    assert low["status"] == "fail" and low["threshold_gbps"] == 1.25


def test_nccl_on_one_h100_rank_crosses_no_link():
    raw = load("h100-nccl-1rank.json")
    rows = bandwidth_rows(raw)
    assert raw["world_size"] == 1
    assert [r["bytes"] for r in rows] == [4 * KIB << i for i in range(17)]    # .. 256 MiB
    assert all(r["busbw_gbps"] == 0 for r in rows)
    assert all(r["algbw_gbps"] > 0 for r in rows)
    assert rows[-1]["algbw_gbps"] > 1000          # in-GPU: TB/s territory, nothing crossed a link
    assert large_message_busbw(rows) == 0
    judged = judge_bandwidth({"label": "tcp", "ok": True, "raw": raw}, 1, "tcp", "nccl", 100.0)
    assert judged["status"] == "pass" and judged["threshold_gbps"] is None and judged["busbw_gbps"] == 0
    assert "one rank node" in judged["reason"]


def test_gloo_two_ranks_on_one_h100_host():
    raw = load("h100-host-gloo-2rank.json")
    rows = bandwidth_rows(raw)
    assert raw["world_size"] == 2 and raw["nodes"] == 1
    assert [r["bytes"] for r in rows] == SIZES_64M
    assert all(r["busbw_gbps"] == r["algbw_gbps"] for r in rows)
    by_size = dict((r["bytes"], r["busbw_gbps"]) for r in rows)
    # The real data peaks at 16 MiB, exactly a quarter of the largest size: it is still counted.
    assert by_size[16 * MIB] > by_size[32 * MIB] > by_size[64 * MIB]
    assert large_message_busbw(rows) == by_size[16 * MIB]
    # Bigger messages move faster than the smallest one on this host.
    assert by_size[64 * MIB] > 50 * by_size[4096]


# --------------------------------------------------------------------------- judge_bandwidth

def test_judge_pass_above_threshold():
    res = judge_bandwidth(passing_test("tcp", 1.0), 2, "tcp", "nccl", 10.0)
    assert res["status"] == "pass"
    assert res["threshold_gbps"] == 0.375           # 10 Gb/s / 8 x 0.3
    assert res["busbw_gbps"] == 1.0 and res["fraction"] == 0.3 and res["key"] == "tcp"
    assert res["link_gbps"] == 10.0 and res["label"] == "tcp" and len(res["rows"]) == 1
    assert res["reason"] == "bus bandwidth 1.000 GB/s >= 0.375 GB/s (0.3 of 10 Gb/s, tcp)"


def test_judge_fail_below_threshold():
    res = judge_bandwidth(passing_test("ib", 20.0), 2, "ib", "nccl", 400.0)
    assert res["status"] == "fail" and res["threshold_gbps"] == 25.0    # 400 / 8 x 0.5
    assert res["reason"] == "bus bandwidth 20.000 GB/s < 25.000 GB/s (0.5 of the 400 Gb/s link, ib)"


def test_judge_exactly_at_threshold_passes():
    res = judge_bandwidth(passing_test("roce", 20.0), 2, "roce", "nccl", 400.0)   # 400/8*0.4 = 20
    assert res["threshold_gbps"] == 20.0 and res["status"] == "pass"


def test_judge_one_node_passes_without_threshold():
    res = judge_bandwidth(passing_test("ib", 0.001), 1, "ib", "nccl", 400.0)
    assert res["status"] == "pass" and res["threshold_gbps"] is None
    assert res["busbw_gbps"] == 0.001


def test_judge_unknown_link_warns():
    res = judge_bandwidth(passing_test("tcp", 0.001), 2, "tcp", "gloo", None)
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
    res = judge_bandwidth(test, 2, "ib", "nccl", 400.0)
    assert res["status"] == "fail"
    assert res["reason"] == "the all-reduce test did not finish: %s" % why
    assert res["rows"] == [] and res["busbw_gbps"] is None and res["threshold_gbps"] is None


def test_judge_gloo_uses_the_gloo_fraction():
    test = passing_test("tcp", 0.1)
    gloo = judge_bandwidth(test, 2, "tcp", "gloo", 10.0)
    assert gloo["key"] == "gloo" and gloo["fraction"] == 0.05
    assert gloo["threshold_gbps"] == 0.0625 and gloo["status"] == "pass"
    # The same numbers on NCCL's tcp profile need 0.375 GB/s.
    assert judge_bandwidth(test, 2, "tcp", "nccl", 10.0)["status"] == "fail"


def test_judge_custom_fractions_override_only_their_keys():
    test = passing_test("tcp", 1.0)
    res = judge_bandwidth(test, 2, "tcp", "nccl", 10.0, {"tcp": 0.9})
    assert res["fraction"] == 0.9 and res["threshold_gbps"] == 1.125 and res["status"] == "fail"
    # Other keys keep their defaults, and the defaults are not modified.
    ib = judge_bandwidth(passing_test("ib", 30.0), 2, "ib", "nccl", 400.0, {"tcp": 0.9})
    assert ib["fraction"] == 0.5 and ib["status"] == "pass"
    assert DEFAULT_FRACTIONS == {"ib": 0.5, "roce": 0.4, "tcp": 0.3, "gloo": 0.05}


def test_judge_without_a_fraction_for_the_key_warns():
    res = judge_bandwidth(passing_test("tcp", 1.0), 2, "tcp", "nccl", 10.0, {"tcp": None})
    assert res["status"] == "warn" and "no key tcp" in res["reason"]


# --------------------------------------------------------------------------- fallback to tcp

def failed_rdma(profile="ib"):
    return judge_bandwidth({"label": profile, "ok": False, "raw": None,
                            "error": "worker1: NCCL WARN Call to ibv_modify_qp failed"},
                           2, profile, "nccl", 400.0)


def tcp_judged(busbw, link=10.0):
    return judge_bandwidth(passing_test("tcp", busbw), 2, "tcp", "nccl", link)


@pytest.mark.parametrize("profile, backend, status, expected", [
    ("ib", "nccl", "fail", True), ("roce", "nccl", "fail", True),
    ("tcp", "nccl", "fail", False), ("ib", "gloo", "fail", False),
    ("ib", "nccl", "pass", False), ("roce", "nccl", "warn", False),
])
def test_needs_fallback_test(profile, backend, status, expected):
    assert needs_fallback_test(profile, backend, {"status": status}) is expected


@pytest.mark.parametrize("profile", ["ib", "roce"])
def test_rdma_failing_to_init_with_tcp_working_pins_tcp(profile):
    primary, tcp = failed_rdma(profile), tcp_judged(1.0)
    assert primary["status"] == "fail" and tcp["status"] == "pass"
    advice = fallback_advice(profile, primary, tcp, ["worker1", "worker2"])
    assert advice["variable"] == "nccl_profile" and advice["value"] == "tcp"
    msg = advice["message"]
    assert "NCCL's %s profile fails to initialise" % profile in msg
    assert "on worker1, worker2" in msg and "nccl_profile: tcp" in msg
    assert "ibv_modify_qp" in msg and "site.yml" in msg and tcp["reason"] in msg


def test_rdma_far_below_threshold_and_slower_than_tcp_pins_tcp():
    primary = judge_bandwidth(passing_test("ib", 0.5), 2, "ib", "nccl", 400.0)
    advice = fallback_advice("ib", primary, tcp_judged(1.0), ["w1", "w2"])
    assert advice["variable"] == "nccl_profile" and advice["value"] == "tcp"
    assert "runs at 0.500 GB/s, far below its threshold" in advice["message"]


def test_rdma_below_threshold_but_faster_than_tcp_does_not_pin():
    primary = judge_bandwidth(passing_test("ib", 10.0), 2, "ib", "nccl", 400.0)
    tcp = tcp_judged(1.0)
    assert primary["status"] == "fail" and tcp["status"] == "pass"
    advice = fallback_advice("ib", primary, tcp, ["w1", "w2"])
    assert advice["variable"] is None and advice["value"] is None
    assert "TCP is slower still (1.000 GB/s)" in advice["message"] and "keep ib" in advice["message"]


def test_tcp_failing_too_means_the_network_is_broken():
    tcp = tcp_judged(0.01)
    assert tcp["status"] == "fail"
    advice = fallback_advice("roce", failed_rdma("roce"), tcp, ["w1", "w2"])
    assert advice["variable"] is None and advice["value"] is None
    assert "broken" in advice["message"] and "between w1, w2" in advice["message"]
    assert "fix the network first" in advice["message"]


def test_no_advice_when_not_needed():
    tcp = tcp_judged(1.0)
    assert fallback_advice("tcp", failed_rdma(), tcp, ["w1"]) is None
    passed = judge_bandwidth(passing_test("ib", 300.0), 2, "ib", "nccl", 400.0)
    assert passed["status"] == "pass"
    assert fallback_advice("ib", passed, tcp, ["w1"]) is None
    assert fallback_advice("ib", failed_rdma(), None, ["w1"]) is None
    assert fallback_advice("ib", None, tcp, ["w1"]) is None


# --------------------------------------------------------------------------- link speeds from the facts

def test_link_of_the_4_port_infiniband_node_is_the_sum_of_its_ports():
    f = facts("ib-mlx5-4port")
    node = nccl.node_profile(f, host="gpu1")
    assert node["profile"] == "ib" and len(node["rdma_ports"]) == 4
    assert node_link_gbps(f, node) == 1600.0        # 4 x 400 Gb/s NDR
    # Only the ports the profile uses count.
    assert node_link_gbps(f, dict(node, rdma_ports=["mlx5_0:1", "mlx5_2:1"])) == 800.0


def test_link_of_the_roce_node():
    f = facts("roce")
    node = nccl.node_profile(f, host="r1")
    assert node["profile"] == "roce"
    assert node_link_gbps(f, node) == 400.0         # 2 x 200 Gb/s


def test_link_of_an_rdma_port_with_unknown_rate_is_unknown():
    f = copy.deepcopy(facts("roce"))
    node = nccl.node_profile(f, host="r1")
    f["rdma"][1]["ports"][0]["rate_gbps"] = None
    assert node_link_gbps(f, node) is None
    assert node_link_gbps(facts("roce"), dict(node, rdma_ports=["mlx5_9:1"])) is None


def test_link_of_the_ethernet_only_node_is_its_cluster_interface():
    f = facts("ethernet-only")
    node = nccl.node_profile(f, host="jw2")
    assert node["env"]["NCCL_SOCKET_IFNAME"] == "=eno1"
    assert node_link_gbps(f, node) == 1.0           # eno1/speed: 1000 (Mb/s)
    # docker0's sysfs speed is -1 (no speed): unknown.
    docker = nccl.node_profile(f, host="jw2", socket_ifname="docker0")
    assert node_link_gbps(f, docker) is None


def test_link_of_tcp_nodes_with_and_without_rdma_hardware():
    assert node_link_gbps(facts("ib-down"), nccl.node_profile(facts("ib-down"), host="w3")) == 25.0
    ib = facts("ib-mlx5-4port")
    assert node_link_gbps(ib, nccl.node_profile(ib, host="g", requested="tcp")) == 10.0    # eno1
    # eno2 is DOWN and its sysfs speed is -1.
    assert node_link_gbps(ib, nccl.node_profile(ib, host="g", requested="tcp",
                                                socket_ifname="eno2")) is None


def test_link_of_tcp_without_env_uses_the_cluster_interface():
    assert node_link_gbps(facts("roce"), {"profile": "tcp"}) == 200.0        # ens1f0np0
    assert node_link_gbps({"interfaces": [], "cluster_interface": "eth0", "cluster_speed_mbps": 25000},
                          {"profile": "tcp", "env": {}}) == 25.0
    assert node_link_gbps({"interfaces": [], "cluster_interface": None}, {"profile": "tcp"}) is None


def test_job_link_is_the_slowest_node_or_unknown():
    ib, roce = facts("ib-mlx5-4port"), facts("roce")
    speeds = {"gpu1": node_link_gbps(ib, nccl.node_profile(ib, host="gpu1")),
              "r1": node_link_gbps(roce, nccl.node_profile(roce, host="r1"))}
    assert job_link_gbps(speeds) == 400.0
    assert job_link_gbps(dict(speeds, jw2=1.0)) == 1.0
    assert job_link_gbps(dict(speeds, jw2=None)) is None
    assert job_link_gbps({}) is None


def test_socket_ifname_exclusion_or_list_uses_the_cluster_interface():
    fab = {"cluster_interface": "eth0",
           "interfaces": [{"name": "eth0", "speed_mbps": 100000}, {"name": "docker0", "speed_mbps": 10000}]}
    assert node_link_gbps(fab, {"profile": "tcp", "env": {"NCCL_SOCKET_IFNAME": "^docker0"}}) == 100.0
    assert node_link_gbps(fab, {"profile": "tcp", "env": {"NCCL_SOCKET_IFNAME": "eth0,docker0"}}) == 100.0
    assert node_link_gbps(fab, {"profile": "tcp", "env": {"NCCL_SOCKET_IFNAME": "=docker0"}}) == 10.0


# --------------------------------------------------------------------------- the bandwidth verdict, the advice

def test_bandwidth_verdict_of_a_judged_test():
    judged = judge_bandwidth(passing_test("tcp", 1.0), 2, "tcp", "nccl", 10.0)
    assert bandwidth_verdict(judged, ["w1", "w2"], {}, True) == {
        "check": "bandwidth", "host": "w1,w2", "status": "pass", "detail": "tcp: " + judged["reason"], "fix": None}
    low = judge_bandwidth(passing_test("tcp", 0.1), 2, "tcp", "nccl", 10.0)
    v = bandwidth_verdict(low, ["w1", "w2"], {}, True)
    assert v["status"] == "fail" and v["fix"] == "see the bandwidth table; check the links between w1, w2"


def test_bandwidth_verdict_says_why_no_test_ran():
    busy = {"listener": {"rc": 1, "msg": "in use"}, "probes": {}}
    free = {"listener": {"rc": 0, "msg": ""}, "probes": {}}
    taken = bandwidth_verdict(None, ["w1"], busy, True)
    assert (taken["status"], taken["detail"]) == ("skip", "not run: the master port is not free")
    # The busy port is named first, even with the test turned off.
    assert bandwidth_verdict(None, ["w1"], busy, False)["detail"] == "not run: the master port is not free"
    off = bandwidth_verdict(None, ["w1"], free, False)
    assert (off["status"], off["detail"]) == ("skip", "not run (preflight_bandwidth=false)")
    for port in (free, {}):
        missing = bandwidth_verdict(None, ["w1", "w2"], port, True)
        assert missing["status"] == "fail" and missing["detail"] == "the all-reduce test gave no result"
        assert missing["fix"] == "see the play's output above for the node that failed"


def test_fabric_advice_only_when_nothing_but_the_bandwidth_failed():
    primary, tcp = failed_rdma(), tcp_judged(1.0)
    bw = verdict("bandwidth", "w1,w2", "fail", "ib: did not finish")
    advice = fabric_advice([bw], "ib", primary, tcp, ["w1", "w2"])
    assert advice == fallback_advice("ib", primary, tcp, ["w1", "w2"]) and advice["value"] == "tcp"
    # A warning elsewhere keeps it; a failure elsewhere breaks both tests alike; no tcp retest, no advice.
    clock = verdict("clock", "w2", "warn", "+3 s")
    assert fabric_advice([bw, clock], "ib", primary, tcp, ["w1", "w2"]) == advice
    gpus = verdict("accelerators", "w2", "fail", "no GPU")
    assert fabric_advice([bw, gpus], "ib", primary, tcp, ["w1", "w2"]) is None
    assert fabric_advice([bw], "ib", primary, None, ["w1", "w2"]) is None
