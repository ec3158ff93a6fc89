"""The least a launch can cost on this machine as the cluster grows: pdsh's start and a node read, with no Ansible.

    make bench-floor [SIZES=2,16] [ROUNDS=3]
    .venv/bin/python scripts/cost/floor.py [--sizes 2,16] [--rounds 3] [--json FILE]

On the warm, provisioned local cluster, on its coordinator, as the run's account: for each size N, N node names
spread over the cluster's workers (each name is a worker's address under a name of its own; the worker's host
key is checked under the worker's name), then ROUNDS times:

  start       pdsh to the N names; each name's shell starts a Python process that imports the node agent's module
              and records the moment it started (what a node's agent is), then becomes an import of DeepSpeed's
              launcher (what launch.py does next, on the same cores): pdsh's start -> the last record
  read        pdsh to the N names; each runs one Python start that reads the node (its venv's package names,
              its memory) and prints it: pdsh's start -> pdsh's end

each twice: with a new SSH login per name (what pdsh does: "login"), and over SSH connections opened before the
timed command and kept open (ControlMaster, ControlPersist: "kept").  Nothing of the collection runs: these are
the floor under any launch that reads every node and starts an agent on each from the coordinator.  Prints the
medians, their growth from the smallest size, and writes tests/output/bench-floor.json.  The names, their SSH
configuration and the kept connections are removed at the end.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from cost.launch import (  # noqa: E402  pylint: disable=wrong-import-position
    COORD, INVENTORY, VENV, podman_exec, settle, workers)

WORK = "/tmp/mnds-floor"  # on the coordinator, the run account's: the SSH configurations and kept connections
OUT = "/tmp/mnds-floor-out"  # on each worker: one record per name
PY = f"{VENV}/bin/python"
MAX_NAMES = 64  # the largest cluster the collection is made for

# Each name's agent: the interpreter starts, the agent's module is imported, the moment is recorded under the name.
AGENT = ("import sys, time; t = time.time(); import multinode_ds.agent; "
         f"open('{OUT}/' + sys.argv[1], 'w').write(repr(t))")
READ = ("import glob, json, socket; print(json.dumps({'host': socket.gethostname(), 'packages': len(glob.glob("
        f"'{VENV}/lib/python3*/site-packages/*.dist-info')), 'memory': open('/proc/meminfo').readline().split()[1]}}))")
# Run on the coordinator: pdsh with the given SSH configuration to the given names, the remote command; prints the
# start and end times.
TIMED = ("import os, subprocess, sys, time; cfg, names, cmd = sys.argv[1:4]; "
         "env = dict(os.environ, PDSH_SSH_ARGS='-F ' + cfg + ' -x -l%u %h'); t0 = time.time(); "
         "rc = subprocess.run(['pdsh', '-S', '-R', 'ssh', '-f', '1024', '-w', names, cmd], env=env, "
         "stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True); t1 = time.time(); "
         "print(repr(t0), repr(t1), rc.returncode); sys.stderr.write(rc.stderr[-2000:])")


def names_for(size: int, hosts: list) -> list:
    """``size`` names, each a worker of ``hosts`` in turn: [(name, worker)]."""
    return [(f"mnds-floor-{i + 1}", hosts[i % len(hosts)]) for i in range(size)]


def ssh_config(names: list, worker_config: dict, kept: bool) -> str:
    """An ssh_config with one Host block per name: the worker's address, user and key, its host key checked under
    the worker's own name; ``kept``: connections shared and kept open (one per name, as one per node)."""
    out = []
    for name, worker in names:
        cfg = worker_config[worker]
        out.append(f"Host {name}\n    HostName {cfg['hostname']}\n    HostKeyAlias {worker}\n    User {cfg['user']}\n"
                   f"    IdentityFile {cfg['identityfile']}\n    IdentitiesOnly yes\n    StrictHostKeyChecking yes\n"
                   "    BatchMode yes\n    ConnectTimeout 10\n")
        if kept:
            out.append(f"    ControlMaster auto\n    ControlPath {WORK}/cm-%n\n    ControlPersist 300\n")
    return "".join(out)


def effective_config(worker: str) -> dict:
    """What the run account's SSH uses to reach ``worker`` (``ssh -G``): its address, user and key."""
    out = podman_exec(COORD, f"ssh -G {shlex.quote(worker)}").stdout
    cfg = {}
    for line in out.splitlines():
        key, value = (line.split(" ", 1) + [""])[:2]
        if key in ("hostname", "user", "identityfile") and key not in cfg:
            cfg[key] = value.strip()
    return cfg


def pdsh(cfg: str, names: list, cmd: str) -> tuple:
    """pdsh from the coordinator, timed there: (start, end)."""
    res = podman_exec(COORD, "python3 -c " + " ".join(shlex.quote(a) for a in (
        TIMED, cfg, ",".join(pair[0] for pair in names), cmd)))
    t0, t1, rc = res.stdout.split()
    if rc != "0":
        raise SystemExit(f"[bench-floor] pdsh to {len(names)} names failed (rc={rc}): {res.stderr.strip()[-800:]}")
    return float(t0), float(t1)


