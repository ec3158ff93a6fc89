# -*- coding: utf-8 -*-
# Copyright: multinode.deepspeed developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Data-parallel inference benchmark: aggregation, scaling efficiency, history, regressions, comparison.

Pure functions, no Ansible import. A benchmark run gives one result per accelerator slot:

    {"host", "slot" (global index), "local_slot", "engine", "device", "samples", "prompt_tokens",
     "generated_tokens", "wall_s" (the slot's whole run), "prefill_s", "decode_s",
     "latencies_s" (one per sample)}

Rates are per slot (count / the slot's own time); a node's rate is the sum of its slots' rates
and the total is the sum of the nodes' rates, so the totals equal the sum of the per-node
figures by construction (the slots run at the same time on their own shard of the samples).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import math
import os
import statistics

# name: (unit, higher is better)
METRICS = {
    "samples_per_s": ("samples/s", True),
    "tokens_per_s": ("tokens/s", True),
    "prompt_tokens_per_s": ("tokens/s", True),
    "generation_tokens_per_s": ("tokens/s", True),
    "latency_p50_s": ("s", False),
    "latency_p90_s": ("s", False),
    "latency_p99_s": ("s", False),
    "scaling_efficiency": ("", True),
}

RATE_KEYS = ("samples_per_s", "tokens_per_s", "prompt_tokens_per_s", "generation_tokens_per_s")
COUNT_KEYS = ("samples", "prompt_tokens", "generated_tokens")


class BenchError(Exception):
    """A slot result or a history entry is malformed."""


def _positive(slot, key):
    value = slot.get(key)
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise BenchError("slot %s on %s: %s=%r is not a number" % (slot.get("slot"), slot.get("host"), key, value))
    if value <= 0:
        raise BenchError("slot %s on %s: %s=%r must be positive" % (slot.get("slot"), slot.get("host"), key, value))
    return value


def slot_rates(slot):
    """The rates of one slot: samples/s and tokens/s over its wall time, prompt tokens/s over its
    prefill time, generation tokens/s over its decode time.

    The decode time makes ``decode_tokens`` tokens (the first generated token of a sample comes out
    of its prefill); a result without that key counts every generated token.
    """
    wall = _positive(slot, "wall_s")
    samples = int(slot.get("samples") or 0)
    prompt = int(slot.get("prompt_tokens") or 0)
    gen = int(slot.get("generated_tokens") or 0)
    decoded = int(slot.get("decode_tokens", gen) or 0)
    prefill = _positive(slot, "prefill_s") if prompt else None
    decode = _positive(slot, "decode_s") if decoded else None
    return {
        "samples_per_s": samples / wall,
        "tokens_per_s": (prompt + gen) / wall,
        "prompt_tokens_per_s": prompt / prefill if prefill else 0.0,
        "generation_tokens_per_s": decoded / decode if decode else 0.0,
    }


def percentile(values, q):
    """Nearest-rank percentile (q in 0..100) of a non-empty list; None for an empty one."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise BenchError("percentile %r is outside 0..100" % q)
    ordered = sorted(float(v) for v in values)
    rank = max(1, int(math.ceil(q / 100.0 * len(ordered))))
    return ordered[rank - 1]


def _sum_rates(items):
    out = dict((k, 0.0) for k in RATE_KEYS)
    out.update(dict((k, 0) for k in COUNT_KEYS))
    for item in items:
        for k in RATE_KEYS:
            out[k] += item[k]
        for k in COUNT_KEYS:
            out[k] += int(item.get(k) or 0)
    return out


def aggregate(slots, single=None):
    """Per slot, per node and total figures, latency percentiles and the scaling efficiency.

    ``single``: the result of one slot running the whole sample set alone (the baseline); the
    scaling efficiency is total samples/s / (slots x single samples/s).
    """
    if not slots:
        raise BenchError("no slot results: no slot finished")
    seen = set()
    rows = []
    for slot in slots:
        key = int(slot.get("slot", -1))
        if key in seen:
            raise BenchError("slot %d reported twice" % key)
        seen.add(key)
        row = dict((k, slot.get(k)) for k in ("host", "slot", "local_slot", "engine", "device"))
        row.update(dict((k, int(slot.get(k) or 0)) for k in COUNT_KEYS))
        row["wall_s"] = float(slot["wall_s"])
        row.update(slot_rates(slot))
        rows.append(row)
    rows.sort(key=lambda r: int(r["slot"]))
    nodes = {}
    for row in rows:
        nodes.setdefault(row["host"], []).append(row)
    per_node = {}
    for host, items in nodes.items():
        per_node[host] = _sum_rates(items)
        per_node[host]["slots"] = len(items)
    total = _sum_rates(per_node.values())
    total["slots"] = len(rows)
    total["nodes"] = len(per_node)
    # End to end: the whole set from the common start to the last slot's end (the slowest slot sets it; the
    # sum of rates above does not see a slot that ends late or has one sample more).
    starts = [float(s["started"]) for s in slots if s.get("started") is not None]
    ends = [float(s["finished"]) for s in slots if s.get("finished") is not None]
    total["elapsed_s"] = (max(ends) - min(starts)) if starts and ends and len(ends) == len(slots) else None
    total["samples_per_s_end_to_end"] = (total["samples"] / total["elapsed_s"]) if total["elapsed_s"] else None
    latencies = [float(x) for slot in slots for x in (slot.get("latencies_s") or [])]
    latency = {"latency_p50_s": percentile(latencies, 50), "latency_p90_s": percentile(latencies, 90),
               "latency_p99_s": percentile(latencies, 99), "samples": len(latencies)}
    out = {"slots": rows, "nodes": per_node, "total": total, "latency": latency, "latencies_s": latencies,
           "engines": sorted(set(str(r["engine"]) for r in rows)), "single": None, "scaling_efficiency": None,
           "scaling_efficiency_end_to_end": None}
    if single:
        base = dict(slot_rates(single))
        base.update(dict((k, int(single.get(k) or 0)) for k in COUNT_KEYS))
        base["wall_s"] = float(single["wall_s"])
        base["host"] = single.get("host")
        out["single"] = base
        if base["samples_per_s"] > 0:
            out["scaling_efficiency"] = total["samples_per_s"] / (len(rows) * base["samples_per_s"])
            if total["samples_per_s_end_to_end"]:
                out["scaling_efficiency_end_to_end"] = (total["samples_per_s_end_to_end"]
                                                        / (len(rows) * base["samples_per_s"]))
    return out


def headline(agg):
    """The metrics a history keeps for one run."""
    out = dict((k, agg["total"][k]) for k in RATE_KEYS)
    for k in ("latency_p50_s", "latency_p90_s", "latency_p99_s"):
        out[k] = agg["latency"][k]
    out["scaling_efficiency"] = agg["scaling_efficiency"]
    return out


def median(values):
    """The median of the numbers (the mean of the middle two for an even count); None for none."""
    values = [float(v) for v in values]
    return statistics.median(values) if values else None


def regressions(previous, current, threshold_pct=10.0):
    """Compare a run's metrics with the median of the previous runs' metrics.

    ``previous``: history entries (each ``{"run_id", "metrics": {...}}``) before ``current``
    (a metrics dict).  A metric is flagged when it got worse by more than ``threshold_pct``
    percent of the median: lower for rates and efficiency, higher for latencies.  Returns one
    row per metric: metric, value, median, runs (how many previous values), change_pct, flagged.
    """
    if threshold_pct < 0:
        raise BenchError("threshold_pct must be >= 0, got %r" % threshold_pct)
    rows = []
    for metric, (unit, higher) in METRICS.items():
        value = current.get(metric)
        past = [e["metrics"].get(metric) for e in previous if e.get("metrics", {}).get(metric) is not None]
        ref = median(past)
        row = {"metric": metric, "unit": unit, "value": value, "median": ref, "runs": len(past),
               "change_pct": None, "flagged": False}
        if value is not None and ref:
            change = (float(value) - ref) / ref * 100.0
            row["change_pct"] = change
            worse = -change if higher else change
            row["flagged"] = worse > threshold_pct
        rows.append(row)
    return rows


def compare(a, b):
    """Side by side: one row per metric with a's value, b's value and b's change against a in percent."""
    rows = []
    for metric, (unit, higher) in METRICS.items():
        va, vb = a.get(metric), b.get(metric)
        change = None
        if va not in (None, 0) and vb is not None:
            change = (float(vb) - float(va)) / float(va) * 100.0
        better = None
        if change is not None and change != 0:
            better = (change > 0) == higher
        rows.append({"metric": metric, "unit": unit, "a": va, "b": vb, "change_pct": change, "better": better})
    return rows


def _num(v):
    if v is None:
        return "-"
    return "%.4g" % v


def format_compare(rows, name_a="A", name_b="B"):
    width = max(14, len(name_a), len(name_b))
    row = "%-26s %" + str(width) + "s %" + str(width) + "s %s"
    lines = [row % ("metric", name_a, name_b, "change")]
    for r in rows:
        change = "-" if r["change_pct"] is None else "%+.1f%%%s" % (
            r["change_pct"], "" if r["better"] is None else (" better" if r["better"] else " worse"))
        lines.append(row % (r["metric"], _num(r["a"]), _num(r["b"]), change))
    return "\n".join(lines)


def assign(hosts, n_samples):
    """Split sample indexes 0..n_samples-1 over the slots of the hosts, round robin.

    ``hosts``: ``[[host, slots], ...]`` in hostfile order (the same layout as a training run).
    Global slot k takes samples k, k + T, k + 2T ... (T slots in all), so every slot's share
    differs by one sample at most.  The single-slot baseline is the first host's first slot with
    every sample.  Returns ``{"slots": T, "single": {host: [slot]}, "parallel": {host: [slot...]}}``
    where a slot is ``{"slot", "local_slot", "samples"}``.
    """
    layout = []
    seen = set()
    for item in hosts or []:
        host, count = item[0], item[1]
        if host in seen:
            raise BenchError("host %s is listed twice" % host)
        seen.add(host)
        try:
            count = int(count)
        except (TypeError, ValueError):
            raise BenchError("host %s: slots=%r is not a whole number" % (host, count))
        if count < 1:
            raise BenchError("host %s: slots=%r must be at least 1" % (host, count))
        layout.append((host, count))
    if not layout:
        raise BenchError("no worker has a slot: nothing to benchmark on")
    total = sum(item[1] for item in layout)
    try:
        n_samples = int(n_samples)
    except (TypeError, ValueError):
        raise BenchError("samples=%r is not a whole number" % (n_samples,))
    if n_samples < total:
        raise BenchError("samples=%d is fewer than the %d slots: every slot needs a sample. Fix: -e samples=%d or more"
                         % (n_samples, total, total))
    parallel = {}
    index = 0
    for host, count in layout:
        parallel[host] = []
        for local in range(count):
            parallel[host].append({"slot": index, "local_slot": local,
                                   "samples": list(range(index, n_samples, total))})
            index += 1
    first = layout[0][0]
    single = {first: [{"slot": 0, "local_slot": 0, "samples": list(range(n_samples))}]}
    return {"slots": total, "single": single, "parallel": parallel}


def parse_loadgen_summary(text):
    """The figures of an mlperf_log_summary.txt: scenario, mode, samples/s, VALID or INVALID and why.

    Returns ``{"scenario", "mode", "samples_per_s", "result", "checks": {name: bool}, "invalid_reasons",
    "warnings", "errors"}``; ``result`` is None when the text is not a LoadGen summary.
    """
    out = {"scenario": None, "mode": None, "samples_per_s": None, "result": None, "checks": {},
           "invalid_reasons": [], "warnings": False, "errors": False}
    for raw in (text or "").splitlines():
        line = raw.strip()
        if ":" not in line:
            continue
        key, value = [x.strip() for x in line.split(":", 1)]
        low = key.lower()
        if low == "scenario":
            out["scenario"] = value
        elif low == "mode":
            out["mode"] = value
        elif low == "samples per second":
            try:
                out["samples_per_s"] = float(value)
            except ValueError:
                pass
        elif low == "result is":
            out["result"] = value.upper()
        elif low.endswith("satisfied") and value.lower() in ("yes", "no"):
            out["checks"][key] = value.lower() == "yes"
            if value.lower() == "no":
                out["invalid_reasons"].append("%s: NO" % key)
    text = text or ""
    out["warnings"] = "No warnings encountered" not in text and "warning" in text.lower()
    out["errors"] = "No errors encountered" not in text and "error" in text.lower()
    return out


def loadgen_overview(parsed):
    """One verdict over the slots' LoadGen summaries (``{slot: parsed}``): VALID only when every slot is."""
    if not parsed:
        return {"used": False, "result": None, "samples_per_s": None, "slots": {}, "invalid_reasons": []}
    reasons = []
    for slot in sorted(parsed, key=int):
        p = parsed[slot]
        if p.get("result") != "VALID":
            why = "; ".join(p.get("invalid_reasons") or []) or ("no summary" if p.get("result") is None else "")
            reasons.append("slot %s: %s%s" % (slot, p.get("result") or "missing", (" (%s)" % why) if why else ""))
    rates = [p.get("samples_per_s") for p in parsed.values()]
    return {"used": True, "result": "INVALID" if reasons else "VALID",
            "samples_per_s": sum(rates) if all(r is not None for r in rates) else None,
            "slots": dict((str(k), v) for k, v in parsed.items()), "invalid_reasons": reasons}


def settings_key(summary):
    """What makes two runs comparable: the model, the work per sample and the sample count, the slots."""
    settings = summary.get("settings") or {}
    layout = ",".join("%s:%s" % (h[0], h[1]) for h in summary.get("hosts") or [])
    return "model=%s samples=%s max_new_tokens=%s prompt_chars=%s prompts_file=%s slots=%s" % (
        summary.get("model_path") or summary.get("model"), settings.get("samples"), settings.get("max_new_tokens"),
        settings.get("prompt_chars"), settings.get("prompts_file") or "-", layout)


def history_entry(summary):
    """What the history keeps of one run's summary."""
    agg = summary.get("aggregate") or {}
    total = agg.get("total") or {}
    return {"run_id": summary.get("run_id"), "time": summary.get("finished") or summary.get("started"),
            "trigger": summary.get("trigger"), "status": summary.get("status"), "model": summary.get("model"),
            "key": settings_key(summary), "engines": agg.get("engines") or [], "slots": total.get("slots"),
            "nodes": total.get("nodes"),
            "metrics": headline(agg) if summary.get("status") == "success" and agg else {}}


def comparable(entries, key):
    """The successful entries with figures that ran with the same settings (an entry without a key matches any)."""
    return [e for e in entries if e.get("status", "success") == "success" and e.get("metrics")
            and (key is None or e.get("key") in (None, key))]


def trend(entries, threshold_pct=10.0):
    """Every successful run of a history against the median of the successful runs before it that ran
    with the same settings (``settings_key``: the same model, samples, tokens and slots).

    Returns one row per run: ``{"run_id", "time", "metrics", "previous", "flagged": [metric...],
    "checks": [regressions rows]}``; the first run has nothing to compare with.
    """
    ok = comparable(entries, None)
    rows = []
    for i, entry in enumerate(ok):
        previous = comparable(ok[:i], entry.get("key"))
        checks = regressions(previous, entry["metrics"], threshold_pct) if previous else []
        rows.append({"run_id": entry.get("run_id"), "time": entry.get("time"), "metrics": entry["metrics"],
                     "key": entry.get("key"), "previous": len(previous), "checks": checks,
                     "flagged": [c["metric"] for c in checks if c["flagged"]]})
    return rows


def format_history(entries, threshold_pct=10.0):
    """The history as text: a line per run with its flags, the trend per metric, and the verdict on the last run."""
    rows = trend(entries, threshold_pct)
    failed = [e for e in entries if e.get("status", "success") != "success" or not e.get("metrics")]
    header = ("run", "samples/s", "tokens/s", "gen tok/s", "p90 lat s", "eff", "vs median of previous runs")
    lines = ["%-30s %11s %11s %11s %11s %7s  %s" % header]
    for r in rows:
        m = r["metrics"]
        flags = ", ".join("%s %+.1f%%" % (c["metric"], c["change_pct"]) for c in r["checks"] if c["flagged"])
        note = "first run with its settings" if not r["previous"] else ("DROP: " + flags if flags else "ok")
        lines.append("%-30s %11s %11s %11s %11s %7s  %s" % (
            r["run_id"], _num(m.get("samples_per_s")), _num(m.get("tokens_per_s")),
            _num(m.get("generation_tokens_per_s")), _num(m.get("latency_p90_s")),
            _num(m.get("scaling_efficiency")), note))
    for e in failed:
        lines.append("%-30s %11s  %s" % (e.get("run_id"), "-", "run %s" % (e.get("status") or "without metrics")))
    lines.append("")
    lines.append("Trend per metric (oldest -> newest):")
    for metric, (unit, _higher) in METRICS.items():
        values = [_num(r["metrics"].get(metric)) for r in rows]
        lines.append("  %-24s %s%s" % (metric, " -> ".join(values) or "-", (" " + unit) if unit else ""))
    lines.append("")
    if not rows:
        lines.append("no successful run yet")
    elif not rows[-1]["previous"]:
        lines.append("the last run is the first with its settings (%s): nothing to compare with yet" % rows[-1]["key"])
    elif rows[-1]["flagged"]:
        for c in rows[-1]["checks"]:
            if c["flagged"]:
                lines.append("REGRESSION %s: %s vs median %s of %d previous run(s) (%+.1f%%, threshold %g%%)" % (
                    c["metric"], _num(c["value"]), _num(c["median"]), c["runs"], c["change_pct"], threshold_pct))
    else:
        lines.append("no drop of more than %g%% against the median of the %d previous run(s)"
                     % (threshold_pct, rows[-1]["previous"]))
    return "\n".join(lines)


def _report_head(summary, agg):
    """report.md's title and the run's status, model, engine and settings."""
    return ["# Benchmark %s" % summary.get("run_id"), "",
            "- status: **%s**%s" % (summary.get("status"),
                                    (" - " + summary["error"]) if summary.get("error") else ""),
            "- model: %s; engine: %s (%s)" % (summary.get("model"), ", ".join(agg.get("engines") or []) or "-",
                                              summary.get("engine_reason") or "-"),
            "- samples: %s, max new tokens: %s, trigger: %s" % (
                (summary.get("settings") or {}).get("samples"), (summary.get("settings") or {}).get("max_new_tokens"),
                summary.get("trigger")), ""]


def _report_throughput(agg, total):
    """The rates per node with the total, then per slot."""
    lines = ["## Throughput", "",
             "| | slots | samples | samples/s | tokens/s | prompt tok/s | generation tok/s |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for host in sorted(agg.get("nodes") or {}):
        n = agg["nodes"][host]
        lines.append("| %s | %d | %d | %s | %s | %s | %s |" % (
            host, n["slots"], n["samples"], _num(n["samples_per_s"]), _num(n["tokens_per_s"]),
            _num(n["prompt_tokens_per_s"]), _num(n["generation_tokens_per_s"])))
    lines.append("| **total** | %d | %d | **%s** | **%s** | %s | %s |" % (
        total["slots"], total["samples"], _num(total["samples_per_s"]), _num(total["tokens_per_s"]),
        _num(total["prompt_tokens_per_s"]), _num(total["generation_tokens_per_s"])))
    lines += ["", "Per slot:", "", "| slot | host | local | engine | device | samples | wall s | samples/s | tokens/s |",
              "|---:|---|---:|---|---|---:|---:|---:|---:|"]
    for r in agg.get("slots") or []:
        lines.append("| %s | %s | %s | %s | %s | %d | %s | %s | %s |" % (
            r["slot"], r["host"], r["local_slot"], r["engine"], r["device"], r["samples"], _num(r["wall_s"]),
            _num(r["samples_per_s"]), _num(r["tokens_per_s"])))
    return lines


def _report_latency(agg):
    """The latency percentiles per sample."""
    lat = agg.get("latency") or {}
    return ["", "## Latency per sample", "", "p50 %s s, p90 %s s, p99 %s s over %s samples" % (
        _num(lat.get("latency_p50_s")), _num(lat.get("latency_p90_s")), _num(lat.get("latency_p99_s")),
        lat.get("samples"))]


def _report_scaling(agg, total):
    """The scaling efficiency against one slot alone (when it ran), and the end-to-end rate."""
    single = agg.get("single")
    lines = ["", "## Scaling", ""]
    if single:
        lines.append("One slot alone (%s, same %d samples): %s samples/s. Total %s samples/s over %d slots: "
                     "scaling efficiency %s = %s / (%d x %s)." % (
                         single.get("host"), single["samples"], _num(single["samples_per_s"]),
                         _num(total["samples_per_s"]), total["slots"], _num(agg.get("scaling_efficiency")),
                         _num(total["samples_per_s"]), total["slots"], _num(single["samples_per_s"])))
    else:
        lines.append("No single-slot run: no scaling efficiency.")
    if total.get("elapsed_s"):
        lines += ["", "End to end: %d samples in %s s from the common start to the last slot's end = %s samples/s%s "
                  "(the slowest slot sets it; the totals above add the slots' own rates)." % (
                      total["samples"], _num(total["elapsed_s"]), _num(total["samples_per_s_end_to_end"]),
                      (", efficiency %s" % _num(agg.get("scaling_efficiency_end_to_end")))
                      if agg.get("scaling_efficiency_end_to_end") else "")]
    return lines


def _report_loadgen(lg):
    """LoadGen's verdict and its reasons, or why it was not used."""
    lines = ["", "## MLPerf LoadGen (Offline)", ""]
    if lg.get("used"):
        lines.append("Result: **%s**, %s samples/s (sum over the slots)."
                     % (lg.get("result"), _num(lg.get("samples_per_s"))))
        for reason in lg.get("invalid_reasons") or []:
            lines.append("- %s" % reason)
    else:
        lines.append("Not used: %s" % (lg.get("reason") or "mlperf_loadgen is not installed on the workers"))
    return lines


def _report_history(regs):
    """The drops flagged against the history's median; nothing when the run was not judged against it."""
    if not regs:
        return []
    lines = ["", "## Against the history", ""]
    flagged = [r for r in regs if r.get("flagged")]
    if flagged:
        for r in flagged:
            lines.append("- **REGRESSION** %s: %s vs median %s (%+.1f%%)" % (
                r["metric"], _num(r["value"]), _num(r["median"]), r["change_pct"]))
    else:
        lines.append("No drop beyond the threshold against the median of %d previous run(s)." % regs[0]["runs"])
    return lines


def markdown(summary, plots=None):
    """report.md of one benchmark run: settings, totals, nodes, slots, latency, efficiency, LoadGen."""
    agg = summary.get("aggregate") or {}
    total = agg.get("total") or {}
    lines = _report_head(summary, agg)
    if not total:
        return "\n".join(lines) + "\n"
    lines += _report_throughput(agg, total) + _report_latency(agg) + _report_scaling(agg, total)
    lines += _report_loadgen(summary.get("loadgen") or {}) + _report_history(summary.get("regressions") or [])
    for path in plots or []:
        lines += ["", "![%s](%s)" % (os.path.basename(path), path)]
    return "\n".join(lines) + "\n"


def plot_run(agg, out_dir):
    """throughput.png (samples/s and tokens/s per slot, grouped by node, with the total) and latency.png
    (the per-sample latency distribution); matplotlib is imported here."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not agg or not agg.get("slots"):
        return []
    if not os.path.isdir(out_dir):
        os.makedirs(out_dir)
    paths = []
    rows = agg["slots"]
    labels = ["%s/%s" % (r["host"], r["local_slot"]) for r in rows]
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, key, title in ((axes[0], "samples_per_s", "samples/s"), (axes[1], "tokens_per_s", "tokens/s")):
        ax.bar(labels, [r[key] for r in rows], color="tab:blue")
        single = (agg.get("single") or {}).get(key)
        if single:
            ax.axhline(single, color="tab:orange", linestyle="--", label="one slot alone")
            ax.legend(fontsize="small")
        ax.set_title("%s per slot (total %.4g)" % (title, agg["total"][key]))
        ax.tick_params(axis="x", labelrotation=30, labelsize="small")
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out_dir, "throughput.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    paths.append(path)
    latencies = agg.get("latencies_s") or []
    if latencies:
        fig, ax = plt.subplots(figsize=(7, 3.2))
        ax.hist(latencies, bins=min(30, max(5, len(latencies) // 2)), color="tab:green")
        lat = agg.get("latency") or {}
        for q in ("latency_p50_s", "latency_p90_s", "latency_p99_s"):
            if lat.get(q) is not None:
                ax.axvline(lat[q], linestyle="--", color="black", alpha=0.6)
        ax.set_title("latency per sample (s): p50 %s, p90 %s, p99 %s" % (
            _num(lat.get("latency_p50_s")), _num(lat.get("latency_p90_s")), _num(lat.get("latency_p99_s"))))
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        path = os.path.join(out_dir, "latency.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        paths.append(path)
    return paths


def plot_history(rows, out_dir):
    """history.png: the trend of the main metrics over the runs, flagged runs marked in red."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not rows:
        return []
    if not os.path.isdir(out_dir):
        os.makedirs(out_dir)
    metrics = ("samples_per_s", "tokens_per_s", "latency_p90_s", "scaling_efficiency")
    fig, axes = plt.subplots(2, 2, figsize=(10, 5.5))
    xs = list(range(1, len(rows) + 1))
    for ax, metric in zip([a for line in axes for a in line], metrics):
        ys = [r["metrics"].get(metric) for r in rows]
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
        bad = [(x, y) for x, y, r in zip(xs, ys, rows) if y is not None and metric in r["flagged"]]
        if bad:
            ax.scatter([p[0] for p in bad], [p[1] for p in bad], color="red", zorder=3, label="drop vs median")
            ax.legend(fontsize="small")
        ax.set_title("%s (%s)" % (metric, METRICS[metric][0] or "ratio"))
        ax.set_xlabel("run")
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    path = os.path.join(out_dir, "history.png")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return [path]
