"""What -e workdir adds to a launch when its content is on the cluster already, on the local cluster.

    make bench-workdir [ROUNDS=5]
    .venv/bin/python scripts/cost/workdir.py [--rounds 5] [--steps 4] [--json FILE]

The same user script (tests/e2e/files/workdir: train.py importing helper.py, reading data/), the same DeepSpeed
config, the same steps and hosts, back to back, N rounds each:

  path      ansible-playbook train.yml -e entrypoint=<its copy on the shared directory> (the script run from an
            absolute path, as before workdir existed; its data by an absolute path)
  workdir   ansible-playbook train.yml -e workdir=<the project on the controller> -e entrypoint=train.py (the content
            is there already: the copy is skipped)

Both with -e preflight=false and ansible.posix.profile_tasks.  For each round: the whole command's wall time, and
what workdir adds in Ansible's own tasks - the plan's task (which hashes the workdir on the controller) over the
path launch's, plus the copy and mark tasks where they run (with the content there, they do not).  Prints the medians, the added seconds (the issue's target:
at most 1 s) and the ratio of the wall times, and writes them as JSON.

Needs a provisioned local cluster (make cluster && ansible-playbook site.yml).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
FILES = ROOT / "tests" / "e2e" / "files" / "workdir"
PLAN_TASK = "Plan the job"
SKIPPED = ("Copy the workdir to the shared directory", "Mark the workdir's content whole there")


def task_seconds(out: str, prefix: str) -> float:
    """profile_tasks' seconds of the task whose name starts with ``prefix`` (0 when it is not listed)."""
    found = re.search(r"^%s[^\n]*?-+ (\d+\.\d+)s$" % re.escape(prefix), out, re.M)
    return float(found.group(1)) if found else 0.0


def project(where: Path) -> Path:
    """The user's project as a git tree, its config fixed for two ranks (train_batch_size 16, fp32)."""
    root = where / "proj"
    shutil.copytree(FILES, root)
    config = json.loads((root / "ds_config.json").read_text())
    config["train_batch_size"], config["fp16"]["enabled"] = 16, False
    (root / "ds_config.json").write_text(json.dumps(config, indent=2))
    (root / "data" / "bench.txt").write_text("%d\n" % time.time_ns())
    for argv in (["init", "-q"], ["add", "."], ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "b"]):
        subprocess.run(["git", "-C", str(root)] + argv, check=True)
    return root


def launch(label: str, extra: list[str], cwd: Path) -> dict:
    run_id = "bench-workdir-%s-%d" % (label, time.time_ns() // 1000000)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), PWD=str(cwd),
               ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_tasks", PROFILE_TASKS_TASK_OUTPUT_LIMIT="all")
    t0 = time.time()
    proc = subprocess.run([str(BIN / "ansible-playbook"), str(ROOT / "train.yml"), "-e", "preflight=false",
                           "-e", f"run_id={run_id}", *extra], cwd=cwd, env=env, capture_output=True, text=True,
                          check=False)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit("[bench-workdir] %s failed (rc %d):\n%s" % (label, proc.returncode, proc.stdout[-3000:]))
    return {"wall": wall, "plan": task_seconds(proc.stdout, PLAN_TASK),
            # The copy and mark tasks do not even run when the content is there (the steps before the agents are
            # skipped as a whole); counted when they do.
            "skipped": sum(task_seconds(proc.stdout, name) for name in SKIPPED)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--json", default=str(ROOT / "tests" / "output" / "bench-workdir.json"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-workdir-") as tmp:
        where = Path(tmp)
        root = project(where)
        common = ["-e", "args='--steps %d --deepspeed_config %s'" % (args.steps, root / "ds_config.json")]
        # The first launch copies the content; its place on the cluster is then the path launch's script.
        first = subprocess.run([str(BIN / "ansible-playbook"), str(ROOT / "train.yml"), "-e", "preflight=false",
                                "-e", f"workdir={root}", "-e", "entrypoint=train.py", *common], cwd=where,
                               env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), PWD=str(where)),
                               capture_output=True, text=True, check=False)
        if first.returncode != 0:
            raise SystemExit("[bench-workdir] the first launch failed:\n" + first.stdout[-3000:])
        dest = re.search(r"(/\S+/workspaces/[0-9a-f]{16})/train\.py", first.stdout).group(1)
        path_args = ["-e", f"entrypoint={dest}/train.py", "-e", "args='--steps %d --data %s/data/points.txt "
                     "--deepspeed_config %s'" % (args.steps, dest, root / "ds_config.json")]
        rounds = []
        for n in range(args.rounds):
            path = launch("path", path_args, where)
            workdir = launch("workdir", ["-e", f"workdir={root}", "-e", "entrypoint=train.py", *common], where)
            added = workdir["plan"] - path["plan"] + workdir["skipped"]
            rounds.append({"path": path, "workdir": workdir, "added": added, "ratio": workdir["wall"] / path["wall"]})
            print("[bench-workdir] round %d: path %.1fs, workdir %.1fs; workdir adds %.2fs in Ansible's tasks" % (
                n + 1, path["wall"], workdir["wall"], added), flush=True)
    result = {
        "rounds": rounds,
        "median_wall_path": statistics.median(r["path"]["wall"] for r in rounds),
        "median_wall_workdir": statistics.median(r["workdir"]["wall"] for r in rounds),
        "median_added_seconds": statistics.median(r["added"] for r in rounds),
        "median_ratio": statistics.median(r["ratio"] for r in rounds),
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    print("[bench-workdir] medians over %d rounds: path %.1fs, workdir %.1fs (ratio %.3f); workdir adds %.2fs "
          "(target <= 1 s) -> %s" % (len(rounds), result["median_wall_path"], result["median_wall_workdir"],
                                     result["median_ratio"], result["median_added_seconds"], args.json))
    return 0


if __name__ == "__main__":
    sys.exit(main())
