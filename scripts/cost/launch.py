"""What a launch through train.yml costs, against DeepSpeed's own launcher, on the local cluster.

    make bench-launch [ROUNDS=5]
    .venv/bin/python scripts/cost/launch.py [--rounds 5] [--steps 10] [--model llama-tiny] [--json FILE]

Back to back, N rounds each, the same model, steps and hosts (the workers of the local cluster,
one rank each):

  bare       on the coordinator: deepspeed --hostfile H --master_addr M --launcher pdsh
             --module multinode_ds.train ..., with the environment train.yml gives the ranks
  train      ansible-playbook train.yml (preflight on, the default: a passing preflight of the same
             job is reused; the first round's "force" run below records one); its ranks fork from each
             worker's warm process (multinode_ds.warm), which the first run started
  cold       the same with -e warm_start=false: every rank a fresh interpreter, as bare's
  no-pf      ansible-playbook train.yml -e preflight=false
  force      ansible-playbook train.yml -e preflight=force (the full preflight, every time)
  mitogen    (with --mitogen DIR) no-pf under Mitogen's mitogen_linear strategy

With --ssh-free, also:

  bare-nossh on every worker at once, by hand: deepspeed --hostfile H --no_ssh --node_rank <i> ... (DeepSpeed's
             launch without SSH between nodes, what a user of it types), the same environment
  ssh-free   ansible-playbook train.yml -e backend=ssh-free (a passing preflight reused: an untimed
             -e preflight=force run records it before the first round)

With --slurm (a cluster provisioned with site.yml -e slurm=true), instead:

  srun       on the coordinator: srun --nodes=2 --ntasks-per-node=1 --exclusive --kill-on-bad-exit=1
             bash -c '<RANK... from SLURM_*>; python -u -m multinode_ds.train ...', with the same
             .deepspeed_env: what a Slurm user would type
  sbatch     the batch script the slurm backend writes (an untimed train.yml -e slurm_submit=false first), then
             on the coordinator: sbatch <run>/slurm/job.sbatch, and squeue every 0.1 s until the job has left
             the queue: the same job as a batch job, by hand
  slurm      ansible-playbook train.yml -e backend=slurm -e preflight=false
  slurm-pf   ansible-playbook train.yml -e backend=slurm (the preflight reused: an untimed
             -e preflight=force run records it before the first round)

For each: seconds from the command's start to rank 0's first finished step (the time in its
first step record, metrics/rank0.jsonl; the nodes share this machine's clock), and the whole
command's wall time.  Each command starts on a quiet machine: the benchmark first waits (up to
15 s) until the CPU is idle, so that what the previous command left running - a run's report plots,
drawn after its play ended - is not counted in the next one.  Prints the medians and their ratios to
bare, and writes them as JSON.

Needs a provisioned local cluster (make cluster && ansible-playbook site.yml).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
try:
    import yaml
except ImportError:  # run with the machine's python3: go on in the project's venv (scripts/setup makes it)
    if Path(sys.executable).resolve() != (BIN / "python").resolve() and (BIN / "python").exists():
        os.execv(str(BIN / "python"), [str(BIN / "python"), __file__, *sys.argv[1:]])
    raise SystemExit("[bench-launch] PyYAML is missing: run scripts/setup first")
INVENTORY = ROOT / "inventories" / "local" / "hosts.yml"
CONF = ROOT / ".cache" / "podman" / "containers.conf"
VENV = "/opt/multinode-deepspeed/venv"
SHARED = "/shared"
COORD = "mnds-coord"


RUN_USER = "deepspeed"  # the account train.yml runs as (ssh_mesh_user's default): only it has the cluster key


def podman_exec(node_container: str, script: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(["podman", "exec", "--user", RUN_USER, "--workdir", "/tmp", node_container, "sh", "-c",
                          script], capture_output=True, text=True,
                         env=dict(os.environ, CONTAINERS_CONF=str(CONF)), check=False)
    if check and res.returncode != 0:
        raise SystemExit(f"[bench-launch] {node_container}: {script[:80]}... failed: {res.stderr.strip()[-800:]}")
    return res


def workers() -> list[tuple[str, str]]:
    inv = yaml.safe_load(INVENTORY.read_text())["all"]["children"]
    return [(name, h["ansible_host"]) for name, h in inv["workers"]["hosts"].items()]


def first_step_time(metrics: str) -> float | None:
    for line in metrics.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == "step":
            return float(rec["time"])
    return None


def prepare_bare(run_dir: str, hosts: list) -> None:
    """The run's directory, its hostfile and its .deepspeed_env (with the job's NCCL/gloo settings that
    provisioning wrote), as a user would make them, before the launcher is timed."""
    env_lines = ["DS_ACCELERATOR=cpu", "PYTHONUNBUFFERED=1", "OMP_NUM_THREADS=1",
                 f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                 "TORCH_EXTENSIONS_DIR=/opt/multinode-deepspeed/torch_extensions"]
    prep = (f"mkdir -p {run_dir}/logs && cd {run_dir} && "
            + "printf '%s\\n' " + " ".join(shlex.quote(f"{h[0]} slots=1") for h in hosts) + " > hostfile && "
            + "{ printf '%s\\n' " + " ".join(shlex.quote(line) for line in env_lines)
            + "; grep -E '^[A-Za-z_][A-Za-z0-9_]*=' /etc/multinode-deepspeed/deepspeed_env || true; } > .deepspeed_env")
    podman_exec(COORD, prep)


def cpu_busy(window: float = 0.25) -> float:
    """The share of this machine's CPU time that was busy over ``window`` seconds (0..1, /proc/stat)."""
    def read():
        with open("/proc/stat") as fh:
            v = [int(x) for x in fh.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait
    t0, i0 = read()
    time.sleep(window)
    t1, i1 = read()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def settle(limit: float = 15.0, busy: float = 0.15) -> float:
    """Wait until the machine is quiet (under ``busy`` of its CPU for a quarter second, at most ``limit`` s): what
    the previous command left running - a run's report plots, drawn in the background after the play ended - is
    not in the next command's time.  Returns the seconds waited."""
    t0 = time.time()
    while time.time() - t0 < limit and cpu_busy() > busy:
        pass
    return time.time() - t0


def bare(run_id: str, steps: int, model: str) -> dict:
    """DeepSpeed's own launcher with pdsh, run by hand on the coordinator."""
    hosts = workers()
    run_dir = f"{SHARED}/runs/{run_id}"
    prepare_bare(run_dir, hosts)
    cmd = (f"cd {run_dir} && {VENV}/bin/deepspeed --hostfile {run_dir}/hostfile --master_addr {hosts[0][1]} "
           f"--master_port 29500 --launcher pdsh --force_multi --module multinode_ds.train "
           f"--model {shlex.quote(model)} --run-dir {run_dir} --steps {int(steps)} "
           f"--checkpoint-dir {run_dir}/checkpoints > {run_dir}/launcher.log 2>&1")
    return timed_on([(COORD, cmd)], run_dir, "launcher.log", "bare deepspeed")


def bare_nossh(run_id: str, steps: int, model: str) -> dict:
    """DeepSpeed without SSH between nodes, by hand: ``deepspeed --no_ssh --node_rank <i>`` on every worker at once
    (the runner reads no .deepspeed_env then: the shell exports it)."""
    hosts = workers()
    run_dir = f"{SHARED}/runs/{run_id}"
    prepare_bare(run_dir, hosts)
    commands = [(f"mnds-{name}",
                 f"cd {run_dir} && set -a && . ./.deepspeed_env && set +a && {VENV}/bin/deepspeed --hostfile "
                 f"{run_dir}/hostfile --no_ssh --node_rank {i} --master_addr {hosts[0][1]} --master_port 29500 "
                 f"--module multinode_ds.train --model {shlex.quote(model)} --run-dir {run_dir} "
                 f"--steps {int(steps)} --checkpoint-dir {run_dir}/checkpoints > {run_dir}/launcher-{i}.log 2>&1")
                for i, (name, _addr) in enumerate(hosts)]
    return timed_on(commands, run_dir, "launcher-*.log", "bare deepspeed --no_ssh")


def timed_on(commands: list, run_dir: str, log: str, what: str) -> dict:
    """Run every ``(container, cmd)`` at once; seconds to rank 0's first step and until the last one ended; the run
    directory goes."""
    env = dict(os.environ, CONTAINERS_CONF=str(CONF))
    try:
        t0 = time.time()
        procs = [subprocess.Popen(["podman", "exec", "--user", RUN_USER, "--workdir", "/tmp", container, "sh", "-c",
                                   cmd], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
                 for container, cmd in commands]
        errors = [p.communicate()[1] for p in procs]
        wall = time.time() - t0
        rcs = [p.returncode for p in procs]
        if any(rcs):
            tail = podman_exec(COORD, f"tail -20 {run_dir}/{log}", check=False).stdout
            raise SystemExit(f"[bench-launch] {what} failed (rc={rcs}):\n{tail}\n{''.join(errors)}")
        first = first_step_time(podman_exec(COORD, f"cat {run_dir}/metrics/rank0.jsonl").stdout)
    finally:
        podman_exec(COORD, f"rm -rf {run_dir}", check=False)
    if first is None:
        raise SystemExit(f"[bench-launch] {what} finished without a step record from rank 0")
    return {"first_step_s": first - t0, "wall_s": wall}


def srun(run_id: str, steps: int, model: str) -> dict:
    """Slurm's srun by hand on the coordinator, the ranks' variables from SLURM_*, the same environment."""
    hosts = workers()
    run_dir = f"{SHARED}/runs/{run_id}"
    podman_exec(COORD, f"mkdir -p {run_dir} && grep -E '^[A-Za-z_][A-Za-z0-9_]*=' "
                       f"/etc/multinode-deepspeed/deepspeed_env > {run_dir}/.deepspeed_env || true")
    rank = ("set -a; . ./.deepspeed_env; DS_ACCELERATOR=cpu PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1 "
            "TORCH_EXTENSIONS_DIR=/opt/multinode-deepspeed/torch_extensions RANK=$SLURM_PROCID "
            f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "
            "LOCAL_RANK=$SLURM_LOCALID WORLD_SIZE=$SLURM_NTASKS "
            f"MASTER_ADDR={hosts[0][1]} MASTER_PORT=29500; exec {VENV}/bin/python -u -m multinode_ds.train "
            f"--local_rank=$SLURM_LOCALID --model {shlex.quote(model)} --run-dir {run_dir} --steps {int(steps)} "
            f"--checkpoint-dir {run_dir}/checkpoints")
    cmd = (f"cd {run_dir} && srun --nodes={len(hosts)} --ntasks-per-node=1 --nodelist="
           f"{','.join(h[0] for h in hosts)} --exclusive --kill-on-bad-exit=1 --job-name=bench-srun "
           f"bash -c {shlex.quote(rank)} > {run_dir}/srun.log 2>&1")
    return timed_on([(COORD, cmd)], run_dir, "srun.log", "srun")


def train(run_id: str, steps: int, model: str, extra: list[str], mitogen: str | None = None) -> float:
    """ansible-playbook train.yml for this run, which must succeed; returns its wall time."""
    argv = [str(BIN / "ansible-playbook"), "train.yml", "-e", f"model={model}", "-e", f"steps={steps}",
            "-e", f"run_id={run_id}", *extra]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), PATH=f"{BIN}:{os.environ.get('PATH', '')}")
    if mitogen:
        # Mitogen for Ansible, unpacked (not installed) at MITOGEN: its strategy plugin, for a comparison.
        env.update(PYTHONPATH=mitogen, ANSIBLE_STRATEGY_PLUGINS=f"{mitogen}/ansible_mitogen/plugins/strategy",
                   ANSIBLE_STRATEGY="mitogen_linear")
    t0 = time.time()
    res = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.time() - t0
    if res.returncode != 0:
        raise SystemExit(f"[bench-launch] {' '.join(argv[1:])} failed:\n" + "\n".join(res.stdout.splitlines()[-30:]))
    return wall


