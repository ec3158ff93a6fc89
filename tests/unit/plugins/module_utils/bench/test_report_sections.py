"""report.md of a benchmark run, section by section (bench/core.py): head, throughput, latency, scaling,
LoadGen, the history; and the whole in their order."""
from ansible_collections.multinode.deepspeed.plugins.module_utils.bench import core as bench


def slot(host, index, samples=10, wall=2.0, local=0, started=None, finished=None):
    out = {"host": host, "slot": index, "local_slot": local, "engine": "hf", "device": "cpu", "samples": samples,
           "prompt_tokens": 400, "generated_tokens": 160, "wall_s": wall, "prefill_s": 0.5, "decode_s": 1.5,
           "latencies_s": [0.1 * (i + 1) for i in range(samples)]}
    if started is not None:
        out.update(started=started, finished=finished)
    return out


def agg(single=True):
    return bench.aggregate([slot("w1", 0, started=100.0, finished=102.0), slot("w2", 1, started=100.0, finished=104.0)],
                           slot("w1", 0, samples=20, wall=4.0) if single else None)


def test_the_head_names_the_status_model_engine_and_settings():
    lines = bench._report_head({"run_id": "r1", "status": "failed", "error": "w2: exit 1", "model": "llama-tiny",
                                "engine_reason": "vllm is not installed", "trigger": "schedule",
                                "settings": {"samples": 20, "max_new_tokens": 16}}, {"engines": ["hf"]})
    assert lines == ["# Benchmark r1", "", "- status: **failed** - w2: exit 1",
                     "- model: llama-tiny; engine: hf (vllm is not installed)",
                     "- samples: 20, max new tokens: 16, trigger: schedule", ""]
    assert bench._report_head({"status": "running"}, {})[2:4] == ["- status: **running**", "- model: None; engine: - (-)"]


def test_throughput_per_node_with_the_total_then_per_slot():
    a = agg()
    lines = bench._report_throughput(a, a["total"])
    assert lines[:4] == ["## Throughput", "", "| | slots | samples | samples/s | tokens/s | prompt tok/s | generation tok/s |",
                         "|---|---:|---:|---:|---:|---:|---:|"]
    assert lines[4:7] == ["| w1 | 1 | 10 | 5 | 280 | 800 | 106.7 |", "| w2 | 1 | 10 | 5 | 280 | 800 | 106.7 |",
                          "| **total** | 2 | 20 | **10** | **560** | 1600 | 213.3 |"]
    assert lines[-2:] == ["| 0 | w1 | 0 | hf | cpu | 10 | 2 | 5 | 280 |", "| 1 | w2 | 0 | hf | cpu | 10 | 2 | 5 | 280 |"]


def test_latency_percentiles():
    assert bench._report_latency({"latency": {"latency_p50_s": 0.5, "latency_p90_s": 0.9, "latency_p99_s": 1.0,
                                              "samples": 20}}) == [
        "", "## Latency per sample", "", "p50 0.5 s, p90 0.9 s, p99 1 s over 20 samples"]
    assert bench._report_latency({})[-1] == "p50 - s, p90 - s, p99 - s over None samples"


def test_scaling_against_one_slot_alone_and_end_to_end():
    a = agg()
    lines = bench._report_scaling(a, a["total"])
    assert lines[:4] == ["", "## Scaling", "", "One slot alone (w1, same 20 samples): 5 samples/s. Total 10 samples/s "
                         "over 2 slots: scaling efficiency 1 = 10 / (2 x 5)."]
    assert lines[5] == ("End to end: 20 samples in 4 s from the common start to the last slot's end = 5 samples/s, "
                        "efficiency 0.5 (the slowest slot sets it; the totals above add the slots' own rates).")
    a = agg(single=False)
    assert bench._report_scaling(a, a["total"])[3:5] == ["No single-slot run: no scaling efficiency.", ""]
    assert ", efficiency" not in bench._report_scaling(a, a["total"])[5]
    assert bench._report_scaling(a, dict(a["total"], elapsed_s=None))[3:] == ["No single-slot run: no scaling efficiency."]


def test_loadgen_verdict_or_why_it_was_not_used():
    assert bench._report_loadgen({"used": True, "result": "INVALID", "samples_per_s": 12.5,
                                  "invalid_reasons": ["slot 1: INVALID (Min queries satisfied: NO)"]})[3:] == [
        "Result: **INVALID**, 12.5 samples/s (sum over the slots).", "- slot 1: INVALID (Min queries satisfied: NO)"]
    assert bench._report_loadgen({"used": False, "reason": "loadgen=off"})[3:] == ["Not used: loadgen=off"]
    assert bench._report_loadgen({})[3:] == ["Not used: mlperf_loadgen is not installed on the workers"]


def test_the_history_section_flags_drops_or_says_there_is_none():
    assert bench._report_history([]) == []
    drop = {"metric": "samples_per_s", "value": 10.0, "median": 20.0, "change_pct": -50.0, "flagged": True, "runs": 3}
    same = {"metric": "tokens_per_s", "value": 5.0, "median": 5.0, "change_pct": 0.0, "flagged": False, "runs": 3}
    assert bench._report_history([drop, same]) == ["", "## Against the history", "",
                                                   "- **REGRESSION** samples_per_s: 10 vs median 20 (-50.0%)"]
    assert bench._report_history([same])[3:] == ["No drop beyond the threshold against the median of 3 previous run(s)."]


def test_the_report_is_its_sections_in_order():
    a = agg()
    summary = {"run_id": "r1", "status": "success", "aggregate": a, "loadgen": {"used": False, "reason": "off"}}
    md = bench.markdown(summary, ["plots/throughput.png"])
    titles = [line for line in md.splitlines() if line.startswith("#")]
    assert titles == ["# Benchmark r1", "## Throughput", "## Latency per sample", "## Scaling", "## MLPerf LoadGen (Offline)"]
    assert md.endswith("\n\n![throughput.png](plots/throughput.png)\n")
    assert md == "\n".join(bench._report_head(summary, a) + bench._report_throughput(a, a["total"])
                           + bench._report_latency(a) + bench._report_scaling(a, a["total"])
                           + bench._report_loadgen(summary["loadgen"]) + ["", "![throughput.png](plots/throughput.png)"]) + "\n"
    assert bench.markdown({"run_id": "r2", "status": "failed"}) == "\n".join(bench._report_head({"run_id": "r2", "status": "failed"}, {})) + "\n"
