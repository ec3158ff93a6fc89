"""Every role entry point that a playbook, a role or a molecule scenario includes is one its argument spec names, and
is included so that Ansible applies that spec.

Ansible validates an ``include_role``/``import_role`` against ``argument_specs[tasks_from]``, the value exactly as
written: ``tasks_from: select.yml`` finds no spec named ``select.yml`` and runs unchecked, where ``tasks_from: select``
runs the same file after its spec's check.  A launch backend's steps are included by the plan's name for them
(``train_job.launch.steps.<step>``, e.g. ``kubernetes/start``): each backend's steps are entry points of role
``backend`` with their tasks file, and role ``backend`` has no entry point that no backend uses."""
from pathlib import Path

import pytest
import yaml
from ansible_collections.multinode.deepspeed.plugins.module_utils.launch.backends import REGISTRY

ROOT = Path(__file__).resolve().parents[2]
PREFIX = "multinode.deepspeed."
INCLUDES = ("ansible.builtin.include_role", "ansible.builtin.import_role", "include_role", "import_role")
pytestmark = pytest.mark.quality


def yaml_files():
    for folder in ("playbooks", "roles", "extensions"):
        yield from sorted((ROOT / folder).rglob("*.yml"))
    yield from sorted(ROOT.glob("*.yml"))


def includes(data):
    """``(role, tasks_from)`` for every role include with a ``tasks_from`` anywhere in ``data`` (parsed YAML)."""
    if isinstance(data, list):
        for item in data:
            yield from includes(item)
    elif isinstance(data, dict):
        for key, value in data.items():
            if key in INCLUDES and isinstance(value, dict) and "tasks_from" in value:
                yield str(value.get("name", "")), str(value["tasks_from"])
            else:
                yield from includes(value)


def specs(role):
    path = ROOT / "roles" / role / "meta" / "argument_specs.yml"
    return yaml.safe_load(path.read_text())["argument_specs"] if path.exists() else {}


def problems(path):
    """What is wrong with the role includes of the YAML file ``path``: an entry point with no spec, or one written so
    that its spec is not applied (an extension), or a templated one other than a backend's step."""
    out = []
    for role, tasks_from in includes(yaml.safe_load(path.read_text())):
        if not role.startswith(PREFIX):
            continue
        short = role[len(PREFIX):]
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        where = "%s: %s tasks_from %s" % (shown, role, tasks_from)
        if "{{" in tasks_from:
            if short != "backend" or ".launch.steps." not in tasks_from:
                out.append(where + ": only a backend's step (job.launch.steps.<step>) is named by a template")
        elif tasks_from.endswith((".yml", ".yaml")):
            out.append(where + ": written with its extension, Ansible applies no argument spec (drop the extension)")
        elif tasks_from not in specs(short):
            out.append(where + ": role %s's argument_specs has no entry point %s" % (short, tasks_from))
    return out


def test_an_included_entry_point_is_checked_against_its_spec():
    found = [p for path in yaml_files() for p in problems(path)]
    assert not found, "\n".join(found)


def test_an_unchecked_include_is_found(tmp_path):
    planted = tmp_path / "planted.yml"
    planted.write_text(yaml.safe_dump([{"hosts": "all", "tasks": [
        {"name": "a", "ansible.builtin.include_role": {"name": "multinode.deepspeed.stack", "tasks_from": "select.yml"}},
        {"name": "b", "ansible.builtin.include_role": {"name": "multinode.deepspeed.nfs", "tasks_from": "nothing"}},
        {"name": "c", "ansible.builtin.include_role": {"name": "multinode.deepspeed.nfs",
                                                       "tasks_from": "{{ x }}"}},
        {"name": "d", "ansible.builtin.include_role": {"name": "multinode.deepspeed.stack", "tasks_from": "select"}},
    ]}]))
    found = problems(planted)
    assert len(found) == 3, found
    assert "drop the extension" in found[0] and "no entry point nothing" in found[1] and "template" in found[2]


def test_every_backend_step_is_an_entry_point_with_its_tasks_file():
    entries = specs("backend")
    used = set()
    for name, backend in REGISTRY.items():
        for step, entry in backend.tasks.entry_points().items():
            assert entry in entries, "backend %s step %s: no entry point %s in role backend" % (name, step, entry)
            assert (ROOT / "roles" / "backend" / "tasks" / (entry + ".yml")).is_file(), entry
            assert entry == "%s/%s" % (backend.tasks.folder, step)
            used.add(entry)
    assert set(entries) == used, "entry points of role backend that no backend has: %s" % sorted(set(entries) - used)
    # One folder per backend that has steps, nothing else in the role's tasks.
    folders = sorted(p.name for p in (ROOT / "roles" / "backend" / "tasks").iterdir())
    assert folders == sorted(set(b.tasks.folder for b in REGISTRY.values() if b.tasks.folder)), folders


def test_the_roles_readme_names_the_test_of_every_step():
    """Role backend has no molecule scenario; its README says why and names, for every step, the end-to-end test that
    runs it (which must exist)."""
    readme = (ROOT / "roles" / "backend" / "README.md").read_text()
    assert "## Why it has no molecule scenario" in readme
    for entry in specs("backend"):
        rows = [line for line in readme.splitlines() if line.startswith("| `%s` |" % entry)]
        assert len(rows) == 2, (entry, rows)  # what it does, and its test
        for test in rows[1].split("`")[1::2]:
            if test.startswith("tests/e2e/"):
                path, _sep, name = test.partition("::")
                assert (ROOT / path).is_file() and ("def %s(" % name) in (ROOT / path).read_text(), test
