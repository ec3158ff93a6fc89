"""Data-parallel inference benchmark: the driver on the coordinator.

The coordinator drives, the workers work::

    python -m multinode_ds.bench run --config /etc/multinode-deepspeed/benchmark.json [--run-id ID] [--trigger T]
    python -m multinode_ds.bench history --bench-dir /shared/bench [--threshold 10]
    python -m multinode_ds.bench compare RUN_A [RUN_B | history] --bench-dir /shared/bench

``run`` splits one sample set over every slot of the configured workers (``hosts``: the
hostfile's ``[[host, slots], ...]``, round robin, ``benchcore.assign``), writes the work file
into ``<bench_dir>/<run_id>/`` (shared storage every worker sees), and runs two phases with
``multinode_ds.bench_worker`` started on the workers over SSH (the cluster's SSH mesh):

1. ``single``: the first slot runs every sample alone (the baseline of the scaling efficiency);
2. ``parallel``: every slot runs its share; the driver writes ``go-parallel`` when every slot
   has loaded its model and warmed up, so all slots start at the same moment.

Then it aggregates (``benchcore.aggregate``: per slot, per node, total; prompt vs generation;
latency percentiles; scaling efficiency), reads the MLPerf LoadGen summaries the slots kept,
and writes ``summary.json`` and ``report.md`` into the run directory.  Every run, failed or not,
is appended to ``<bench_dir>/history.jsonl``; ``history.md`` / ``history.json`` show the trend
per metric and flag a drop of more than ``threshold_pct`` against the median of the previous
runs.  Exit status: 0 when the run succeeded (a flagged drop is reported, not an error), 1 when
it failed, 2 for bad settings or a run id that exists already, 3 when another benchmark holds the lock.

Progress goes to stdout every 10 s and to ``<run_dir>/progress.json`` (benchmark.yml prints it).
If the driver dies, the SSH sessions close and the workers' processes stop (``--watch-stdin``).
"""
from __future__ import annotations

import argparse
import fcntl
import glob
import importlib.util
import json
import os
import pwd
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DEFAULTS = {
    "bench_dir": "/srv/multinode-deepspeed/bench",
    "hosts": [],
    "python": sys.executable,
    "launcher": "ssh",
    "ssh_options": ["-o", "BatchMode=yes", "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4"],
    "env": {},
    "model": "llama-tiny",
    "model_path": "",
    "engine": "auto",
    "device": "auto",
    "samples": 32,
    "max_new_tokens": 16,
    "prompt_chars": 256,
    "prompts_file": "",
    "loadgen": "auto",
    "loadgen_min_duration_ms": 0,
    "threshold_pct": 10.0,
    "timeout_s": 1800,
    "start_timeout_s": 600,
    "single_baseline": True,
}
PROGRESS_EVERY = 10.0