def sbatch(run_id: str, steps: int, model: str) -> dict:
    """The slurm backend's batch script, submitted by hand: train.yml -e slurm_submit=false writes the run (not
    timed), then sbatch on the coordinator, timed as srun by hand is, to the job's end."""
    train(run_id, steps, model, ["-e", "backend=slurm", "-e", "slurm_submit=false", "-e", "preflight=false"])
    settle()
    run_dir = f"{SHARED}/runs/{run_id}"
    # Until the job leaves the queue, looked at every 0.1 s (sbatch --wait looks every few seconds), then its state.
    return timed_on([(COORD, f"cd {run_dir} && j=$(sbatch --parsable slurm/job.sbatch) && while [ -n "
                             "\"$(squeue -h -j $j -t PD,CF,R,CG -o %i)\" ]; do sleep 0.1; done && "
                             "scontrol -o show job $j | grep -q JobState=COMPLETED")], run_dir, "slurm/batch-*.out",
                    "sbatch")


def playbook(run_id: str, steps: int, model: str, extra: list[str], mitogen: str | None = None) -> dict:
    t0 = time.time()
    wall = train(run_id, steps, model, extra, mitogen)
    metrics = (ROOT / "runs" / run_id / "metrics" / "rank0.jsonl").read_text()
    first = first_step_time(metrics)
    if first is None:
        raise SystemExit(f"[bench-launch] {run_id}: no step record from rank 0 in its metrics")
    return {"first_step_s": first - t0, "wall_s": wall}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--model", default="llama-tiny")
    p.add_argument("--json", default=str(ROOT / "tests" / "output" / "bench-launch.json"))
    p.add_argument("--mitogen", metavar="DIR",
                   help="also run train.yml -e preflight=false under Mitogen's strategy (kind 'mitogen'), from an "
                        "unpacked mitogen wheel in DIR (pip download mitogen; unzip)")
    p.add_argument("--ssh-free", action="store_true",
                   help="also DeepSpeed without SSH by hand and train.yml -e backend=ssh-free (kinds bare-nossh, "
                        "ssh-free)")
    p.add_argument("--slurm", action="store_true",
                   help="the slurm backend against srun by hand (kinds srun, sbatch, slurm, slurm-pf)")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.steps < 1:
        p.error("--rounds and --steps must be at least 1")
    if not INVENTORY.exists():
        raise SystemExit("[bench-launch] no local cluster: make cluster, then ansible-playbook site.yml")
    kinds = {"bare": lambda rid: bare(rid, args.steps, args.model),
             "force": lambda rid: playbook(rid, args.steps, args.model, ["-e", "preflight=force"]),
             "train": lambda rid: playbook(rid, args.steps, args.model, []),
             "cold": lambda rid: playbook(rid, args.steps, args.model, ["-e", "warm_start=false"]),
             "no-pf": lambda rid: playbook(rid, args.steps, args.model, ["-e", "preflight=false"])}
    if args.slurm:
        kinds = {"srun": lambda rid: srun(rid, args.steps, args.model),
                 "sbatch": lambda rid: sbatch(rid, args.steps, args.model),
                 "slurm": lambda rid: playbook(rid, args.steps, args.model, ["-e", "backend=slurm",
                                                                             "-e", "preflight=false"]),
                 "slurm-pf": lambda rid: playbook(rid, args.steps, args.model, ["-e", "backend=slurm"])}
        # The pass that slurm-pf's rounds reuse (its job is the slurm backend's: Slurm's own checks), not timed.
        playbook(f"bench-launch-{time.strftime('%Y%m%d-%H%M%S')}-slurm-preflight", args.steps, args.model,
                 ["-e", "backend=slurm", "-e", "preflight=force"])
    if args.ssh_free and not args.slurm:
        kinds["bare-nossh"] = lambda rid: bare_nossh(rid, args.steps, args.model)
        kinds["ssh-free"] = lambda rid: playbook(rid, args.steps, args.model, ["-e", "backend=ssh-free"])
        # The pass that ssh-free's rounds reuse (its job differs from pdsh's: no SSH to check), not timed.
        playbook(f"bench-launch-{time.strftime('%Y%m%d-%H%M%S')}-ssh-free-preflight", args.steps, args.model,
                 ["-e", "backend=ssh-free", "-e", "preflight=force"])
    if args.mitogen:
        kinds["mitogen"] = lambda rid: playbook(rid, args.steps, args.model, ["-e", "preflight=false"],
                                                mitogen=args.mitogen)
    results = dict((k, []) for k in kinds)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for rnd in range(1, args.rounds + 1):
        for kind, run in kinds.items():
            settle()
            res = run(f"bench-launch-{stamp}-{rnd}-{kind}")
            results[kind].append(res)
            print(f"round {rnd} {kind:6s} first step {res['first_step_s']:6.1f} s   whole command "
                  f"{res['wall_s']:6.1f} s", flush=True)
    base = next(iter(kinds))
    med = dict((k, {m: statistics.median(r[m] for r in v) for m in ("first_step_s", "wall_s")})
               for k, v in results.items())
    print(f"\nmedians over {args.rounds} rounds ({args.model}, {args.steps} steps, {len(workers())} workers):")
    print(f"{'':8s}{'first step (s)':>16s}{'ratio':>8s}{'whole (s)':>12s}{'ratio':>8s}")
    for kind, m in med.items():
        print(f"{kind:8s}{m['first_step_s']:16.1f}{m['first_step_s'] / med[base]['first_step_s']:8.2f}"
              f"{m['wall_s']:12.1f}{m['wall_s'] / med[base]['wall_s']:8.2f}")
    # Each run against the bare run of its own round: the machine's drift between rounds cancels out.
    paired = dict((k, {m: statistics.median(r[m] / b[m] for r, b in zip(v, results[base]))
                       for m in ("first_step_s", "wall_s")}) for k, v in results.items())
    spread = dict((k, {m: (min(r[m] / b[m] for r, b in zip(v, results[base])),
                           max(r[m] / b[m] for r, b in zip(v, results[base])))
                       for m in ("first_step_s", "wall_s")}) for k, v in results.items())
    print(f"\nmedian of the per-round ratios (each run / the same round's {base} run), and their spread:")
    print(f"{'':8s}{'first step':>16s}{'spread':>14s}{'whole':>10s}{'spread':>14s}")
    for kind, m in paired.items():
        lo_f, hi_f = spread[kind]["first_step_s"]
        lo_w, hi_w = spread[kind]["wall_s"]
        print(f"{kind:8s}{m['first_step_s']:16.2f}{f'{lo_f:.2f}-{hi_f:.2f}':>14s}{m['wall_s']:10.2f}"
              f"{f'{lo_w:.2f}-{hi_w:.2f}':>14s}")
    if "bare-nossh" in results and "ssh-free" in results:
        own = dict((m, [r[m] / b[m] for r, b in zip(results["ssh-free"], results["bare-nossh"])])
                   for m in ("first_step_s", "wall_s"))
        paired["ssh-free/bare-nossh"] = dict((m, statistics.median(v)) for m, v in own.items())
        spread["ssh-free/bare-nossh"] = dict((m, (min(v), max(v))) for m, v in own.items())
        print(f"ssh-free against bare-nossh: first step {paired['ssh-free/bare-nossh']['first_step_s']:.2f} "
              f"({own['first_step_s'] and min(own['first_step_s']):.2f}-{max(own['first_step_s']):.2f}), whole "
              f"{paired['ssh-free/bare-nossh']['wall_s']:.2f} ({min(own['wall_s']):.2f}-{max(own['wall_s']):.2f})")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rounds": results, "medians": med, "model": args.model, "steps": args.steps,
                               "ratios": dict((k, {m: v[m] / med[base][m] for m in v}) for k, v in med.items()), "baseline": base,
                               "paired_ratios": paired, "paired_spread": spread},
                              indent=2) + "\n")
    print(f"\n{out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
