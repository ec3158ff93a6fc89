"""What a lost node costs a run with restarts, on the local cluster.

    make bench-recovery [ROUNDS=3] [STEPS=1200] [CASES=fault,kill,hang,grow,spare]
    .venv/bin/python scripts/cost/recovery.py [--rounds 3] [--steps 1200] [--micro-batch 16] [--model llama-tiny]
                                              [--cases fault,kill,...] [--no-spare] [--json FILE]

Back to back, N rounds of a clean run and each faulted case's run of train.yml with the same model, steps, micro-batch and save interval
(-e restarts=1 -e save_interval=STEPS/10 -e preflight=false), on the workers of the local cluster.  Micro-batches
of 16 make a step take about 25 ms on two workers and 36 ms on one (with two micro-batches): long enough that a
shrunken attempt has the 20 s left that a grow-back needs (module_utils/run/grow.py):

  clean   no fault
  fault   worker2 stopped (podman stop) once rank 0 reached a third of the steps, started again
          10 s later: the run waits for it, checks it and goes on from its newest checkpoint
  kill    rank 1 killed (SIGKILL) at a third of the steps: the next attempt runs on the same nodes
  hang    rank 1 frozen (SIGSTOP) at a third of the steps: alive, its node's agent beating, nothing
          moving; the watch calls the run hung from its pace and the next attempt goes on
  spare   worker2 stopped at a third of the steps and not back: the spare worker3 takes its place after
          its check and replacement preflight (the rounds of this case run last: localcluster.py up
          --spares 1 and site.yml first, the spare removed at the end; --no-spare leaves them out)
  grow    worker2 stopped at a third of the steps and not back within recover_wait (5 s): attempt 2
          goes on with worker1 alone (-e restarts=2 -e min_nodes=1); worker2 started again at attempt
          2's fifth step: the watch checkpoints attempt 2, and attempt 3 runs on both nodes again

For each run: the whole command's wall time and the goodput summary.json reports (the share of the
wall time spent on steps that counted); for a faulted run also the seconds from the fault to the
next attempt's first step and the steps it recomputed, and for the hang the seconds from the
SIGSTOP to the watch's abort (detection), and for the grow-back the seconds from worker2's start to
the watch's stop of attempt 2 (detection) and to attempt 3's first step.  Prints the medians, each faulted run's ratios to the
clean one (wall time, goodput) and the seconds it lost (its wall time less the clean run's), and
writes them as JSON.  Last, on paper: the goodput of a 24-hour run on 8, 64 and 512 nodes at the
interruption rate Meta published for Llama 3's pre-training, each lost node costing the seconds
measured here, against restarting by hand (an hour to notice, then the same recovery).

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


def rank0_step(run_id: str, attempt: int = 1) -> int:
    res = podman("exec", "mnds-coord", "sh", "-c",
                 f"tail -n1 /shared/runs/{run_id}/attempts/{attempt}/metrics/rank0.jsonl 2>/dev/null")
    try:
        return int(json.loads(res.stdout).get("step", 0))
    except ValueError:
        return 0


def wait_for_step(run_id: str, step: int, attempt: int = 1) -> None:
    deadline = time.time() + 1800
    while time.time() < deadline and rank0_step(run_id, attempt) < step:
        time.sleep(0.2)


def start_worker2() -> None:
    podman("start", "mnds-worker2")
    subprocess.run([sys.executable, str(ROOT / "scripts" / "localcluster.py"), "connect", "worker2"], cwd=ROOT,
                   check=False, capture_output=True)


def inject(run_id: str, step: int, back_after, out: dict) -> None:
    """Stop worker2 once rank 0 reached ``step``, start it again ``back_after`` seconds later (None: after the
    run)."""
    wait_for_step(run_id, step)
    out["fault_at"] = time.time()
    podman("stop", "-t", "0", "mnds-worker2")
    if back_after is not None:
        time.sleep(back_after)
        start_worker2()


def localcluster(*args: str) -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "localcluster.py"), *args], cwd=ROOT, check=True,
                   capture_output=True)


def provision_spare() -> None:
    """worker3 as the inventory's spare, provisioned like the workers (once, before the rounds)."""
    localcluster("up", "--spares", "1")
    t0 = time.time()
    res = subprocess.run([str(BIN / "ansible-playbook"), "site.yml"], cwd=ROOT, capture_output=True, text=True,
                         check=False, env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg")))
    if res.returncode != 0:
        raise SystemExit("[bench-recovery] site.yml with the spare failed:\n" + "\n".join(res.stdout.splitlines()[-30:]))
    print(f"spare worker3 provisioned by site.yml in {time.time() - t0:.0f}s", flush=True)


def grow_back(run_id: str, step: int, out: dict) -> None:
    """Stop worker2 once rank 0 reached ``step``; start it again once attempt 2 (on worker1 alone) has trained five
    steps past the checkpoint it resumed from."""
    wait_for_step(run_id, step)
    out["fault_at"] = time.time()
    podman("stop", "-t", "0", "mnds-worker2")
    while rank0_step(run_id, 2) == 0:
        time.sleep(0.2)
    wait_for_step(run_id, rank0_step(run_id, 2) + 4, attempt=2)
    out["back_at"] = time.time()
    start_worker2()


def freeze(run_id: str, step: int, out: dict, sig: str = "-STOP") -> None:
    """SIGSTOP (or ``sig``) rank 1 (on worker2) once rank 0 reached ``step``."""
    wait_for_step(run_id, step)
    out["fault_at"] = time.time()
    podman("exec", "mnds-worker2", "pkill", sig, "-f", "--", "-u -m multinode_ds.train")


def detection(run_id: str, fault_at: float, attempt: int = 1):
    """Seconds from the fault to the attempt's abort (its ABORT record's time), or None."""
    res = podman("exec", "mnds-coord", "cat", f"/shared/runs/{run_id}/attempts/{attempt}/control/ABORT")
    try:
        return float(json.loads(res.stdout)["time"]) - fault_at
    except (ValueError, KeyError, TypeError):
        return None


def train(run_id: str, args, kind: str) -> dict:
    argv = [str(BIN / "ansible-playbook"), "train.yml", "-e", f"model={args.model}", "-e", f"steps={args.steps}",
            "-e", f"run_id={run_id}", "-e", f"save_interval={max(1, args.steps // 10)}", "-e", "preflight=false",
            "-e", json.dumps({"args": f"--micro-batch {args.micro_batch}"})]
    argv += ["-e", "restarts=2", "-e", "min_nodes=1", "-e", "recover_wait=5"] if kind == "grow" else [
        "-e", "restarts=1"]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    fault_info: dict = {}
    injector = {"fault": threading.Thread(target=inject, args=(run_id, args.steps // 3, 10.0, fault_info)),
                "kill": threading.Thread(target=freeze, args=(run_id, args.steps // 3, fault_info, "-KILL")),
                "hang": threading.Thread(target=freeze, args=(run_id, args.steps // 3, fault_info)),
                "spare": threading.Thread(target=inject, args=(run_id, args.steps // 3, None, fault_info)),
                "grow": threading.Thread(target=grow_back, args=(run_id, args.steps // 3, fault_info))}.get(kind)
    if injector:
        injector.start()
    t0 = time.time()
    res = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.time() - t0
    if injector:
        injector.join()
    if kind == "spare":
        start_worker2()
    if kind in ("fault", "grow", "spare"):
        # The cluster's names on worker2 again (podman rewrote its /etc/hosts when it started), the spare kept.
        localcluster("up", *(["--spares", "1"] if kind == "spare" else []))
    if res.returncode != 0:
        raise SystemExit(f"[bench-recovery] {run_id} failed:\n" + "\n".join(res.stdout.splitlines()[-30:]))
    summary = json.loads((ROOT / "runs" / run_id / "summary.json").read_text())
    out = {"wall_s": wall, "goodput": summary["goodput"], "attempts": len(summary["attempts"])}
    if injector:
        second = summary["attempts"][1]
        out.update(fault_to_first_step_s=second["fault_to_first_step"], recomputed_steps=second["recomputed_steps"])
    if kind == "hang":
        out["detection_s"] = detection(run_id, fault_info["fault_at"])
    if kind == "grow":
        out.update(grow_figures(summary, run_id, fault_info))
    if kind == "spare" and summary["attempts"][1]["nodes"] != ["worker1", "worker3"]:
        raise SystemExit(f"[bench-recovery] {run_id}: the spare did not take worker2's place: "
                         f"{summary['attempts'][1]['nodes']}")
    return out


def grow_figures(summary: dict, run_id: str, fault_info: dict) -> dict:
    """The grow-back's figures: the attempts' widths, the seconds from worker2's start to the watch's stop of
    attempt 2 and to attempt 3's first step, and the steps attempt 3 recomputed."""
    kinds = [a["kind"] for a in summary["attempts"]]
    if kinds != ["lost", "grow", "success"]:
        raise SystemExit(f"[bench-recovery] {run_id} did not grow back: attempts {kinds}")
    third = summary["attempts"][2]
    back_at = fault_info["back_at"]
    return {"grow_detection_s": detection(run_id, back_at, attempt=2),
            "back_to_first_step_s": (third["first_step_time"] - back_at) if third.get("first_step_time") else None,
            "grow_recomputed_steps": third["recomputed_steps"]}


FAULTS = ("fault", "kill", "hang", "grow")

# Unexpected interruptions per node and day: 419 in a 54-day snapshot of Llama 3 405B's pre-training on 16,384 H100
# GPUs, eight to a server (2,048 nodes); 78% of them hardware. "The Llama 3 Herd of Models", Meta, 2024
# (arXiv:2407.21783), section 3.3.4.
INTERRUPTIONS_PER_NODE_DAY = 419 / 54 / 2048
# Restarting by hand: the failure noticed, and the run started again, an hour after it (an assumption of the
# projection, not a measurement); the recovery's own work follows as it does here.
BY_HAND_S = 3600.0


def projection(seconds_lost, nodes=(8, 64, 512), hours=24.0, by_hand=BY_HAND_S):
    """The goodput of an ``hours`` run on each number of ``nodes`` at INTERRUPTIONS_PER_NODE_DAY, each
    interruption costing ``seconds_lost`` (recovered by the collection) or ``by_hand`` more (restarted by hand)."""
    rows = []
    for n in nodes:
        count = n * INTERRUPTIONS_PER_NODE_DAY * hours / 24.0
        wall = hours * 3600.0
        rows.append({"nodes": n, "interruptions": count,
                     "goodput": max(0.0, 1.0 - count * seconds_lost / wall),
                     "by_hand": max(0.0, 1.0 - count * (seconds_lost + by_hand) / wall)})
    return rows


def print_projection(rows, seconds_lost):
    print("\nOn paper: a 24-hour run at Llama 3's interruption rate (%.4f per node and day), each lost node costing "
          "%.0f s (measured above) or an hour more by hand:" % (INTERRUPTIONS_PER_NODE_DAY, seconds_lost))
    print("| nodes | interruptions | goodput, recovered | goodput, by hand |\n|---|---|---|---|")
    for row in rows:
        print("| %d | %.2f | %.4f | %.4f |" % (row["nodes"], row["interruptions"], row["goodput"], row["by_hand"]))


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _seconds(value):
    return "%.1f" % value if value is not None else "unknown"


def report(results: dict, args) -> dict:
    """The medians of each kind, and each faulted kind's per-round ratios to the clean run and seconds lost."""
    med = dict((k, dict((m, _median(r[m] for r in v)) for m in v[0])) for k, v in results.items())
    ratios, lost = {}, {}
    faults = [k for k in results if k != "clean"]
    for kind in faults:
        pairs = list(zip(results[kind], results["clean"]))
        ratios[kind] = {"wall": _median(f["wall_s"] / c["wall_s"] for f, c in pairs),
                        "goodput": _median(f["goodput"] / c["goodput"] for f, c in pairs)}
        lost[kind] = _median(f["wall_s"] - c["wall_s"] for f, c in pairs)
    print(f"\nmedians over {args.rounds} rounds ({args.model}, {args.steps} steps, micro-batch {args.micro_batch}):")
    for kind, m in med.items():
        print(f"  {kind:6s} " + "  ".join(f"{k} {v:.3g}" for k, v in m.items() if v is not None))
    for kind in faults:
        figures = (kind, kind, ratios[kind]["wall"], ratios[kind]["goodput"], lost[kind],
                   med[kind]["fault_to_first_step_s"])
        print("%s: median of the per-round ratios (%s / clean): wall time %.2f, goodput %.2f; seconds lost %.1f; "
              "fault -> next attempt's first step %.1f s" % figures)
    if "hang" in med:
        print("hang: SIGSTOP -> the watch's abort %s s (median)" % _seconds(med["hang"].get("detection_s")))
    if "grow" in med:
        print("grow: worker2 started -> the watch's stop of attempt 2 %s s, -> attempt 3's first step %s s "
              "(medians)" % (_seconds(med["grow"].get("grow_detection_s")),
                             _seconds(med["grow"].get("back_to_first_step_s"))))
    rows = projection(lost["fault"]) if lost.get("fault") is not None else []
    if rows:
        print_projection(rows, lost["fault"])
    return {"rounds": results, "medians": med, "ratios": ratios, "seconds_lost": lost, "model": args.model,
            "steps": args.steps, "micro_batch": args.micro_batch, "projection": rows}


def run_rounds(args, kinds, results, stamp) -> None:
    for rnd in range(1, args.rounds + 1):
        for kind in kinds:
            res = train(f"bench-recovery-{stamp}-{rnd}-{kind}", args, kind)
            results[kind].append(res)
            print(f"round {rnd} {kind:6s} " + "  ".join(f"{k} {v:.3g}" for k, v in res.items() if v is not None),
                  flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--micro-batch", type=int, default=16)
    p.add_argument("--model", default="llama-tiny")
    p.add_argument("--json", default=str(ROOT / "tests" / "output" / "bench-recovery.json"))
    p.add_argument("--no-spare", dest="spare", action="store_false", help="leave the spare case out")
    p.add_argument("--cases", default=",".join(FAULTS + ("spare",)),
                   help="the faulted cases to run, comma-separated (the clean run always runs)")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.steps < 30:
        p.error("--rounds must be at least 1 and --steps at least 30")
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = sorted(set(cases) - set(FAULTS + ("spare",)))
    if unknown or not cases:
        p.error("--cases: %s is not among %s" % (", ".join(unknown) or "nothing", ", ".join(FAULTS + ("spare",))))
    args.spare = args.spare and "spare" in cases
    faults = tuple(c for c in FAULTS if c in cases)
    if not INVENTORY.exists():
        raise SystemExit("[bench-recovery] no local cluster: make cluster, then ansible-playbook site.yml")
    results: dict = dict((kind, []) for kind in ("clean",) + faults + (("spare",) if args.spare else ()))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_rounds(args, ("clean",) + faults, results, stamp)
    if args.spare:
        # Last, and apart: with a spare in the inventory, the lost node of the other cases would get one too.
        provision_spare()
        try:
            run_rounds(args, ("spare",), results, stamp)
        finally:
            localcluster("up")  # the spare removed again
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report(results, args), indent=2) + "\n")
    print(f"\n{out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
