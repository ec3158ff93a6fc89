"""Every role's molecule scenario (extensions/molecule/<role>): podman driver, converge, idempotence, testinfra verify."""
import concurrent.futures
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.molecule
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
SCENARIOS = sorted(p.parent.name for p in (ROOT / "extensions" / "molecule").glob("*/molecule.yml"))
OUTPUT = ROOT / "tests" / "output"


@pytest.fixture(scope="session")
def node_image():
    """The local cluster's node image (built once, cached), which the scenarios run."""
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "localcluster.py"), "image"], cwd=ROOT,
                         check=True, stdout=subprocess.PIPE, text=True)
    return res.stdout.strip().splitlines()[-1]


def test_every_role_has_a_scenario():
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "tasks" / "main.yml").exists())
    assert SCENARIOS == roles


# Scenarios run MNDS_MOLECULE_JOBS at a time (default 2: each is mostly waiting on podman and ssh), the longest
# first; every scenario has its own containers and network, so they never meet.
JOBS = max(1, int(os.environ.get("MNDS_MOLECULE_JOBS", "2")))
LONGEST_FIRST = ("stack", "ssh_mesh", "slurm", "nccl", "nfs", "benchmark", "preflight", "cluster_hosts", "shared_dir")


def run_scenario(node_image, scenario):
    env = dict(os.environ, MNDS_NODE_IMAGE=node_image, PATH=f"{BIN}:{os.environ.get('PATH', '')}",
               CONTAINERS_CONF=str(ROOT / ".cache" / "podman" / "containers.conf"),
               ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".collections"), ANSIBLE_FORCE_COLOR="0", NO_COLOR="1",
               PY_COLORS="0", ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_CONFIG", None)
    OUTPUT.mkdir(parents=True, exist_ok=True)
    log = OUTPUT / f"molecule-{scenario}-{int(time.time())}.log"
    t0 = time.time()
    proc = subprocess.run([str(BIN / "molecule"), "test", "-s", scenario], cwd=ROOT / "extensions", env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False, timeout=1200)
    log.write_text(proc.stdout)
    return proc, time.time() - t0, log


@pytest.fixture(scope="session")
def scenario_runs(request, node_image):
    """Every selected scenario started at the first test, JOBS at a time; each test waits for its own."""
    chosen = set(item.callspec.params["scenario"] for item in request.session.items
                 if getattr(item, "callspec", None) is not None and "scenario" in item.callspec.params)
    order = [s for s in LONGEST_FIRST if s in chosen] + sorted(chosen - set(LONGEST_FIRST))
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=JOBS)
    futures = dict((s, pool.submit(run_scenario, node_image, s)) for s in order)
    yield futures
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario_runs, scenario):
    proc, seconds, log = scenario_runs[scenario].result()
    print(f"molecule test -s {scenario}: rc={proc.returncode} in {seconds:.0f}s (log {log})")
    assert proc.returncode == 0, "\n".join(proc.stdout.splitlines()[-80:])
    # molecule prints "[scenario > action] Executed: Successful" (older releases "scenario ➜ action: ...").
    for action in ("converge", "idempotence", "verify"):
        assert re.search(r"%s\W+Executed: Successful" % action, proc.stdout), action
    summary = re.findall(r"=+ (.*) in [\d.]+s", proc.stdout)
    assert summary and "passed" in summary[-1] and "failed" not in summary[-1] and "error" not in summary[-1], summary
