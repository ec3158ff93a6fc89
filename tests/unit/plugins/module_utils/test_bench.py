"""Benchmark aggregation, scaling efficiency, regression flag and comparison (issue 6)."""
import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils import bench
from ansible_collections.multinode.deepspeed.plugins.module_utils.bench import BenchError


def slot(host, index, samples=10, prompt=400, gen=160, wall=2.0, prefill=0.5, decode=1.5, lat=None, local=0):
    return {"host": host, "slot": index, "local_slot": local, "engine": "transformers", "device": "cpu",
            "samples": samples, "prompt_tokens": prompt, "generated_tokens": gen, "wall_s": wall,
            "prefill_s": prefill, "decode_s": decode, "latencies_s": lat if lat is not None else [0.2] * samples}


def test_slot_rates():
    r = bench.slot_rates(slot("w1", 0))
    assert r == {"samples_per_s": 5.0, "tokens_per_s": 280.0, "prompt_tokens_per_s": 800.0,
                 "generation_tokens_per_s": 160.0 / 1.5}


@pytest.mark.parametrize("key, value", [("wall_s", 0), ("wall_s", None), ("prefill_s", -1), ("decode_s", "x")])
def test_slot_rates_refuse_bad_times(key, value):
    s = slot("w1", 0)
    s[key] = value
    with pytest.raises(BenchError, match=key):
        bench.slot_rates(s)


def test_totals_are_the_sum_of_the_nodes_and_the_nodes_of_their_slots():
    slots = [slot("w1", 0, wall=2.0), slot("w1", 1, wall=4.0, local=1), slot("w2", 2, wall=2.5)]
    agg = bench.aggregate(slots)
    assert agg["nodes"]["w1"]["samples_per_s"] == pytest.approx(5.0 + 2.5)
    assert agg["nodes"]["w2"]["samples_per_s"] == pytest.approx(4.0)
    for key in bench.RATE_KEYS + bench.COUNT_KEYS:
        assert agg["total"][key] == pytest.approx(sum(n[key] for n in agg["nodes"].values()))
    assert agg["total"]["samples"] == 30 and agg["total"]["slots"] == 3 and agg["total"]["nodes"] == 2
    assert [r["slot"] for r in agg["slots"]] == [0, 1, 2]


def test_scaling_efficiency_is_total_over_slots_times_single():
    single = slot("w1", 0, samples=20, wall=4.0)          # 5 samples/s alone
    slots = [slot("w1", 0, wall=2.5), slot("w2", 1, wall=2.5)]  # 4 samples/s each
    agg = bench.aggregate(slots, single)
    assert agg["single"]["samples_per_s"] == 5.0
    assert agg["scaling_efficiency"] == pytest.approx(8.0 / (2 * 5.0))


def test_no_single_run_means_no_efficiency():
    assert bench.aggregate([slot("w1", 0)])["scaling_efficiency"] is None


def test_latency_percentiles_over_every_sample():
    lat = [0.1 * i for i in range(1, 11)]
    agg = bench.aggregate([slot("w1", 0, lat=lat[:5], samples=5), slot("w2", 1, lat=lat[5:], samples=5)])
    assert agg["latency"]["latency_p50_s"] == pytest.approx(0.5)
    assert agg["latency"]["latency_p90_s"] == pytest.approx(0.9)
    assert agg["latency"]["latency_p99_s"] == pytest.approx(1.0)
    assert agg["latency"]["samples"] == 10


def test_percentile_edges():
    assert bench.percentile([], 50) is None
    assert bench.percentile([3.0], 99) == 3.0
    assert bench.percentile([1, 2, 3, 4], 0) == 1
    with pytest.raises(BenchError):
        bench.percentile([1], 101)


def test_aggregate_refuses_empty_and_duplicates():
    with pytest.raises(BenchError, match="no slot"):
        bench.aggregate([])
    with pytest.raises(BenchError, match="twice"):
        bench.aggregate([slot("w1", 0), slot("w2", 0)])


def entry(run_id, sps, p90=1.0, eff=0.9):
    return {"run_id": run_id, "metrics": {"samples_per_s": sps, "tokens_per_s": sps * 50, "prompt_tokens_per_s": 100.0,
                                          "generation_tokens_per_s": 20.0, "latency_p50_s": 0.5,
                                          "latency_p90_s": p90, "latency_p99_s": 2.0, "scaling_efficiency": eff}}


def flagged(rows):
    return sorted(r["metric"] for r in rows if r["flagged"])


def test_a_drop_larger_than_the_threshold_against_the_median_is_flagged():
    history = [entry("a", 10.0), entry("b", 12.0), entry("c", 100.0)]  # median 12, the outlier does not count
    rows = bench.regressions(history, entry("d", 10.5)["metrics"], threshold_pct=10)
    row = next(r for r in rows if r["metric"] == "samples_per_s")
    assert row["median"] == 12.0 and row["runs"] == 3
    assert row["change_pct"] == pytest.approx(-12.5)
    assert flagged(rows) == ["samples_per_s", "tokens_per_s"]


def test_a_drop_within_the_threshold_is_not_flagged():
    rows = bench.regressions([entry("a", 10.0)], entry("b", 9.5)["metrics"], threshold_pct=10)
    assert flagged(rows) == []


def test_latency_is_worse_when_it_grows():
    rows = bench.regressions([entry("a", 10.0, p90=1.0)], entry("b", 10.0, p90=1.2)["metrics"], threshold_pct=10)
    assert flagged(rows) == ["latency_p90_s"]
    rows = bench.regressions([entry("a", 10.0, p90=1.0)], entry("b", 10.0, p90=0.5)["metrics"], threshold_pct=10)
    assert flagged(rows) == []


def test_no_history_flags_nothing():
    rows = bench.regressions([], entry("a", 1.0)["metrics"])
    assert flagged(rows) == [] and all(r["median"] is None for r in rows)


def test_median():
    assert bench.median([3, 1, 2]) == 2 and bench.median([4, 1, 2, 3]) == 2.5 and bench.median([]) is None


def test_compare_side_by_side():
    rows = bench.compare(entry("a", 10.0)["metrics"], entry("b", 12.0, p90=1.5)["metrics"])
    by = {r["metric"]: r for r in rows}
    assert by["samples_per_s"]["change_pct"] == pytest.approx(20.0) and by["samples_per_s"]["better"] is True
    assert by["latency_p90_s"]["change_pct"] == pytest.approx(50.0) and by["latency_p90_s"]["better"] is False
    assert by["latency_p50_s"]["better"] is None
    text = bench.format_compare(rows, "run-a", "run-b")
    assert "samples_per_s" in text and "+20.0% better" in text and "+50.0% worse" in text


def test_history_text_names_the_regression():
    history = [entry("a", 10.0), entry("b", 10.0)]
    rows = bench.regressions(history, entry("c", 5.0)["metrics"], 10)
    text = bench.format_history(history + [entry("c", 5.0)], rows)
    assert "REGRESSION samples_per_s: 5 vs median 10 of 2 run(s) (-50.0%)" in text
    assert "no regression" in bench.format_history(history, bench.regressions(history[:1], history[1]["metrics"]))
