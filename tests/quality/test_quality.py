"""Static quality gates: ansible-lint (production), ansible-test sanity, and the built collection.  The first two
run in the background from the start of the session (gates.py); their tests wait for the results."""
import os
import re
import subprocess
import sys
from pathlib import Path

import gates
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.quality


def run(cmd, **kw):
    env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '')}", **kw.pop("env", {}))
    return subprocess.run(cmd, cwd=kw.pop("cwd", ROOT), env=env, capture_output=True, text=True, check=False, **kw)


def test_ansible_lint_production_profile():
    res, seconds, log = gates.result("test_ansible_lint_production_profile")
    print(f"scripts/lint: rc={res.returncode} in {seconds:.0f}s (log {log})")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "Profile 'production' was required, and it passed" in res.stderr + res.stdout


def test_ansible_test_sanity():
    res, seconds, log = gates.result("test_ansible_test_sanity")
    print(f"scripts/sanity: rc={res.returncode} in {seconds:.0f}s (log {log})")
    out = res.stdout + res.stderr
    assert res.returncode == 0, "\n".join(line for line in out.splitlines() if line.startswith(("ERROR", "FATAL")))
    assert 'Running sanity test "validate-modules"' in out and 'Running sanity test "pylint"' in out


def test_modules_have_docs():
    modules = sorted(p.stem for p in (ROOT / "plugins" / "modules").glob("*.py") if p.stem != "__init__")
    assert {"hostfile", "run_summary", "accelerator_facts", "fabric_facts"} <= set(modules)
    for module in modules:
        res = run([str(BIN / "ansible-doc"), "-t", "module", f"multinode.deepspeed.{module}"],
                  env={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")})
        assert res.returncode == 0, res.stderr
        assert "EXAMPLES:" in res.stdout and "RETURN VALUES:" in res.stdout, module


def test_filters_and_roles_have_docs():
    filters = sorted(p.stem for p in (ROOT / "plugins" / "filter").glob("*.py") if p.stem != "__init__")
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "argument_specs.yml").exists())
    assert {"select_stack", "nccl_profile", "nccl_job"} <= set(filters)
    # Every role with a main entry point validates its inputs, and every entry point a spec names has its tasks
    # file (role backend has one entry point per launch backend, and no main).
    assert set(p.name for p in (ROOT / "roles").iterdir() if (p / "tasks" / "main.yml").exists()) <= set(roles)
    for role in roles:
        specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
        for entry in specs:
            assert (ROOT / "roles" / role / "tasks" / f"{entry}.yml").exists(), (role, entry)
    assert "backend" in roles
    for kind, names in (("filter", filters), ("role", roles)):
        for name in names:
            res = run([str(BIN / "ansible-doc"), "-t", kind, f"multinode.deepspeed.{name}"],
                      env={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")})
            assert res.returncode == 0 and f"multinode.deepspeed.{name}" in res.stdout, (kind, name, res.stderr)


def test_built_tarball_installs_and_its_playbooks_resolve(tmp_path):
    res = run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(tmp_path)])
    assert res.returncode == 0, res.stderr
    version = re.search(r"(?m)^version: (\S+)$", (ROOT / "galaxy.yml").read_text()).group(1)
    tarball = tmp_path / f"multinode-deepspeed-{version}.tar.gz"
    assert tarball.exists()
    listing = run(["tar", "-tzf", str(tarball)]).stdout.split()
    assert "roles/stack/tasks/main.yml" in listing and "multinode_ds/train.py" in listing
    assert not [p for p in listing if p.startswith((".venv", ".cache", ".cluster", "runs/", ".collections",
                                                    "inventories/local"))]
    colls = tmp_path / "collections"
    # Away from the repo's ansible.cfg: the community collections come from the ansible package in
    # the venv, ours only from the tarball.
    (tmp_path / "empty.cfg").write_text("[defaults]\n")
    env = {"ANSIBLE_COLLECTIONS_PATH": str(colls), "ANSIBLE_CONFIG": str(tmp_path / "empty.cfg")}
    res = run([str(BIN / "ansible-galaxy"), "collection", "install", "--no-deps", "-p", str(colls), str(tarball)],
              env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert (colls / "ansible_collections" / "multinode" / "deepspeed" / "playbooks" / "site.yml").exists()
    for playbook in ("multinode.deepspeed.site", "multinode.deepspeed.train"):
        res = run([str(BIN / "ansible-playbook"), playbook, "--list-tasks", "-i", "localhost,"], env=env,
                  cwd=tmp_path)
        assert res.returncode == 0, res.stdout + res.stderr
        assert str(colls) in run([str(BIN / "ansible-playbook"), playbook, "--syntax-check", "-i", "localhost,",
                                  "-vvv"], env=env, cwd=tmp_path).stdout
