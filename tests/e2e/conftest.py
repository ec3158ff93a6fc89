"""One local cluster shared by every end-to-end test of the session."""
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import early
from e2e_nodes import INVENTORY, localcluster, on_coord
from early import Result, run_playbook  # noqa: F401  # pylint: disable=unused-import

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(name="run_playbook", scope="session")
def run_playbook_fixture():
    """ansible-playbook from the repo root with the repo's ansible.cfg; returns a Result."""
    return run_playbook


@pytest.fixture(scope="session")
def cluster():
    """Start (or reuse) the local cluster; removed at the end under CI unless MNDS_KEEP_CLUSTER=1."""
    # Started early (tests/e2e/early.py, from tests/conftest.py) it overlapped the unit tests; else up now.
    rc, out, seconds = early.result("cluster") or early.cluster_up()
    print(out)
    if rc != 0:
        pytest.fail(f"scripts/localcluster.py up failed (rc={rc}):\n{out[-4000:]}", pytrace=False)
    print(f"local cluster up in {seconds:.0f}s")
    yield INVENTORY
    if os.environ.get("CI") and not os.environ.get("MNDS_KEEP_CLUSTER"):
        subprocess.run([sys.executable, str(ROOT / "scripts" / "localcluster.py"), "down"], cwd=ROOT, check=False)


@pytest.fixture(scope="session")
def provisioned(cluster):
    """site.yml run once for the session, with Slurm (the idempotence test runs it again)."""
    res = early.result("site") or early.first_site()
    if "scenarios" in sys.modules:  # the scenarios that install from its wheelhouse may start now
        sys.modules["scenarios"].wheelhouse_ready.set()
    assert res.rc == 0, res.tail()
    return res


def podman(*args, **kw):
    """podman with the local cluster's containers.conf (what scripts/localcluster.py uses)."""
    env = dict(os.environ, CONTAINERS_CONF=str(ROOT / ".cache" / "podman" / "containers.conf"))
    return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, check=False, **kw)


@pytest.fixture(name="podman", scope="session")
def podman_fixture():
    """podman(*args) -> CompletedProcess, against the local cluster."""
    return podman


@pytest.fixture(name="localcluster", scope="session")
def localcluster_fixture():
    return localcluster


def slurm_nodes():
    return sorted(on_coord("sinfo -h -N -o '%N|%T'").stdout.split())


@pytest.fixture(scope="module")
def slurm(provisioned, run_playbook):
    """The session's site.yml ran with -e slurm=true: Slurm answers and both workers are idle, before a test that
    runs with preflight=false (which would have stopped on a node Slurm does not hear from).  A node that an earlier
    test restarted has no init system to start munge and slurmd again: the slurm role (site.yml's, alone:
    files/slurm_again.yml) does, as it would after a real node's repair.  What Slurm said of a node that was not
    idle is a warning in the session's summary, so that a loaded machine's lapse is seen, not only healed."""
    idle = ["worker1|idle", "worker2|idle"]
    out = slurm_nodes()
    if out != idle:
        said = on_coord("sinfo -R -N -h; tail -n 30 /var/log/slurm/slurmctld.log").stdout
        warnings.warn(f"Slurm's workers were {out}, not idle; the slurm role starts them again. sinfo -R and "
                      f"slurmctld's log:\n{said[-3000:]}", stacklevel=1)
        res = run_playbook(str(ROOT / "tests" / "e2e" / "files" / "slurm_again.yml"), name="slurm-again")
        assert res.rc == 0, res.tail()
        out = slurm_nodes()
    assert out == idle, out
    return provisioned
