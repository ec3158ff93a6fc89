"""Benchmark aggregation, scaling efficiency, regression flag and comparison (issue 6)."""
import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.bench import core as bench
from ansible_collections.multinode.deepspeed.plugins.module_utils.bench.core import BenchError


def slot(host, index, samples=10, prompt=400, gen=160, wall=2.0, prefill=0.5, decode=1.5, lat=None, local=0):
    return {"host": host, "slot": index, "local_slot": local, "engine": "transformers", "device": "cpu",
            "samples": samples, "prompt_tokens": prompt, "generated_tokens": gen, "wall_s": wall,
            "prefill_s": prefill, "decode_s": decode, "latencies_s": lat if lat is not None else [0.2] * samples}


def test_slot_rates():
    r = bench.slot_rates(slot("w1", 0))
    assert r == {"samples_per_s": 5.0, "tokens_per_s": 280.0, "prompt_tokens_per_s": 800.0,
                 "generation_tokens_per_s": 160.0 / 1.5}


def test_generation_rate_counts_the_tokens_of_the_decode_time():
    s = dict(slot("w1", 0), decode_tokens=150)      # 10 samples x 16 tokens, the first of each from the prefill
    assert bench.slot_rates(s)["generation_tokens_per_s"] == pytest.approx(150 / 1.5)
    assert bench.slot_rates(s)["tokens_per_s"] == pytest.approx((400 + 160) / 2.0)
    one = dict(slot("w1", 0, gen=10, decode=0.0), decode_tokens=0)   # max_new_tokens=1: no decode step
    assert bench.slot_rates(one)["generation_tokens_per_s"] == 0.0


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


def test_end_to_end_rate_is_set_by_the_slowest_slot():
    # 3 samples over 2 slots, 1 s each: slot 0 has two (ends at 2 s), slot 1 one (ends at 1 s).
    a = dict(slot("w1", 0, samples=2, wall=2.0), started=100.0, finished=102.0)
    b = dict(slot("w2", 1, samples=1, wall=1.0), started=100.0, finished=101.0)
    single = slot("w1", 0, samples=3, wall=3.0)
    agg = bench.aggregate([a, b], single)
    assert agg["total"]["samples_per_s"] == pytest.approx(2.0) and agg["scaling_efficiency"] == pytest.approx(1.0)
    assert agg["total"]["elapsed_s"] == pytest.approx(2.0)
    assert agg["total"]["samples_per_s_end_to_end"] == pytest.approx(1.5)
    assert agg["scaling_efficiency_end_to_end"] == pytest.approx(0.75)
    assert "End to end: 3 samples in 2 s" in bench.markdown({"run_id": "x", "status": "success", "aggregate": agg})
    assert bench.aggregate([slot("w1", 0)])["total"]["elapsed_s"] is None      # results without start/end


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
    history = [entry("a", 10.0), entry("b", 10.0), entry("c", 5.0)]
    text = bench.format_history(history, 10)
    assert "REGRESSION samples_per_s: 5 vs median 10 of 2 previous run(s) (-50.0%, threshold 10%)" in text
    assert "DROP: samples_per_s -50.0%" in text
    assert "samples_per_s            10 -> 10 -> 5 samples/s" in text
    ok = bench.format_history(history[:2], 10)
    assert "no drop of more than 10% against the median of the 1 previous run(s)" in ok and "REGRESSION" not in ok
    assert "first run with its settings" in bench.format_history(history[:1])
    assert "nothing to compare" in bench.format_history(history[:1])
    assert "no successful run yet" in bench.format_history([])