def last_record(names: list) -> float:
    """The latest start any name's agent recorded (each worker holds its names' records)."""
    out = []
    for worker in sorted(set(pair[1] for pair in names)):
        text = podman_exec(f"mnds-{worker}", f"for f in {OUT}/*; do cat \"$f\"; echo; done").stdout
        out += [float(x) for x in text.split()]
    if len(out) != len(names):
        raise SystemExit(f"[bench-floor] {len(out)} of {len(names)} agents recorded their start")
    return max(out)


def measure(names: list, kept: bool) -> dict:
    cfg = f"{WORK}/{'kept' if kept else 'login'}.cfg"
    if kept:  # the connections, opened before the timed commands
        pdsh(cfg, names, "true")
    for worker in sorted(set(pair[1] for pair in names)):
        podman_exec(f"mnds-{worker}", f"rm -rf {OUT} && mkdir -p {OUT}")
    settle()
    start = f"setsid -f {PY} -c {shlex.quote(AGENT)} %h </dev/null >/dev/null 2>&1 && " \
            f"exec env DS_ACCELERATOR=cpu {PY} -c 'import deepspeed.launcher.launch'"
    t0 = pdsh(cfg, names, start)[0]
    started = last_record(names) - t0
    settle()
    t0, t1 = pdsh(cfg, names, f"{PY} -c {shlex.quote(READ)}")
    return {"start_s": started, "read_s": t1 - t0}


def close(names: list) -> None:
    for name in (pair[0] for pair in names):
        podman_exec(COORD, f"ssh -F {WORK}/kept.cfg -O exit {name}", check=False)


def run_floor(sizes: list, rounds: int) -> tuple:
    """Measure every size ``rounds`` times, each with a login per name and with kept connections: (the rounds'
    figures, their medians), each by size, then "login"/"kept", then "start_s"/"read_s"."""
    hosts = [pair[0] for pair in workers()]
    config = dict((w, effective_config(w)) for w in hosts)
    every = names_for(sizes[-1], hosts)
    podman_exec(COORD, f"rm -rf {WORK} && mkdir -m 700 {WORK}")
    for kind in ("login", "kept"):
        text = ssh_config(every, config, kind == "kept")
        podman_exec(COORD, f"umask 077 && printf '%s' {shlex.quote(text)} > {WORK}/{kind}.cfg")
    results = dict((n, {"login": [], "kept": []}) for n in sizes)
    try:
        for rnd in range(1, rounds + 1):
            for n in sizes:
                for kind in ("login", "kept"):
                    res = measure(names_for(n, hosts), kind == "kept")
                    results[n][kind].append(res)
                    print(f"round {rnd} {n:3d} names {kind:5s}  start {res['start_s']:5.2f} s   read "
                          f"{res['read_s']:5.2f} s", flush=True)
    finally:
        close(every)
        podman_exec(COORD, f"rm -rf {WORK}", check=False)
        for worker in hosts:
            podman_exec(f"mnds-{worker}", f"rm -rf {OUT}", check=False)
    med = dict((n, dict((kind, dict((m, statistics.median(r[m] for r in runs)) for m in ("start_s", "read_s")))
                        for kind, runs in by.items())) for n, by in results.items())
    return results, med


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="2,16", help="node names per measurement, comma-separated (default 2,16)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default=str(ROOT / "tests" / "output" / "bench-floor.json"))
    args = p.parse_args(argv)
    try:
        sizes = sorted(set(int(s) for s in args.sizes.split(",") if s.strip()))
    except ValueError:
        p.error(f"--sizes {args.sizes!r}: comma-separated counts, e.g. 2,16")
    if not sizes or sizes[0] < 1 or sizes[-1] > MAX_NAMES or args.rounds < 1:
        p.error(f"--sizes: counts from 1 to {MAX_NAMES}; --rounds: at least 1")
    if not INVENTORY.exists():
        raise SystemExit("[bench-floor] no local cluster: make cluster, then ansible-playbook site.yml")
    hosts = [pair[0] for pair in workers()]
    results, med = run_floor(sizes, args.rounds)
    print(f"\nmedians over {args.rounds} rounds ({len(hosts)} workers; start: to the last agent started, read: "
          "to pdsh's end):")
    print(f"{'names':>6s}{'start, login':>14s}{'start, kept':>13s}{'read, login':>13s}{'read, kept':>12s}")
    for n in sizes:
        m = med[n]
        print(f"{n:6d}{m['login']['start_s']:14.2f}{m['kept']['start_s']:13.2f}{m['login']['read_s']:13.2f}"
              f"{m['kept']['read_s']:12.2f}")
    growth = {}
    if len(sizes) > 1:
        lo, hi = med[sizes[0]], med[sizes[-1]]
        growth = dict((kind, dict((m, hi[kind][m] - lo[kind][m]) for m in ("start_s", "read_s"))) for kind in lo)
        print(f"{'growth':>6s}{growth['login']['start_s']:14.2f}{growth['kept']['start_s']:13.2f}"
              f"{growth['login']['read_s']:13.2f}{growth['kept']['read_s']:12.2f}   ({sizes[0]} -> {sizes[-1]} names)")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"workers": hosts, "rounds": results, "medians": med, "growth": growth,
                               "sizes": sizes}, indent=2) + "\n")
    print(f"\n{out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
