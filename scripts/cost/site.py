"""What site.yml costs when nothing changed, against the first site.yml on the same fresh nodes.

    make bench-site [SIZES=2,8] [ROUNDS=3]
    .venv/bin/python scripts/cost/site.py [--sizes 2,8] [--rounds 3] [--json FILE]

For each size N (workers; N + 1 nodes with the coordinator): the local cluster is made again with N
workers (fresh containers from the node image, scripts/localcluster.py down + up), site.yml runs once
(the first), then ROUNDS times with nothing to change; each of those must end with changed=0 on every
node, or the benchmark fails.  Prints, per size, the first run's time, the no-op runs' median and
spread, their ratio, and the no-op time per node; writes them as JSON.

The controller's wheelhouse (~/.cache/multinode-deepspeed/wheelhouse) is kept between sizes, as it is
between a user's runs; the nodes start bare each time.  The cluster is left at the last size.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
RECAP = re.compile(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def localcluster(*args: str) -> None:
    res = subprocess.run([str(BIN / "python"), str(ROOT / "scripts" / "localcluster.py"), *args], cwd=ROOT,
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise SystemExit(f"[bench-site] localcluster.py {' '.join(args)} failed:\n{res.stdout[-2000:]}{res.stderr[-2000:]}")


def site(label: str) -> dict:
    """One site.yml: its wall time and what each host's recap says changed."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
               PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    t0 = time.time()
    res = subprocess.run([str(BIN / "ansible-playbook"), "site.yml"], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=False)
    wall = time.time() - t0
    out = ROOT / "tests" / "output" / f"bench-site-{label}-{int(t0)}.log"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(res.stdout + res.stderr)
    if res.returncode != 0:
        raise SystemExit(f"[bench-site] site.yml ({label}) failed (log {out}):\n" + "\n".join(res.stdout.splitlines()[-30:]))
    changed = dict((m.group(1), int(m.group(2))) for m in RECAP.finditer(res.stdout))
    return {"wall_s": wall, "changed": changed, "log": str(out)}


def one_size(workers: int, rounds: int) -> dict:
    nodes = workers + 1
    print(f"[bench-site] {nodes} nodes: a fresh cluster of {workers} workers", flush=True)
    localcluster("down")
    localcluster("up", "--workers", str(workers))
    first = site(f"{nodes}-first")
    print(f"[bench-site] {nodes} nodes: first site.yml {first['wall_s']:.1f} s", flush=True)
    noops = []
    for rnd in range(1, rounds + 1):
        res = site(f"{nodes}-noop{rnd}")
        drifted = dict((h, n) for h, n in res["changed"].items() if n)
        if drifted:
            raise SystemExit(f"[bench-site] {nodes} nodes, no-op round {rnd}: changed on {drifted} (log {res['log']})")
        noops.append(res["wall_s"])
        print(f"[bench-site] {nodes} nodes: no-op {rnd} {res['wall_s']:.1f} s (changed=0 everywhere)", flush=True)
    median = statistics.median(noops)
    return {"nodes": nodes, "workers": workers, "first_s": first["wall_s"], "noop_s": noops,
            "noop_median_s": median, "noop_spread_s": max(noops) - min(noops),
            "ratio": median / first["wall_s"], "noop_per_node_s": median / nodes}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="2,8", help="worker counts, comma-separated (nodes = workers + 1)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=str(ROOT / "tests" / "output" / "bench-site.json"))
    args = p.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        p.error("--sizes: worker counts such as 2,8")
    if not sizes or min(sizes) < 1 or max(sizes) > 16 or args.rounds < 1:
        p.error("--sizes: 1 to 16 workers each; --rounds: at least 1")
    results = [one_size(n, args.rounds) for n in sizes]
    print(f"\n{'nodes':>6s}{'first (s)':>12s}{'no-op median (s)':>19s}{'spread (s)':>12s}{'ratio':>8s}"
          f"{'no-op per node (s)':>20s}")
    for r in results:
        print(f"{r['nodes']:6d}{r['first_s']:12.1f}{r['noop_median_s']:19.1f}{r['noop_spread_s']:12.1f}"
              f"{r['ratio']:8.2f}{r['noop_per_node_s']:20.2f}")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"sizes": results, "rounds": args.rounds}, indent=2) + "\n")
    print(f"\n{out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
