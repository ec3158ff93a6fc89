"""Load generation: whether a slot runs its samples under MLPerf LoadGen (Offline scenario, PerformanceOnly),
and running them that way, returning what LoadGen issued and its verdict."""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .protocol import BenchError

if TYPE_CHECKING:
    from .runner import Runner


def choose_loadgen(mode: str) -> tuple[bool, str]:
    """Whether to run under MLPerf LoadGen, and why (its version when used)."""
    if mode == "off":
        return False, "loadgen=off"
    try:
        importlib.import_module("mlperf_loadgen")
    except ImportError:
        if mode == "on":
            raise BenchError("loadgen=on but mlperf_loadgen is not installed in this node's venv. Install the "
                             "mlcommons-loadgen wheel on every node, or use loadgen=auto or off.") from None
        return False, "not installed"
    import importlib.metadata as md

    try:
        return True, f"mlperf_loadgen {md.version('mlcommons-loadgen')}"
    except md.PackageNotFoundError:
        return True, "mlperf_loadgen"


@dataclass(frozen=True)
class LoadGenPlan:
    outdir: Path
    expected_qps: float
    min_duration_ms: int


def expected_qps(warmup_s: float) -> float:
    return max(1.0, 1.0 / warmup_s) if warmup_s > 0 else 1.0


def run_loadgen(runner: Runner, samples: list[int], plan: LoadGenPlan) -> dict:
    """Run the samples under LoadGen (Offline, PerformanceOnly); what it issued and its verdict."""
    import mlperf_loadgen as lg

    issued, failure = [0], []

    def issue_queries(query_samples):
        issued[0] += len(query_samples)
        runner.progress.update(total=issued[0])
        for qs in query_samples:
            if not failure:
                try:
                    runner.run(samples[qs.index])
                except Exception as exc:  # pylint: disable=broad-except  # re-raised after the test
                    failure.append(exc)
            lg.QuerySamplesComplete([lg.QuerySampleResponse(qs.id, 0, 0)])

    n = len(samples)
    settings = lg.TestSettings()
    settings.scenario = lg.TestScenario.Offline
    settings.mode = lg.TestMode.PerformanceOnly
    settings.offline_expected_qps = plan.expected_qps
    settings.min_query_count = n
    settings.min_duration_ms = plan.min_duration_ms
    log = lg.LogSettings()
    plan.outdir.mkdir(parents=True, exist_ok=True)
    log.log_output.outdir = str(plan.outdir)
    log.enable_trace = False
    sut = lg.ConstructSUT(issue_queries, lambda: None)
    qsl = lg.ConstructQSL(n, n, lambda indexes: None, lambda indexes: None)
    try:
        lg.StartTestWithLogSettings(sut, qsl, settings, log)
    finally:
        lg.DestroyQSL(qsl)
        lg.DestroySUT(sut)
    if failure:
        raise failure[0]
    summary = plan.outdir / "mlperf_log_summary.txt"
    verdict = re.search(r"Result is : (\w+)", summary.read_text()) if summary.exists() else None
    return {"issued": issued[0], "summary_file": str(summary) if summary.exists() else None,
            "result": verdict.group(1) if verdict else None, "expected_qps": plan.expected_qps,
            "min_query_count": n, "min_duration_ms": plan.min_duration_ms}
