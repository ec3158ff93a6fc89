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
    prefill time, generated tokens/s over its decode time."""
    wall = _positive(slot, "wall_s")
    samples = int(slot.get("samples") or 0)
    prompt = int(slot.get("prompt_tokens") or 0)
    gen = int(slot.get("generated_tokens") or 0)
    prefill = _positive(slot, "prefill_s") if prompt else None
    decode = _positive(slot, "decode_s") if gen else None
    return {
        "samples_per_s": samples / wall,
        "tokens_per_s": (prompt + gen) / wall,
        "prompt_tokens_per_s": prompt / prefill if prefill else 0.0,
        "generation_tokens_per_s": gen / decode if decode else 0.0,
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
    latencies = [float(x) for slot in slots for x in (slot.get("latencies_s") or [])]
    latency = {"latency_p50_s": percentile(latencies, 50), "latency_p90_s": percentile(latencies, 90),
               "latency_p99_s": percentile(latencies, 99), "samples": len(latencies)}
    out = {"slots": rows, "nodes": per_node, "total": total, "latency": latency,
           "engines": sorted(set(str(r["engine"]) for r in rows)), "single": None, "scaling_efficiency": None}
    if single:
        base = dict(slot_rates(single))
        base.update(dict((k, int(single.get(k) or 0)) for k in COUNT_KEYS))
        base["wall_s"] = float(single["wall_s"])
        base["host"] = single.get("host")
        out["single"] = base
        if base["samples_per_s"] > 0:
            out["scaling_efficiency"] = total["samples_per_s"] / (len(rows) * base["samples_per_s"])
    return out


def headline(agg):
    """The metrics a history keeps for one run."""
    out = dict((k, agg["total"][k]) for k in RATE_KEYS)
    for k in ("latency_p50_s", "latency_p90_s", "latency_p99_s"):
        out[k] = agg["latency"][k]
    out["scaling_efficiency"] = agg["scaling_efficiency"]
    return out


def median(values):
    ordered = sorted(float(v) for v in values)
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0


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
    lines = ["%-26s %14s %14s %10s" % ("metric", name_a[:14], name_b[:14], "change")]
    for r in rows:
        change = "-" if r["change_pct"] is None else "%+.1f%%%s" % (
            r["change_pct"], "" if r["better"] is None else (" better" if r["better"] else " worse"))
        lines.append("%-26s %14s %14s %10s" % (r["metric"], _num(r["a"]), _num(r["b"]), change))
    return "\n".join(lines)


def format_history(entries, rows):
    """The history as text: one line per run, then the last run against the median of the others."""
    lines = ["%-28s %12s %12s %12s %8s" % ("run", "samples/s", "tokens/s", "p90 lat(s)", "eff")]
    for e in entries:
        m = e.get("metrics", {})
        lines.append("%-28s %12s %12s %12s %8s" % (e.get("run_id"), _num(m.get("samples_per_s")),
                                                    _num(m.get("tokens_per_s")), _num(m.get("latency_p90_s")),
                                                    _num(m.get("scaling_efficiency"))))
    flagged = [r for r in rows if r["flagged"]]
    lines.append("")
    if flagged:
        for r in flagged:
            lines.append("REGRESSION %s: %s vs median %s of %d run(s) (%+.1f%%)" % (
                r["metric"], _num(r["value"]), _num(r["median"]), r["runs"], r["change_pct"]))
    else:
        lines.append("no regression against the median of the previous runs")
    return "\n".join(lines)
