"""One local cluster shared by every end-to-end test of the session."""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_nodes import localcluster

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "tests" / "output"
BIN = Path(sys.executable).parent


class Result:
    def __init__(self, rc, out, log):
        self.rc, self.out, self.log = rc, out, log

    def recap(self):
        """{host: {ok: n, changed: n, ...}} from the PLAY RECAP."""
        out = {}
        for m in re.finditer(r"^(\S+)\s+:\s+((?:\w+=\d+\s*)+)$", self.out, re.M):
            out[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
        return out

    def tail(self, n=60):
        return "\n".join(self.out.splitlines()[-n:])


def run_playbook(playbook, *extra, inventory=None, name=None, timeout=1800, env_extra=None, cwd=ROOT):
    OUTPUT.mkdir(parents=True, exist_ok=True)
    cmd = [str(BIN / "ansible-playbook"), playbook, *extra]
    if inventory:
        cmd += ["-i", str(inventory)]
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0",
               PATH=f"{BIN}:{os.environ.get('PATH', '')}", PWD=str(cwd))
    env.update(env_extra or {})
    log = OUTPUT / f"{name or Path(playbook).stem}-{int(time.time())}.log"
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=cwd, env=env, check=False, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout)
    log.write_text(proc.stdout)
    print(f"{' '.join(cmd[1:])}: rc={proc.returncode} in {time.time() - t0:.0f}s (log {log})")
    return Result(proc.returncode, proc.stdout, log)


@pytest.fixture(name="run_playbook", scope="session")
def run_playbook_fixture():
    """ansible-playbook from the repo root with the repo's ansible.cfg; returns a Result."""
    return run_playbook


@pytest.fixture(scope="session")
def cluster():
    """Start (or reuse) the local cluster; removed at the end under CI unless MNDS_KEEP_CLUSTER=1."""
    t0 = time.time()
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "localcluster.py"), "up"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
    print(res.stdout)
    if res.returncode != 0:
        pytest.fail(f"scripts/localcluster.py up failed (rc={res.returncode}):\n{res.stdout[-4000:]}", pytrace=False)
    print(f"local cluster up in {time.time() - t0:.0f}s")
    yield ROOT / "inventories" / "local" / "hosts.yml"
    if os.environ.get("CI") and not os.environ.get("MNDS_KEEP_CLUSTER"):
        subprocess.run([sys.executable, str(ROOT / "scripts" / "localcluster.py"), "down"], cwd=ROOT, check=False)


@pytest.fixture(scope="session")
def provisioned(cluster):
    """site.yml run once for the session, with Slurm (the idempotence test runs it again)."""
    res = run_playbook("site.yml", "-e", "slurm=true", name="site-first")
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
