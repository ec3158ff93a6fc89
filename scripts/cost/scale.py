"""What Ansible's part of a launch and of a no-op site.yml costs as the cluster grows, on the local cluster.

    make bench-scale [SIZES=2,4,8,16] [ROUNDS=2] [STEPS=5]
    .venv/bin/python scripts/cost/scale.py [--sizes 2,4,8,16] [--rounds 2] [--steps 5] [--json FILE]

For each size N (workers, one rank each; N + 1 nodes with the coordinator): the local cluster is made
again with N workers, site.yml runs (the first, timed) and once more with nothing to change (timed,
per node), then train.yml -e preflight=false -e steps=STEPS runs ROUNDS times.  For each launch:

  before   command start -> the last agent started (nodes/*.json "started"): Ansible's part of the start
  ranks    the last agent started -> rank 0's first step: the ranks' own start, reported apart -
           every rank shares this machine's 2 cores, so it grows with N for reasons no play controls
  exit     the last rank's "done" record -> the last launcher's exit (its agent records the moment): the ranks'
           and DeepSpeed's launcher's own exit, reported apart for the same reason
  after    the last launcher's exit -> the command's end: Ansible's part of the end (the watch's last call,
           the collection, the summary)

Ansible's part is before + after; "done -> end" (exit + after) is printed too.  Each launch also counts the
controller's own CPU time (ansible-playbook and everything it waited for: its forks, their SSH clients), printed
per node of the job.  After the launches, on the same cluster, make bench-floor's measurement (scripts/cost/floor.py,
no Ansible) with one name per worker, ROUNDS times: its start + read with a login per node and over kept
connections.  Prints a table (medians over the rounds), its ratio to the smallest size, and from the smallest size
to the largest how much Ansible's part grew against the floor's growth over kept connections (the target: at most
1.3 times), draws tests/output/bench-scale.png and writes the numbers as JSON.  The cluster is left at the last
size.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
sys.path.insert(0, str(ROOT / "scripts"))
from cost.floor import run_floor  # noqa: E402  pylint: disable=wrong-import-position
from cost.site import localcluster, site  # noqa: E402  pylint: disable=wrong-import-position


def records(path: Path) -> list[dict]:
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's children that ended: ansible-playbook and everything it
    waited for (its forks, their SSH clients) - the controller's own work."""
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def launch(run_id: str, steps: int) -> dict:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
               PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    cpu0 = children_cpu()
    t0 = time.time()
    res = subprocess.run([str(BIN / "ansible-playbook"), "train.yml", "-e", "preflight=false", "-e", f"steps={steps}",
                          "-e", f"run_id={run_id}"], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    end = time.time()
    cpu = children_cpu() - cpu0
    if res.returncode != 0:
        raise SystemExit(f"[bench-scale] train.yml {run_id} failed:\n" + "\n".join(res.stdout.splitlines()[-30:]))
    return dict(phases(ROOT / "runs" / run_id, t0, end), run_id=run_id, controller_cpu_s=cpu)


def phases(run: Path, t0: float, end: float) -> dict:
    """A collected run's phases, from its agents' records (nodes/*.json) and its ranks' (metrics/rank*.jsonl)."""
    nodes = [json.loads(p.read_text()) for p in (run / "nodes").glob("*.json")]
    started = max(n["started"] for n in nodes)
    metrics = [records(p) for p in sorted((run / "metrics").glob("rank*.jsonl"))]
    first = min(r["time"] for r in metrics[0] if r.get("event") == "step")
    done = max(r["time"] for recs in metrics for r in recs if r.get("event") == "done")
    # The last launcher's exit: the time its agent recorded the exit code (it waits on it ten times a second).
    exits = [n["time"] for n in nodes if n.get("role") == "launcher" and n.get("exit_code") is not None]
    exited = max(exits) if exits else done
    return {"before_s": started - t0, "ranks_s": first - started, "exit_s": exited - done, "after_s": end - exited,
            "done_to_end_s": end - done, "wall_s": end - t0, "ranks": len(metrics)}


def one_size(workers: int, rounds: int, steps: int) -> dict:
    nodes = workers + 1
    print(f"[bench-scale] {nodes} nodes: a fresh cluster of {workers} workers", flush=True)
    localcluster("down")
    localcluster("up", "--workers", str(workers))
    first = site(f"scale-{nodes}-first")
    noop = site(f"scale-{nodes}-noop")
    print(f"[bench-scale] {nodes} nodes: site.yml first {first['wall_s']:.1f} s, no-op {noop['wall_s']:.1f} s",
          flush=True)
    launches = []
    for rnd in range(1, rounds + 1):
        res = launch(f"bench-scale-{nodes}-{int(time.time())}-{rnd}", steps)
        launches.append(res)
        print(f"[bench-scale] {nodes} nodes, launch {rnd}: before {res['before_s']:.1f} s, ranks {res['ranks_s']:.1f} s,"
              f" exit {res['exit_s']:.1f} s, after {res['after_s']:.1f} s, whole {res['wall_s']:.1f} s"
              f" ({res['ranks']} ranks), the controller's CPU {res['controller_cpu_s']:.1f} s", flush=True)
    med = dict((k, statistics.median(r[k] for r in launches))
               for k in ("before_s", "ranks_s", "exit_s", "after_s", "done_to_end_s", "wall_s", "controller_cpu_s"))
    med["ansible_s"] = med["before_s"] + med["after_s"]
    med["controller_cpu_per_node_s"] = med["controller_cpu_s"] / nodes
    # The floor on this same cluster, now: one name per worker (make bench-floor's start and read, no Ansible).
    floor = run_floor([workers], rounds)[1][workers]
    for kind in ("login", "kept"):
        floor[kind]["sum_s"] = floor[kind]["start_s"] + floor[kind]["read_s"]
    print(f"[bench-scale] {nodes} nodes: the floor (start + read) with a login per node {floor['login']['sum_s']:.2f} s,"
          f" over kept connections {floor['kept']['sum_s']:.2f} s", flush=True)
    return {"nodes": nodes, "workers": workers, "site_first_s": first["wall_s"], "site_noop_s": noop["wall_s"],
            "site_noop_per_node_s": noop["wall_s"] / nodes, "launches": launches, "median": med, "floor": floor}


def growth(results: list[dict]) -> dict:
    """From the smallest size to the largest: how much Ansible's part and the floor (kept connections, and a login
    per node) grew, and Ansible's growth as a multiple of the kept floor's (the target: at most 1.3)."""
    lo, hi = results[0], results[-1]
    ansible = hi["median"]["ansible_s"] - lo["median"]["ansible_s"]
    kept = hi["floor"]["kept"]["sum_s"] - lo["floor"]["kept"]["sum_s"]
    login = hi["floor"]["login"]["sum_s"] - lo["floor"]["login"]["sum_s"]
    return {"from_workers": lo["workers"], "to_workers": hi["workers"], "ansible_s": ansible, "floor_kept_s": kept,
            "floor_login_s": login, "ansible_to_floor_kept": ansible / kept if kept > 0 else None,
            "ansible_to_floor_login": ansible / login if login > 0 else None}


def plot(results: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    xs = [r["workers"] for r in results]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for key, label in (("before_s", "start (Ansible)"), ("after_s", "end (Ansible)"), ("ranks_s", "ranks' own start"),
                       ("exit_s", "ranks' own exit")):
        left.plot(xs, [r["median"][key] for r in results], marker="o", label=label)
    left.set_xlabel("workers")
    left.set_ylabel("seconds (median)")
    left.set_title("A launch, by phase")
    left.legend(fontsize="small")
    right.plot(xs, [r["site_noop_per_node_s"] for r in results], marker="o")
    right.set_xlabel("workers")
    right.set_ylabel("seconds per node")
    right.set_title("site.yml with nothing to change")
    for ax in (left, right):
        ax.grid(True, alpha=0.3)
        ax.set_xticks(xs)
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write(results: list[dict], args, out: Path) -> None:
    ordered = sorted(results, key=lambda r: r["workers"])
    base = ordered[0]["median"]["ansible_s"]
    out.write_text(json.dumps({"sizes": ordered, "rounds": args.rounds, "steps": args.steps,
                               "ansible_ratio_to_smallest": [r["median"]["ansible_s"] / base for r in ordered],
                               "growth": growth(ordered) if len(ordered) > 1 else None},
                              indent=2) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="2,4,8,16", help="worker counts, comma-separated (1 to 16)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--json", default=str(ROOT / "tests" / "output" / "bench-scale.json"))
    args = p.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        p.error("--sizes: worker counts such as 2,4,8,16")
    if not sizes or min(sizes) < 1 or max(sizes) > 16 or args.rounds < 1 or args.steps < 1:
        p.error("--sizes: 1 to 16 workers each; --rounds and --steps: at least 1")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []
    for n in sizes:  # the numbers are written after every size: a later size that fails keeps the earlier ones
        results.append(one_size(n, args.rounds, args.steps))
        write(results, args, out)
    results.sort(key=lambda r: r["workers"])
    base = results[0]["median"]["ansible_s"]
    print(f"\n{'workers':>8s}{'start (s)':>11s}{'end (s)':>9s}{'Ansible (s)':>13s}{'ratio':>7s}{'ranks start (s)':>17s}"
          f"{'ranks exit (s)':>16s}{'done->end (s)':>15s}{'whole (s)':>11s}{'site no-op/node (s)':>21s}"
          f"{'floor kept (s)':>16s}{'floor login (s)':>17s}{'controller CPU/node (s)':>25s}")
    for r in results:
        m = r["median"]
        print(f"{r['workers']:8d}{m['before_s']:11.1f}{m['after_s']:9.1f}{m['ansible_s']:13.1f}"
              f"{m['ansible_s'] / base:7.2f}{m['ranks_s']:17.1f}{m['exit_s']:16.1f}{m['done_to_end_s']:15.1f}"
              f"{m['wall_s']:11.1f}{r['site_noop_per_node_s']:21.2f}{r['floor']['kept']['sum_s']:16.2f}"
              f"{r['floor']['login']['sum_s']:17.2f}{m['controller_cpu_per_node_s']:25.3f}")
    if len(results) > 1:
        g = growth(results)
        kept = "%.2f" % g["ansible_to_floor_kept"] if g["ansible_to_floor_kept"] else "n/a"
        login = "%.2f" % g["ansible_to_floor_login"] if g["ansible_to_floor_login"] else "n/a"
        print(f"\nfrom {g['from_workers']} to {g['to_workers']} workers: Ansible's part grew by {g['ansible_s']:.2f} s,"
              f" the floor over kept connections by {g['floor_kept_s']:.2f} s, with a login per node by "
              f"{g['floor_login_s']:.2f} s: {kept} times the kept floor's growth (target: at most 1.3), "
              f"{login} times the login floor's")
    plot(results, out.with_suffix(".png"))
    print(f"\n{out}\n{out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
