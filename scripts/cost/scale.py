"""What Ansible's part of a launch and of a no-op site.yml costs as the cluster grows, on the local cluster.

    make bench-scale [SIZES=2,4,8,16] [ROUNDS=2] [STEPS=5]
    .venv/bin/python scripts/cost/scale.py [--sizes 2,4,8,16] [--rounds 2] [--steps 5] [--backend B] [--json FILE]
    .venv/bin/python scripts/cost/scale.py --from-json FILE     # the report of an earlier measurement again

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
1.3 times), then, on paper, a launch at 64, 256 and 1024 nodes from the measured per-node constants (``projection``:
Ansible's waves of forks, the controller's CPU, pdsh's fan-out of logins) and its first bottleneck at each size.
Draws tests/output/bench-scale.png and writes the numbers as JSON.  The cluster is left at the last size.
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
from cost.launch import workers as cost_workers  # noqa: E402  pylint: disable=wrong-import-position
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


def launch(run_id: str, steps: int, backend: str = "") -> dict:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
               PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    cpu0 = children_cpu()
    t0 = time.time()
    argv = [str(BIN / "ansible-playbook"), "train.yml", "-e", "preflight=false", "-e", f"steps={steps}",
            "-e", f"run_id={run_id}"] + (["-e", f"backend={backend}"] if backend else [])
    res = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
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


def one_size(workers: int, rounds: int, steps: int, keep: bool = False, backend: str = "") -> dict:
    nodes = workers + 1
    if keep and len(cost_workers()) == workers:
        # The cluster already has this size, provisioned (--keep): its launches and floor only.
        print(f"[bench-scale] {nodes} nodes: the cluster as it is (no site.yml timed)", flush=True)
        first = noop = {"wall_s": None}
    else:
        print(f"[bench-scale] {nodes} nodes: a fresh cluster of {workers} workers", flush=True)
        localcluster("down")
        localcluster("up", "--workers", str(workers))
        first = site(f"scale-{nodes}-first")
        noop = site(f"scale-{nodes}-noop")
        print(f"[bench-scale] {nodes} nodes: site.yml first {first['wall_s']:.1f} s, no-op {noop['wall_s']:.1f} s",
              flush=True)
    launches = []
    for rnd in range(1, rounds + 1):
        res = launch(f"bench-scale-{nodes}-{int(time.time())}-{rnd}", steps, backend)
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
            "site_noop_per_node_s": noop["wall_s"] / nodes if noop["wall_s"] is not None else None,
            "launches": launches, "median": med, "floor": floor}


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
    right.plot(xs, [r["site_noop_per_node_s"] if r["site_noop_per_node_s"] is not None else float("nan")
                    for r in results], marker="o")
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
                               "backend": args.backend or "the inventory's (pdsh)",
                               "ansible_ratio_to_smallest": [r["median"]["ansible_s"] / base for r in ordered],
                               "growth": growth(ordered) if len(ordered) > 1 else None},
                              indent=2) + "\n")


# The projection's sizes (nodes), and its assumption of the controller's and the coordinator's cores (a real
# controller, not this 2-core machine).
PROJECT_NODES = (64, 256, 1024)
PROJECT_CORES = 8
FORKS = 64  # ansible.cfg


def constants(results: list[dict]) -> dict:
    """The per-node constants the projection scales, from the smallest size and the largest measured:

    cpu_fixed_s, cpu_per_node_s   the controller's CPU per launch: what every launch costs, and each node more;
    login_cpu_per_node_s          a pdsh login's CPU more than a kept connection's, per node (on this machine both
                                  ends of the login share two cores: its wall-clock growth times two);
    ansible_wave_s                Ansible's part at the smallest size: the play with every per-node task in one
                                  wave of forks."""
    lo, hi = results[0], results[-1]
    nodes = hi["nodes"] - lo["nodes"]
    cpu_per_node = (hi["median"]["controller_cpu_s"] - lo["median"]["controller_cpu_s"]) / nodes
    login_extra = ((hi["floor"]["login"]["sum_s"] - hi["floor"]["kept"]["sum_s"])
                   - (lo["floor"]["login"]["sum_s"] - lo["floor"]["kept"]["sum_s"]))
    return {"cpu_fixed_s": lo["median"]["controller_cpu_s"] - cpu_per_node * lo["nodes"],
            "cpu_per_node_s": cpu_per_node, "login_cpu_per_node_s": max(0.0, login_extra * 2 / nodes),
            "ansible_wave_s": lo["median"]["ansible_s"]}


def projection(results: list[dict], sizes=PROJECT_NODES, cores=PROJECT_CORES, forks=FORKS) -> list[dict]:
    """A launch's own cost at ``sizes`` nodes (the coordinator and the workers), on paper, from ``constants``:

    forks        Ansible runs each per-node task on at most ``forks`` nodes at once: ceil(nodes / forks) waves
    controller   the controller's CPU for the launch over its ``cores``
    fan-out      pdsh's logins from the coordinator, all at once (-f 1024), over its ``cores``

    Ansible's part is the larger of the waves and the CPU (they overlap), plus pdsh's fan-out; the nodes' own
    reads and agents run on their own CPUs at once and add no more as the cluster grows.  The first bottleneck is
    the part that grew most."""
    k = constants(results)
    out = []
    for nodes in sizes:
        waves = -(-nodes // forks)
        parts = {"forks_s": (waves - 1) * k["ansible_wave_s"],
                 "controller_s": (k["cpu_fixed_s"] + k["cpu_per_node_s"] * nodes) / cores,
                 "fanout_s": k["login_cpu_per_node_s"] * nodes / cores}
        launch = k["ansible_wave_s"] + max(parts["forks_s"], parts["controller_s"]) + parts["fanout_s"]
        out.append(dict(parts, nodes=nodes, waves=waves, launch_s=launch,
                        bottleneck=max(parts, key=parts.get)[:-2]))
    return out


def _shown(value, width, fmt):
    return format(value, f"{width}{fmt}") if value is not None else "-".rjust(width)


def report(results: list[dict]) -> None:
    results = sorted(results, key=lambda r: r["workers"])
    base = results[0]["median"]["ansible_s"]
    print(f"\n{'workers':>8s}{'start (s)':>11s}{'end (s)':>9s}{'Ansible (s)':>13s}{'ratio':>7s}{'ranks start (s)':>17s}"
          f"{'ranks exit (s)':>16s}{'done->end (s)':>15s}{'whole (s)':>11s}{'site no-op/node (s)':>21s}"
          f"{'floor kept (s)':>16s}{'floor login (s)':>17s}{'controller CPU/node (s)':>25s}")
    for r in results:
        m = r["median"]
        print(f"{r['workers']:8d}{m['before_s']:11.1f}{m['after_s']:9.1f}{m['ansible_s']:13.1f}"
              f"{m['ansible_s'] / base:7.2f}{m['ranks_s']:17.1f}{m['exit_s']:16.1f}{m['done_to_end_s']:15.1f}"
              f"{m['wall_s']:11.1f}{_shown(r['site_noop_per_node_s'], 21, '.2f')}{r['floor']['kept']['sum_s']:16.2f}"
              f"{r['floor']['login']['sum_s']:17.2f}{m['controller_cpu_per_node_s']:25.3f}")
    if len(results) < 2:
        return
    g = growth(results)
    kept = "%.2f" % g["ansible_to_floor_kept"] if g["ansible_to_floor_kept"] else "n/a"
    login = "%.2f" % g["ansible_to_floor_login"] if g["ansible_to_floor_login"] else "n/a"
    print(f"\nfrom {g['from_workers']} to {g['to_workers']} workers: Ansible's part grew by {g['ansible_s']:.2f} s,"
          f" the floor over kept connections by {g['floor_kept_s']:.2f} s, with a login per node by "
          f"{g['floor_login_s']:.2f} s: {kept} times the kept floor's growth (target: at most 1.3), "
          f"{login} times the login floor's")
    k = constants(results)
    print(f"\nthe constants: the controller's CPU per launch {k['cpu_fixed_s']:.2f} s + {k['cpu_per_node_s']:.3f} s "
          f"per node; a pdsh login {k['login_cpu_per_node_s']:.3f} CPU-s per node more than a kept connection; "
          f"one wave of Ansible's part {k['ansible_wave_s']:.2f} s")
    print(f"on paper, with {PROJECT_CORES} cores on the controller and on the coordinator and forks = {FORKS}:")
    print(f"{'nodes':>7s}{'waves':>7s}{'forks (s)':>11s}{'controller (s)':>16s}{'fan-out (s)':>13s}"
          f"{'launch (s)':>12s}  first bottleneck")
    for row in projection(results):
        print(f"{row['nodes']:7d}{row['waves']:7d}{row['forks_s']:11.1f}{row['controller_s']:16.1f}"
              f"{row['fanout_s']:13.1f}{row['launch_s']:12.1f}  {row['bottleneck']}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="2,4,8,16", help="worker counts, comma-separated (1 to 16)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--json", default=str(ROOT / "tests" / "output" / "bench-scale.json"))
    p.add_argument("--keep", action="store_true",
                   help="at a size the running cluster already has, provisioned: use it as it is (no site.yml timed)")
    p.add_argument("--backend", default="", help="the launch backend of the launches (-e backend=...; default: "
                   "the inventory's)")
    p.add_argument("--from-json", metavar="FILE",
                   help="measure nothing: the table, the growth against the floor and the projection of FILE")
    args = p.parse_args(argv)
    if args.from_json:
        report(json.loads(Path(args.from_json).read_text())["sizes"])
        return 0
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
        results.append(one_size(n, args.rounds, args.steps, keep=args.keep, backend=args.backend))
        write(results, args, out)
    report(results)
    plot(sorted(results, key=lambda r: r["workers"]), out.with_suffix(".png"))
    print(f"\n{out}\n{out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
