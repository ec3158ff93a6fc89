"""The ecosystem's own tools on the collection: antsibull-docs lints every plugin's and role's documentation as the
collection docsite would build it, antsibull-changelog the changelog fragments, and ansible-builder turns the
project's execution environment (execution-environment.yml, which uses meta/execution-environment.yml's files) into
a valid build context. Nothing is built or pulled (registry images cannot be fetched here)."""
import ast
import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from bindep.depends import Depends
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.quality


def run(cmd, **kw):
    env = dict(os.environ, PATH="%s:%s" % (BIN, os.environ.get("PATH", "")), ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
               ANSIBLE_NOCOLOR="1")
    return subprocess.run(cmd, cwd=kw.pop("cwd", ROOT), env=env, capture_output=True, text=True, check=False, **kw)


def load(path):
    return yaml.safe_load((ROOT / path).read_text())


def requirement_names(text):
    return {Requirement(line.split("#", 1)[0].strip()).name
            for line in text.splitlines() if line.split("#", 1)[0].strip()}


def bindep_packages(text, profiles):
    return {rule[0] for rule in Depends(text).active_rules(profiles + ["default"])}


def third_party_imports():
    """{top-level module: [files]} that the collection's plugins import, other than the standard library and
    Ansible."""
    found = {}
    for path in sorted((ROOT / "plugins").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("ansible", "ansible_collections", "__future__"):
                    found.setdefault(top, []).append(path.relative_to(ROOT).as_posix())
    return found


def test_antsibull_docs_lint_collection_docs():
    """Every module's, filter's and role's documentation renders for the docsite, with no broken markup or
    reference (O() to an option that is not there, M() of a role, a role entry point without a description)."""
    res = run([str(BIN / "antsibull-docs"), "lint-collection-docs", "--plugin-docs", str(ROOT)])
    assert res.returncode == 0, "antsibull-docs lint-collection-docs --plugin-docs .:\n" + res.stdout + res.stderr


def test_antsibull_changelog_lint():
    res = run([str(BIN / "antsibull-changelog"), "lint"])
    assert res.returncode == 0, res.stdout + res.stderr


def test_collection_ee_metadata_covers_what_the_plugins_import():
    """meta/execution-environment.yml is what ansible-builder reads from the collection when it installs it into an
    image: file paths relative to the collection's root (inline lists there break ansible-builder's introspection),
    naming every third-party package the plugins import and the system packages the controller side runs."""
    meta = load("meta/execution-environment.yml")
    assert meta["version"] == 3
    deps = meta["dependencies"]
    for entry in ("python", "system"):
        assert isinstance(deps[entry], str) and not os.path.isabs(deps[entry]), (entry, deps[entry])
        assert (ROOT / deps[entry]).is_file(), deps[entry]
    wanted = requirement_names((ROOT / deps["python"]).read_text())
    imports = third_party_imports()
    assert {"matplotlib", "kubernetes", "mlflow"} <= set(imports), imports
    dists = importlib.metadata.packages_distributions()
    for module, files in sorted(imports.items()):
        names = {d.lower() for d in dists.get(module, [module])}
        assert names & {w.lower() for w in wanted}, (
            "%s (imported by %s) is not in %s: add its package there" % (module, ", ".join(files), deps["python"]))
    system = (ROOT / deps["system"]).read_text()
    assert {"rsync", "openssh-client"} <= bindep_packages(system, ["platform:dpkg", "platform:debian"])
    assert {"rsync", "openssh-clients"} <= bindep_packages(system, ["platform:rpm", "platform:redhat"])


def test_ansible_builder_creates_the_execution_environment_context(tmp_path):
    """ansible-builder create on execution-environment.yml: a Containerfile from the stack image (image.yml's,
    named with EE_BASE_IMAGE) that installs the collection's Python requirements and bindep packages and the
    collections galaxy.yml declares; the context's own introspection finds the collection's requirements."""
    ee = load("execution-environment.yml")
    meta = load("meta/execution-environment.yml")
    assert ee["version"] == 3
    for entry in ("python", "system"):
        assert ee["dependencies"][entry] == meta["dependencies"][entry], entry
    declared = load("galaxy.yml")["dependencies"]
    assert {c["name"]: c["version"] for c in ee["dependencies"]["galaxy"]["collections"]} == declared

    context = tmp_path / "context"
    res = run([str(BIN / "ansible-builder"), "create", "-f", str(ROOT / "execution-environment.yml"),
               "--context", str(context)])
    assert res.returncode == 0, res.stdout + res.stderr
    containerfile = (context / "Containerfile").read_text()
    base = ee["images"]["base_image"]["name"]
    assert 'ARG EE_BASE_IMAGE="%s"' % base in containerfile and "FROM $EE_BASE_IMAGE AS base" in containerfile
    assert 'ARG PYCMD="%s"' % ee["dependencies"]["python_interpreter"]["python_path"] in containerfile
    assert 'ARG PKGMGR="/usr/bin/apt-get"' in containerfile
    assert "ansible-core==" in containerfile and "ansible-runner==" in containerfile
    for step in ("COPY _build/requirements.txt requirements.txt", "COPY _build/bindep.txt bindep.txt",
                 "RUN /output/scripts/assemble", "RUN /output/scripts/install-from-bindep",
                 "ansible-galaxy collection install $ANSIBLE_GALAXY_CLI_COLLECTION_OPTS -r requirements.yml"):
        assert step in containerfile, step
    build = context / "_build"
    assert (build / "requirements.txt").read_text() == (ROOT / meta["dependencies"]["python"]).read_text()
    assert (build / "bindep.txt").read_text() == (ROOT / meta["dependencies"]["system"]).read_text()
    assert [c["name"] for c in yaml.safe_load((build / "requirements.yml").read_text())["collections"]] == \
        list(declared)

    # The step of the build that reads every installed collection's meta/execution-environment.yml.
    collections = tmp_path / "collections" / "ansible_collections" / "multinode"
    collections.mkdir(parents=True)
    (collections / "deepspeed").symlink_to(ROOT)
    res = run([sys.executable, str(build / "scripts" / "introspect.py"), "introspect", str(tmp_path / "collections")])
    assert res.returncode == 0, res.stdout + res.stderr
    found = yaml.safe_load(res.stdout.split("---", 1)[1])
    ours = [line.split("#", 1)[0].strip() for line in found["python"] if "multinode.deepspeed" in line]
    assert requirement_names("\n".join(ours)) == requirement_names((build / "requirements.txt").read_text())
    assert any(line.startswith("rsync") and "multinode.deepspeed" in line for line in found["system"])