def core():
    """The pure logic (plugins/module_utils/bench/core.py): installed next to this file by the stack role as
    benchcore.py, or read from the collection's source tree."""
    try:
        from multinode_ds import benchcore
        return benchcore
    except ImportError:
        path = Path(__file__).resolve().parent.parent / "plugins" / "module_utils" / "bench" / "core.py"
        spec = importlib.util.spec_from_file_location("multinode_ds_benchcore", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module


class Failed(Exception):
    """The run failed; the message says where and why."""


class BadSettings(Exception):
    """The settings file is unusable (exit 2, nothing is run or recorded)."""


def log(msg):
    print("[bench %s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


def load_config(path, overrides=None):
    cfg = dict(DEFAULTS)
    if path:
        with open(path) as f:
            cfg.update(json.load(f))
    cfg.update(dict((k, v) for k, v in (overrides or {}).items() if v is not None))
    problems = []
    for key in ("engine", "device", "loadgen", "launcher"):
        allowed = {"engine": ("auto", "hf", "vllm"), "device": ("auto", "cpu", "cuda"),
                   "loadgen": ("auto", "on", "off"), "launcher": ("ssh", "local")}[key]
        if cfg[key] not in allowed:
            problems.append("%s=%r (one of %s)" % (key, cfg[key], ", ".join(allowed)))
    for key, low in (("samples", 1), ("max_new_tokens", 1), ("prompt_chars", 8), ("timeout_s", 10),
                     ("start_timeout_s", 10), ("loadgen_min_duration_ms", 0)):
        try:
            if int(cfg[key]) < low:
                raise ValueError
            cfg[key] = int(cfg[key])
        except (TypeError, ValueError):
            problems.append("%s=%r (a whole number >= %d)" % (key, cfg[key], low))
    try:
        if float(cfg["threshold_pct"]) < 0:
            raise ValueError
        cfg["threshold_pct"] = float(cfg["threshold_pct"])
    except (TypeError, ValueError):
        problems.append("threshold_pct=%r (a percentage >= 0)" % (cfg["threshold_pct"],))
    if problems:
        raise BadSettings("bad benchmark settings%s: %s" % ((" in " + path) if path else "", "; ".join(problems)))
    return cfg


def make_prompts(cfg):
    """The sample set: the prompts file's lines (jsonl with "prompt" or "text", or plain text), or
    windows of the bundled corpus; repeated in order when there are fewer prompts than samples."""
    n = cfg["samples"]
    texts = []
    if cfg["prompts_file"]:
        with open(cfg["prompts_file"]) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                if cfg["prompts_file"].endswith(".jsonl"):
                    item = json.loads(line)
                    if not isinstance(item, dict):
                        raise Failed("prompts_file %s: each line must be a JSON object with \"prompt\" or \"text\""
                                     % cfg["prompts_file"])
                    line = item.get("prompt") or item.get("text") or ""
                if line:
                    texts.append(line)
        if not texts:
            raise Failed("prompts_file %s has no prompt" % cfg["prompts_file"])
    else:
        from multinode_ds import data
        corpus = " ".join(data.bundled_corpus().split())
        width = cfg["prompt_chars"]
        stride = max(1, (len(corpus) - width) // max(1, n))
        texts = [corpus[i * stride:i * stride + width] for i in range(n)]
    return [texts[i % len(texts)] for i in range(n)]


def node_command(cfg, work, host, phase):
    argv = [cfg["python"], "-m", "multinode_ds.bench_worker", "--work", str(work), "--host", host,
            "--phase", phase, "--watch-stdin"]
    env = ["%s=%s" % (k, v) for k, v in sorted(cfg["env"].items())]
    if cfg["launcher"] == "local":
        return argv
    remote = shlex.join((["env"] + env if env else []) + argv)
    return ["ssh"] + list(cfg["ssh_options"]) + ["-T", host, remote]


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(path, obj):
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def tail(path, n=15):
    try:
        with open(path, errors="replace") as f:
            return "\n".join(f.read().strip().splitlines()[-n:])
    except OSError:
        return ""


def stop(procs):
    """Close the SSH sessions' stdin (the workers stop their slots on EOF), then end what is left."""
    for p in procs.values():
        if p.poll() is None and p.stdin:
            try:
                p.stdin.close()
            except OSError:
                pass
    end = time.time() + 15
    for p in procs.values():
        try:
            p.wait(timeout=max(0.1, end - time.time()))
        except subprocess.TimeoutExpired:
            p.terminate()
    for p in procs.values():
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()


def run_phase(cfg, run_dir, work, phase, layout, deadline):
    """Start the phase's node processes, release them together, wait; the slots' results by slot."""
    hosts = list(layout)
    slots = [s["slot"] for h in hosts for s in layout[h]]
    total_samples = sum(len(s["samples"]) for h in hosts for s in layout[h])
    env = dict(os.environ)
    env.update(dict((k, str(v)) for k, v in cfg["env"].items()))
    procs, logs = {}, {}
    log("phase %s: %d slot(s) on %s, %d samples" % (phase, len(slots), ", ".join(hosts), total_samples))
    for host in hosts:
        logs[host] = run_dir / "logs" / ("%s-%s.log" % (phase, host))
        out = open(logs[host], "w")
        procs[host] = subprocess.Popen(node_command(cfg, work, host, phase), stdin=subprocess.PIPE,
                                       stdout=out, stderr=subprocess.STDOUT, env=env)
        out.close()
    go = run_dir / ("go-%s" % phase)
    started = time.time()
    last = last_write = 0.0
    try:
        while True:
            if STOP:
                raise Failed(STOP[0])
            codes = dict((h, p.poll()) for h, p in procs.items())
            bad = [h for h, c in codes.items() if c not in (None, 0)]
            if bad:
                host = bad[0]
                raise Failed("phase %s on %s: exit %s. Last lines of %s:\n%s"
                             % (phase, host, codes[host], logs[host], tail(logs[host])))
            ready = len(glob.glob(str(run_dir / "ready" / ("%s-slot*" % phase))))
            if not go.exists() and ready >= len(slots):
                go.write_text("%f\n" % time.time())
                log("phase %s: every slot is ready (%.0f s to load and warm up); go" % (phase, time.time() - started))
            if all(c == 0 for c in codes.values()):
                break
            now = time.time()
            if now > deadline:
                raise Failed("phase %s: not finished when the run's time (timeout_s=%d) ran out; ready slots %d of %d"
                             % (phase, cfg["timeout_s"], ready, len(slots)))
            if now - last_write >= 2.0:
                progress = write_progress(cfg, run_dir, phase, layout, ready, started)
                last_write = now
                if now - last >= PROGRESS_EVERY:
                    log(progress["line"])
                    last = now
            time.sleep(0.2)
    finally:
        stop(procs)
    results = {}
    for slot in slots:
        res = read_json(run_dir / "slots" / ("%s-slot%d.json" % (phase, slot)))
        if not res:
            raise Failed("phase %s: slot %d wrote no result (see %s)" % (phase, slot, run_dir / "logs"))
        results[slot] = res
    write_progress(cfg, run_dir, phase, layout, len(slots), started)
    return results


def write_progress(cfg, run_dir, phase, layout, ready, started):
    per_host, done, total = {}, 0, 0
    for host, slots in layout.items():
        d = t = 0
        for s in slots:
            p = read_json(run_dir / "progress" / ("%s-slot%d.json" % (phase, s["slot"]))) or {}
            d += int(p.get("done") or 0)
            t += len(s["samples"])
        per_host[host] = [d, t]
        done += d
        total += t
    elapsed = time.time() - started
    state = "running" if ready >= sum(len(s) for s in layout.values()) else "loading the model"
    line = "phase %s (%s): %d/%d samples, %s, %.0f s" % (
        phase, state, done, total, ", ".join("%s %d/%d" % (h, v[0], v[1]) for h, v in per_host.items()), elapsed)
    obj = {"phase": phase, "state": state, "done": done, "total": total, "hosts": per_host,
           "elapsed_s": round(elapsed, 1), "line": line, "time": time.time()}
    write_json(run_dir / "progress.json", obj)
    return obj


def history_paths(bench_dir):
    bench_dir = Path(bench_dir)
    return bench_dir / "history.jsonl", bench_dir / "history.md", bench_dir / "history.json"


def read_history(path):
    """The history's entries; a line that is not a JSON object (a torn write) is skipped with a warning."""
    entries = []
    try:
        with open(path) as f:
            for number, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    entry = json.loads(line)
                except ValueError:
                    entry = None
                if isinstance(entry, dict):
                    entries.append(entry)
                else:
                    log("%s line %d is not a history entry; skipped" % (path, number))
    except FileNotFoundError:
        pass
    return entries


def write_history_report(bench_dir, threshold_pct, history_file=None, write=True):
    """The history report's text; with ``write``, also history.md and history.json next to the history."""
    bc = core()
    jsonl, md, js = history_paths(bench_dir)
    entries = read_history(history_file or jsonl)
    text = bc.format_history(entries, threshold_pct)
    if write and history_file is None:
        md.write_text("# Benchmark history\n\n```\n%s\n```\n" % text)
        write_json(js, {"threshold_pct": threshold_pct, "entries": entries,
                        "trend": bc.trend(entries, threshold_pct)})
    return text


def open_lock(path):
    try:
        return open(path, "a")
    except OSError as exc:
        raise BadSettings("cannot open %s (%s): the benchmark runs as %s; give that account the benchmark directory "
                          "(chown -R %s %s)" % (path, exc.strerror, _user(), _user(), path.parent))


def _user():
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without a passwd entry
        return str(os.getuid())


def clear_stale(run_dir):
    """A run directory left by a run that died (no summary.json): its barrier and results are stale."""
    for pattern in ("ready/*", "go-*", "slots/*", "progress/*", "progress.json"):
        for path in glob.glob(str(run_dir / pattern)):
            os.unlink(path)


def run(cfg, run_id, trigger):
    """One benchmark run under the benchmark directory's lock: the phases, summary.json, the history, report.md;
    the exit status (0 success, 1 failed, 2 unusable directory or run id taken, 3 another benchmark runs)."""
    bc = core()
    bench_dir = Path(cfg["bench_dir"])
    try:
        bench_dir.mkdir(parents=True, exist_ok=True)
        lock = open_lock(bench_dir / ".lock")
    except (OSError, BadSettings) as exc:
        log("%s" % exc)
        return 2
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        log("another benchmark is running on %s (lock %s); try again when it has finished"
            % (socket.gethostname(), bench_dir / ".lock"))
        return 3
    run_dir = bench_dir / run_id
    if (run_dir / "summary.json").exists():
        log("run %s exists already (%s): choose another run id" % (run_id, run_dir))
        return 2
    summary = new_summary(cfg, run_id, trigger, run_dir)
    code = run_phases(bc, cfg, run_dir, summary)
    if code:
        log("FAILED: %s" % summary["error"])
    finish_summary(run_dir, summary)
    recorded, history_text, runs = record_history(bc, cfg, bench_dir, run_dir, summary)
    if not recorded:
        code = code or 1
    (run_dir / "report.md").write_text(bc.markdown(summary))
    log_outcome(summary, bench_dir, run_dir, history_text, runs)
    return code


def new_summary(cfg, run_id, trigger, run_dir):
    """The run's summary as it starts: running, with the settings that make runs comparable."""
    return {"run_id": run_id, "kind": "benchmark", "trigger": trigger, "status": "running", "error": None,
            "started": time.time(), "finished": None, "coordinator": socket.gethostname(), "model": cfg["model"],
            "model_path": cfg["model_path"] or None,
            "settings": dict((k, cfg[k]) for k in ("samples", "max_new_tokens", "prompt_chars", "prompts_file",
                                                   "engine", "device", "loadgen", "loadgen_min_duration_ms",
                                                   "threshold_pct", "single_baseline")),
            "hosts": cfg["hosts"], "run_dir": str(run_dir)}


def prepare_run(bc, cfg, run_dir, run_id):
    """The run directory, cleared of a dead run's leftovers, and the work file the workers read: (its path, the plan)."""
    for sub in ("logs", "slots", "ready", "progress", "loadgen"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    clear_stale(run_dir)
    try:
        plan = bc.assign(cfg["hosts"], cfg["samples"])
    except bc.BenchError as exc:
        raise Failed(str(exc))
    work = run_dir / "work.json"
    write_json(work, {"run_id": run_id, "out_dir": str(run_dir), "model": cfg["model"],
                      "model_path": cfg["model_path"], "engine": cfg["engine"], "device": cfg["device"],
                      "max_new_tokens": cfg["max_new_tokens"], "loadgen": cfg["loadgen"],
                      "loadgen_min_duration_ms": cfg["loadgen_min_duration_ms"],
                      "start_timeout_s": cfg["start_timeout_s"], "prompts": make_prompts(cfg),
                      "phases": {"single": plan["single"], "parallel": plan["parallel"]}})
    return work, plan


def run_phases(bc, cfg, run_dir, summary):
    """The single phase (unless turned off) and the parallel one, aggregated into ``summary``: 0, or 1 with the
    reason in summary["error"] (every failure is recorded)."""
    try:
        work, plan = prepare_run(bc, cfg, run_dir, summary["run_id"])
        deadline = summary["started"] + cfg["timeout_s"]
        single = None
        if cfg["single_baseline"]:
            single = run_phase(cfg, run_dir, work, "single", plan["single"], deadline)[0]
        parallel = run_phase(cfg, run_dir, work, "parallel", plan["parallel"], deadline)
        agg = bc.aggregate(list(parallel.values()), single)
        summary["aggregate"] = agg
        summary["engine_reason"] = "; ".join(sorted(set(str(r.get("engine_reason")) for r in parallel.values())))
        summary["loadgen"] = loadgen_results(bc, parallel)
        summary["metrics"] = bc.headline(agg)
        summary["status"] = "success"
    except Exception as exc:  # pylint: disable=broad-except  # every failure is recorded, with its reason
        summary["status"] = "failed"
        summary["error"] = str(exc) if isinstance(exc, (Failed, bc.BenchError)) else "%s: %s" % (
            type(exc).__name__, exc)
        return 1
    except KeyboardInterrupt:
        summary["status"] = "failed"
        summary["error"] = "interrupted (Ctrl-C)"
        return 1
    return 0


def finish_summary(run_dir, summary):
    """The run's end, its wall time and its node logs into summary.json: the run's own record, written first."""
    summary["finished"] = time.time()
    summary["wall_s"] = round(summary["finished"] - summary["started"], 2)
    summary["node_logs"] = sorted(os.path.relpath(p, run_dir) for p in glob.glob(str(run_dir / "logs" / "*.log")))
    # The run's own record first: a history that cannot be read or written does not lose it.
    write_json(run_dir / "summary.json", summary)


def record_history(bc, cfg, bench_dir, run_dir, summary):
    """Append the run to the history under its lock, a successful run judged first against the comparable runs
    before it (its regressions go into summary.json), and rewrite the history report.

    (whether the history was updated, the history report's text, the runs it holds now).
    """
    jsonl = history_paths(bench_dir)[0]
    history_text = ""
    previous = []
    try:
        with open_lock(bench_dir / "history.lock") as hl:
            fcntl.flock(hl, fcntl.LOCK_EX)
            previous = read_history(jsonl)
            if summary["status"] == "success":
                ok = bc.comparable(previous, bc.settings_key(summary))
                summary["regressions"] = bc.regressions(ok, summary["metrics"], cfg["threshold_pct"])
                summary["history_runs"] = len(ok)
                write_json(run_dir / "summary.json", summary)
            with open(jsonl, "a") as f:
                f.write(json.dumps(bc.history_entry(summary), sort_keys=True) + "\n")
            history_text = write_history_report(bench_dir, cfg["threshold_pct"])
    except (OSError, BadSettings) as exc:
        log("the history %s was not updated: %s" % (jsonl, exc))
        return False, history_text, len(previous) + 1
    return True, history_text, len(previous) + 1


def flagged_metrics(summary):
    """The metrics whose drop against the median of the previous runs is past the threshold."""
    return [r["metric"] for r in summary.get("regressions") or [] if r["flagged"]]


def log_outcome(summary, bench_dir, run_dir, history_text, runs):
    """The run's last lines: its headline and flagged drops when it succeeded, where its summary is, the history."""
    if summary["status"] == "success":
        log(headline_line(summary))
        flagged = flagged_metrics(summary)
        if flagged:
            log("REGRESSION against the median of the previous runs: %s (history: %s)"
                % (", ".join(flagged), bench_dir / "history.md"))
    log("summary: %s" % (run_dir / "summary.json"))
    if history_text:
        log("history (%d run(s)):\n%s" % (runs, history_text))


def loadgen_results(bc, parallel):
    parsed, reasons = {}, set()
    for slot, res in parallel.items():
        lg = res.get("loadgen") or {}
        if not lg.get("used"):
            reasons.add(lg.get("reason") or "not used")
            continue
        try:
            with open(lg.get("summary_file") or "") as f:
                parsed[str(slot)] = bc.parse_loadgen_summary(f.read())
        except OSError:
            parsed[str(slot)] = bc.parse_loadgen_summary("")
    out = bc.loadgen_overview(parsed)
    if reasons:
        out["reason"] = "; ".join(sorted(reasons))
    return out


def headline_line(summary):
    agg = summary["aggregate"]
    total = agg["total"]
    nodes = ", ".join("%s %.3g" % (h, n["samples_per_s"]) for h, n in sorted(agg["nodes"].items()))
    eff = agg.get("scaling_efficiency")
    lg = summary.get("loadgen") or {}
    return ("run %s: %.4g samples/s, %.4g tokens/s (prompt %.4g, generation %.4g) over %d slot(s) on %d node(s) "
            "(%s samples/s); scaling efficiency %s; latency p50 %.3g s p90 %.3g s; engine %s; LoadGen %s" % (
                summary["run_id"], total["samples_per_s"], total["tokens_per_s"], total["prompt_tokens_per_s"],
                total["generation_tokens_per_s"], total["slots"], total["nodes"], nodes,
                "%.3f" % eff if eff is not None else "-", agg["latency"]["latency_p50_s"],
                agg["latency"]["latency_p90_s"], ", ".join(agg["engines"]),
                lg.get("result") if lg.get("used") else "not used"))


def resolve_run(bench_dir, name):
    path = Path(name)
    if path.is_dir():
        path = path / "summary.json"
    elif not path.exists():
        path = Path(bench_dir) / name / "summary.json"
    summary = read_json(path)
    if not summary:
        raise SystemExit("no benchmark run %r: %s is missing or unreadable" % (name, path))
    return summary


def compare(bench_dir, a, b, threshold_pct):
    bc = core()
    first = resolve_run(bench_dir, a)
    if first.get("status") != "success":
        raise SystemExit("run %s did not succeed: nothing to compare" % a)
    if b in (None, "history"):
        jsonl = history_paths(bench_dir)[0]
        entries = read_history(jsonl)
        ids = [e.get("run_id") for e in entries]
        if first["run_id"] in ids:  # the runs before it, as the regression flag judges it
            entries = entries[:ids.index(first["run_id"])]
        entries = bc.comparable(entries, bc.settings_key(first))
        if not entries:
            raise SystemExit("the history %s has no successful run before %s with the same settings to compare with"
                             % (jsonl, first["run_id"]))
        ref = dict((m, bc.median([e["metrics"][m] for e in entries if e["metrics"].get(m) is not None]))
                   for m in bc.METRICS)
        rows = bc.compare(ref, first["metrics"])
        text = bc.format_compare(rows, "median of %d" % len(entries), first["run_id"])
        flagged = [r["metric"] for r in bc.regressions(entries, first["metrics"], threshold_pct) if r["flagged"]]
        text += "\n\n" + ("REGRESSION (> %g%% worse than the median): %s" % (threshold_pct, ", ".join(flagged))
                          if flagged else "no drop of more than %g%% against the median" % threshold_pct)
        return text
    second = resolve_run(bench_dir, b)
    if second.get("status") != "success":
        raise SystemExit("run %s did not succeed: nothing to compare" % b)
    rows = bc.compare(first["metrics"], second["metrics"])
    return bc.format_compare(rows, first["run_id"], second["run_id"])


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="multinode_ds.bench", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the benchmark on the configured workers")
    r.add_argument("--config", help="settings JSON (benchmark.yml and the schedule write it)")
    r.add_argument("--run-id", default="")
    r.add_argument("--trigger", default="manual", help="playbook, schedule or manual (kept in the history)")
    r.add_argument("--bench-dir")
    r.add_argument("--samples", type=int)
    h = sub.add_parser("history", help="the trend per metric and the regression flag")
    h.add_argument("--bench-dir", required=True)
    h.add_argument("--threshold", type=float, default=10.0, help="flag a drop larger than this %% of the median")
    h.add_argument("--history", help="read this history file instead of <bench-dir>/history.jsonl (no file written)")
    h.add_argument("--write", action="store_true", help="also rewrite <bench-dir>/history.md and history.json")
    c = sub.add_parser("compare", help="two runs side by side, or a run against the history's median")
    c.add_argument("a", help="run id (under --bench-dir), run directory or summary.json")
    c.add_argument("b", nargs="?", default="history", help="another run, or history (default)")
    c.add_argument("--bench-dir", required=True)
    c.add_argument("--threshold", type=float, default=10.0)
    return p.parse_args(argv)


STOP = []


def _terminated(signum, frame):
    """TERM: the phase loop fails the run at its next look (never in the middle of a cleanup)."""
    STOP.append("the driver was stopped (%s)" % signal.Signals(signum).name)


def main(argv=None):
    args = parse_args(argv)
    if args.cmd == "run":
        # A TERM (benchmark.yml's watch on Ctrl-C or timeout) fails the run cleanly: the workers are stopped
        # and the failure is recorded in summary.json and the history.
        signal.signal(signal.SIGTERM, _terminated)
        try:
            cfg = load_config(args.config, {"bench_dir": args.bench_dir, "samples": args.samples})
        except (BadSettings, OSError, ValueError) as exc:
            log("%s" % exc)
            return 2
        run_id = args.run_id or time.strftime("%Y%m%d-%H%M%S-bench", time.gmtime())
        return run(cfg, run_id, args.trigger)
    if args.cmd == "history":
        print(write_history_report(args.bench_dir, args.threshold, args.history, write=args.write))
        return 0
    print(compare(args.bench_dir, args.a, args.b, args.threshold))
    return 0


if __name__ == "__main__":
    sys.exit(main())
