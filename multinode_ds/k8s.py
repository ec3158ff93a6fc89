"""The kubernetes backend's pod side: one pod of the run is one rank node.

``python -m multinode_ds.k8s pod --run-dir D``

The pod's ordinal (the suffix of its name ``<name>-<ordinal>``, ``MULTINODE_DS_POD`` from the downward API) is DeepSpeed's node
rank.  The pod runs that node's agent with the argv the job plan gave it (``D/k8s/agents.json``, one argv per
ordinal, written by ``run_prepare``): the agent starts DeepSpeed's per-node launcher
(``deepspeed.launcher.launch --node_rank <ordinal>``) with pod 0's stable name as the master, beats, and stops the
node's ranks on the run's ABORT, as on any other backend.

The pod's environment carries the run's marker (``MULTINODE_DS_RUN_ID``), by which an agent finds the run's
processes (it waits for them to end, and stops them on an abort).  The pod's first process is not one of them:
it execs itself once without the marker, and gives the marker back to the agent only.

When the agent is done (the run ended, was aborted, or the controller's lease lapsed: a controller that died) the
pod records the agent's exit code (``D/k8s/pod<ordinal>.exit``) and exits with it.  The pod's
``restartPolicy`` is ``Never``, so it ends there and its GPUs are free: nothing waits for the controller to
delete it.  SIGTERM (the pod deleted, a node drained) goes to the agent, which stops the node's ranks first.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

AGENTS_FILE = "k8s/agents.json"
MARKER = "MULTINODE_DS_RUN_ID"
HELD_MARKER = "MULTINODE_DS_K8S_RUN_ID"


def ordinal(pod_name: str) -> int:
    """``mnds-r1-3`` -> 3."""
    head, sep, tail = str(pod_name).rpartition("-")
    if not sep or not head or not tail.isdigit():
        raise SystemExit(f"multinode_ds.k8s: {pod_name!r} is not a run's pod name (<name>-<ordinal>)")
    return int(tail)


def agent_argv(run_dir: Path, index: int) -> list:
    try:
        agents = json.loads((run_dir / AGENTS_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise SystemExit(f"multinode_ds.k8s: cannot read {run_dir / AGENTS_FILE}: {exc}")
    if not isinstance(agents, list) or not 0 <= index < len(agents):
        raise SystemExit(f"multinode_ds.k8s: pod ordinal {index} has no agent in {run_dir / AGENTS_FILE} "
                         f"({len(agents) if isinstance(agents, list) else 0} pods planned)")
    return agents[index]


def pod_main(args) -> int:
    run_dir = Path(args.run_dir)
    index = ordinal(args.pod or os.environ.get("MULTINODE_DS_POD") or os.environ.get("HOSTNAME", ""))
    argv = agent_argv(run_dir, index)
    env = dict(os.environ)
    if env.get(HELD_MARKER):
        env[MARKER] = env.pop(HELD_MARKER)
    child = subprocess.Popen(argv, cwd=run_dir, env=env)

    def forward(signum, frame):
        if child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    rc = child.wait()
    (run_dir / "k8s").mkdir(exist_ok=True)
    (run_dir / "k8s" / f"pod{index}.exit").write_text(f"{rc}\n")
    print(f"multinode_ds.k8s: pod {index}: the agent exited with {rc}; the pod ends", flush=True)
    return rc


def without_marker(argv):
    """Exec this module again with the run's marker moved out of the way (see the module's docstring)."""
    if os.environ.get(MARKER):
        env = dict(os.environ)
        env[HELD_MARKER] = env.pop(MARKER)
        os.execve(sys.executable, [sys.executable, "-m", "multinode_ds.k8s", *argv], env)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m multinode_ds.k8s", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    pod = sub.add_parser("pod", help="run this pod's share of the run (its agent)")
    pod.add_argument("--run-dir", required=True)
    pod.add_argument("--pod", default=None, help="the pod's name (default: MULTINODE_DS_POD, then HOSTNAME)")
    pod.add_argument("--exit", action="store_true", help="(the default now: the pod exits with the agent's code)")
    args = p.parse_args(argv)
    return pod_main(args)


if __name__ == "__main__":
    without_marker(sys.argv[1:])
    sys.exit(main())
