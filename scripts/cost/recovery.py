"""What a lost node costs a run with restarts, on the local cluster.

    make bench-recovery [ROUNDS=3] [STEPS=300]
    .venv/bin/python scripts/cost/recovery.py [--rounds 3] [--steps 300] [--model llama-tiny] [--json FILE]

Back to back, N rounds of two runs of train.yml with the same model, steps and save interval
(-e restarts=1 -e save_interval=STEPS/10 -e preflight=false), on the workers of the local cluster:

  clean   no fault
  fault   worker2 stopped (podman stop) once rank 0 reached a third of the steps, started again
          10 s later: the run waits for it, checks it and goes on from its newest checkpoint
  hang    rank 1 frozen (SIGSTOP) at a third of the steps: alive, its node's agent beating, nothing
          moving; the watch calls the run hung from its pace and the next attempt goes on

For each run: the whole command's wall time and the goodput summary.json reports (the share of the
wall time spent on steps that counted); for a faulted run also the seconds from the fault to the
next attempt's first step and the steps it recomputed, and for the hang the seconds from the
SIGSTOP to the watch's abort (detection).  Prints the medians, each faulted run's ratios to the
clean one (wall time, goodput) and the seconds it lost (its wall time less the clean run's), and
writes them as JSON.

Needs a provisioned local cluster (make cluster && ansible-playbook site.yml).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
INVENTORY = ROOT / "inventories" / "local" / "hosts.yml"
CONF = ROOT / ".cache" / "podman" / "containers.conf"


def podman(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, CONTAINERS_CONF=str(CONF))
    return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, check=False)


def rank0_step(run_id: str) -> int:
    res = podman("exec", "mnds-coord", "sh", "-c",
                 f"tail -n1 /shared/runs/{run_id}/attempts/1/metrics/rank0.jsonl 2>/dev/null")
    try:
        return int(json.loads(res.stdout).get("step", 0))
    except ValueError:
        return 0


def wait_for_step(run_id: str, step: int) -> None:
    deadline = time.time() + 1800
    while time.time() < deadline and rank0_step(run_id) < step:
        time.sleep(0.5)


def inject(run_id: str, step: int, back_after: float, out: dict) -> None:
    """Stop worker2 once rank 0 reached ``step``, start it again ``back_after`` seconds later."""
    wait_for_step(run_id, step)
    out["fault_at"] = time.time()
    podman("stop", "-t", "0", "mnds-worker2")
    time.sleep(back_after)
    podman("start", "mnds-worker2")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "localcluster.py"), "connect", "worker2"], cwd=ROOT,
                   check=False, capture_output=True)


def freeze(run_id: str, step: int, out: dict) -> None:
    """SIGSTOP rank 1 (on worker2) once rank 0 reached ``step``."""
    wait_for_step(run_id, step)
    out["fault_at"] = time.time()
    podman("exec", "mnds-worker2", "pkill", "-STOP", "-f", "--", "-u -m multinode_ds.train")


def detection(run_id: str, fault_at: float):
    """Seconds from the fault to the first attempt's abort (its ABORT record's time), or None."""
    res = podman("exec", "mnds-coord", "cat", f"/shared/runs/{run_id}/attempts/1/control/ABORT")
    try:
        return float(json.loads(res.stdout)["time"]) - fault_at
    except (ValueError, KeyError, TypeError):
        return None


def train(run_id: str, args, kind: str) -> dict:
    argv = [str(BIN / "ansible-playbook"), "train.yml", "-e", f"model={args.model}", "-e", f"steps={args.steps}",
            "-e", f"run_id={run_id}", "-e", "restarts=1", "-e", f"save_interval={max(1, args.steps // 10)}",
            "-e", "preflight=false"]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    fault_info: dict = {}
    injector = {"fault": threading.Thread(target=inject, args=(run_id, args.steps // 3, 10.0, fault_info)),
                "hang": threading.Thread(target=freeze, args=(run_id, args.steps // 3, fault_info))}.get(kind)
    if injector:
        injector.start()
    t0 = time.time()
    res = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.time() - t0
    if injector:
        injector.join()
    if kind == "fault":
        # The cluster's names on worker2 again (podman rewrote its /etc/hosts when it started).
        subprocess.run([sys.executable, str(ROOT / "scripts" / "localcluster.py"), "up"], cwd=ROOT, check=True,
                       capture_output=True)
    if res.returncode != 0:
        raise SystemExit(f"[bench-recovery] {run_id} failed:\n" + "\n".join(res.stdout.splitlines()[-30:]))
    summary = json.loads((ROOT / "runs" / run_id / "summary.json").read_text())
    out = {"wall_s": wall, "goodput": summary["goodput"], "attempts": len(summary["attempts"])}
    if injector:
        second = summary["attempts"][-1]
        out.update(fault_to_first_step_s=second["fault_to_first_step"], recomputed_steps=second["recomputed_steps"])
    if kind == "hang":
        out["detection_s"] = detection(run_id, fault_info["fault_at"])
    return out


FAULTS = ("fault", "hang")


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def report(results: dict, args) -> dict:
    """The medians of each kind, and each faulted kind's per-round ratios to the clean run and seconds lost."""
    med = dict((k, dict((m, _median(r[m] for r in v)) for m in v[0])) for k, v in results.items())
    ratios, lost = {}, {}
    for kind in FAULTS:
        pairs = list(zip(results[kind], results["clean"]))
        ratios[kind] = {"wall": _median(f["wall_s"] / c["wall_s"] for f, c in pairs),
                        "goodput": _median(f["goodput"] / c["goodput"] for f, c in pairs)}
        lost[kind] = _median(f["wall_s"] - c["wall_s"] for f, c in pairs)
    print(f"\nmedians over {args.rounds} rounds ({args.model}, {args.steps} steps):")
    for kind, m in med.items():
        print(f"  {kind:6s} " + "  ".join(f"{k} {v:.3g}" for k, v in m.items() if v is not None))
    for kind in FAULTS:
        figures = (kind, kind, ratios[kind]["wall"], ratios[kind]["goodput"], lost[kind],
                   med[kind]["fault_to_first_step_s"])
        print("%s: median of the per-round ratios (%s / clean): wall time %.2f, goodput %.2f; seconds lost %.1f; "
              "fault -> next attempt's first step %.1f s" % figures)
    print("hang: SIGSTOP -> the watch's abort %s s (median)" % (
        "%.1f" % med["hang"]["detection_s"] if med["hang"].get("detection_s") is not None else "unknown"))
    return {"rounds": results, "medians": med, "ratios": ratios, "seconds_lost": lost, "model": args.model,
            "steps": args.steps}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--model", default="llama-tiny")
    p.add_argument("--json", default=str(ROOT / "tests" / "output" / "bench-recovery.json"))
    args = p.parse_args(argv)
    if args.rounds < 1 or args.steps < 30:
        p.error("--rounds must be at least 1 and --steps at least 30")
    if not INVENTORY.exists():
        raise SystemExit("[bench-recovery] no local cluster: make cluster, then ansible-playbook site.yml")
    results: dict = {"clean": [], "fault": [], "hang": []}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for rnd in range(1, args.rounds + 1):
        for kind in ("clean",) + FAULTS:
            res = train(f"bench-recovery-{stamp}-{rnd}-{kind}", args, kind)
            results[kind].append(res)
            print(f"round {rnd} {kind:6s} " + "  ".join(f"{k} {v:.3g}" for k, v in res.items() if v is not None),
                  flush=True)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report(results, args), indent=2) + "\n")
    print(f"\n{out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