def test_trend_judges_every_run_against_the_runs_before_it():
    history = [entry("a", 10.0), entry("b", 20.0), {"run_id": "x", "status": "failed", "metrics": {}},
               entry("c", 14.0), entry("d", 13.0)]
    rows = bench.trend(history, 10)
    assert [r["run_id"] for r in rows] == ["a", "b", "c", "d"]          # the failed run has no figures
    assert [r["previous"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["flagged"] == [] and rows[1]["flagged"] == []        # 20 vs 10: better
    assert rows[2]["flagged"] == []                                     # 14 vs median 15: -6.7 %
    assert rows[3]["flagged"] == []                                     # 13 vs median 14: -7.1 %
    assert bench.trend(history, 5)[3]["flagged"] == ["samples_per_s", "tokens_per_s"]
    assert bench.trend(history, 7.5)[3]["flagged"] == []


def test_only_runs_with_the_same_settings_are_compared():
    def keyed(run_id, sps, key):
        return dict(entry(run_id, sps), key=key)
    history = [keyed("a", 30.0, "samples=8"), keyed("b", 10.0, "samples=4"), keyed("c", 29.0, "samples=8"),
               keyed("d", 9.0, "samples=4")]
    rows = dict((r["run_id"], r) for r in bench.trend(history, 10))
    assert rows["b"]["previous"] == 0 and rows["b"]["flagged"] == []     # 10 vs 30, but other settings
    assert rows["c"]["previous"] == 1 and rows["c"]["flagged"] == []
    assert rows["d"]["previous"] == 1 and rows["d"]["flagged"] == []     # -10 %: not more than the threshold
    assert bench.trend(history, 5)[3]["flagged"] == ["samples_per_s", "tokens_per_s"]
    text = bench.format_history(history[:2], 10)
    assert "the last run is the first with its settings (samples=4): nothing to compare with yet" in text
    summary = {"model": "llama-tiny", "settings": {"samples": 8, "max_new_tokens": 16, "prompt_chars": 256},
               "hosts": [["w1", 1], ["w2", 2]]}
    assert bench.settings_key(summary) == ("model=llama-tiny samples=8 max_new_tokens=16 prompt_chars=256 "
                                           "prompts_file=- slots=w1:1,w2:2")
    assert bench.comparable([history[0], {"run_id": "old", "metrics": {"x": 1}}], "samples=4") == [
        {"run_id": "old", "metrics": {"x": 1}}]


def test_assign_splits_round_robin_over_the_hostfile_slots():
    a = bench.assign([["w1", 2], ["w2", 1]], 7)
    assert a["slots"] == 3
    assert a["parallel"] == {"w1": [{"slot": 0, "local_slot": 0, "samples": [0, 3, 6]},
                                    {"slot": 1, "local_slot": 1, "samples": [1, 4]}],
                             "w2": [{"slot": 2, "local_slot": 0, "samples": [2, 5]}]}
    assert a["single"] == {"w1": [{"slot": 0, "local_slot": 0, "samples": list(range(7))}]}
    shares = sorted(i for slots in a["parallel"].values() for s in slots for i in s["samples"])
    assert shares == list(range(7))


@pytest.mark.parametrize("hosts, n, msg", [
    ([["w1", 2], ["w2", 2]], 3, "samples=3 is fewer than the 4 slots.*-e samples=4"),
    ([], 3, "no worker has a slot"),
    ([["w1", 0]], 3, "host w1: slots=0"),
    ([["w1", "x"]], 3, "host w1: slots='x'"),
    ([["w1", 1], ["w1", 1]], 3, "w1 is listed twice"),
    ([["w1", 1]], "many", "samples='many'"),
])
def test_assign_refuses(hosts, n, msg):
    with pytest.raises(BenchError, match=msg):
        bench.assign(hosts, n)


LOADGEN_VALID = """================================================
MLPerf Results Summary
================================================
SUT name : PySUT
Scenario : Offline
Mode     : PerformanceOnly
Samples per second: 98.6009
Result is : VALID
  Min duration satisfied : Yes
  Min queries satisfied : Yes
  Early stopping satisfied: Yes

No warnings encountered during test.

No errors encountered during test.
"""


def test_loadgen_summary_valid():
    p = bench.parse_loadgen_summary(LOADGEN_VALID)
    assert p["scenario"] == "Offline" and p["mode"] == "PerformanceOnly" and p["result"] == "VALID"
    assert p["samples_per_s"] == pytest.approx(98.6009)
    assert p["checks"] == {"Min duration satisfied": True, "Min queries satisfied": True,
                           "Early stopping satisfied": True}
    assert p["invalid_reasons"] == [] and not p["warnings"] and not p["errors"]


def test_loadgen_summary_invalid_says_why():
    text = LOADGEN_VALID.replace("Result is : VALID", "Result is : INVALID").replace(
        "Min duration satisfied : Yes", "Min duration satisfied : NO")
    p = bench.parse_loadgen_summary(text)
    assert p["result"] == "INVALID" and p["invalid_reasons"] == ["Min duration satisfied: NO"]
    assert bench.parse_loadgen_summary("not a summary")["result"] is None


def test_loadgen_overview_is_valid_only_when_every_slot_is():
    ok = bench.parse_loadgen_summary(LOADGEN_VALID)
    bad = bench.parse_loadgen_summary(LOADGEN_VALID.replace("Result is : VALID", "Result is : INVALID").replace(
        "Min queries satisfied : Yes", "Min queries satisfied : NO"))
    o = bench.loadgen_overview({"0": ok, "1": ok})
    assert o["used"] and o["result"] == "VALID" and o["samples_per_s"] == pytest.approx(2 * 98.6009)
    o = bench.loadgen_overview({"0": ok, "1": bad})
    assert o["result"] == "INVALID" and o["invalid_reasons"] == ["slot 1: INVALID (Min queries satisfied: NO)"]
    assert bench.loadgen_overview({})["used"] is False


def test_history_entry_and_markdown_from_a_summary():
    slots = [slot("w1", 0), slot("w2", 1)]
    agg = bench.aggregate(slots, slot("w1", 0, samples=20, wall=4.0))
    summary = {"run_id": "r1", "status": "success", "finished": 1.0, "trigger": "schedule", "model": "llama-tiny",
               "aggregate": agg, "settings": {"samples": 20, "max_new_tokens": 16},
               "loadgen": bench.loadgen_overview({"0": bench.parse_loadgen_summary(LOADGEN_VALID)}),
               "regressions": bench.regressions([entry("a", 20.0)], bench.headline(agg), 10)}
    e = bench.history_entry(summary)
    assert e["metrics"]["samples_per_s"] == pytest.approx(10.0) and e["slots"] == 2 and e["nodes"] == 2
    assert e["metrics"]["scaling_efficiency"] == pytest.approx(1.0)
    md = bench.markdown(summary, ["plots/throughput.png"])
    assert "| **total** | 2 | 20 | **10** |" in md and "| w1 | 1 | 10 | 5 |" in md
    assert "scaling efficiency 1 = 10 / (2 x 5)" in md and "Result: **VALID**" in md
    assert "**REGRESSION** samples_per_s: 10 vs median 20 (-50.0%)" in md and "![throughput.png](plots/throughput.png)" in md
    failed = dict(summary, status="failed", aggregate={}, error="worker2: exit 1")
    assert bench.history_entry(failed)["metrics"] == {}
    assert "status: **failed** - worker2: exit 1" in bench.markdown(failed)
