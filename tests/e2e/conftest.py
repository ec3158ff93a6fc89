"""One local cluster shared by every end-to-end test of the session."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import early
from e2e_nodes import localcluster
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
    yield ROOT / "inventories" / "local" / "hosts.yml"
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
