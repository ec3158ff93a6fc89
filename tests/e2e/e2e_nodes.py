"""What the end-to-end tests ask of the local cluster's nodes (imported by the test modules)."""
import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def podman(*args, **kw):
    """podman with the local cluster's containers.conf."""
    env = {"CONTAINERS_CONF": str(ROOT / ".cache" / "podman" / "containers.conf"), "PATH": "/usr/bin:/bin"}
    return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, check=False, **kw)


def run_processes(node, run_id):
    """Processes on ``node`` that belong to run ``run_id`` (by the marker in their environment)."""
    script = ("for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null | "
              f"grep -qx MULTINODE_DS_RUN_ID={run_id} && echo ${{p#/proc/}}; done; true")
    return podman("exec", f"mnds-{node}", "sh", "-c", script).stdout.split()


def load_summary(run_id):
    return json.loads((ROOT / "runs" / run_id / "summary.json").read_text())
