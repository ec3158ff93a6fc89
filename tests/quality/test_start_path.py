"""One path for every attempt (issue 46, point 1): the first attempt and every later one start through
playbooks/tasks/start.yml; recovery (playbooks/tasks/recover.yml) only judges and places; the checks of the nodes
that take a place are role preflight's, whose defaults are written nowhere else."""
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "playbooks" / "tasks"
START = TASKS / "start.yml"
RECOVER = TASKS / "recover.yml"
PREFLIGHT = ROOT / "roles" / "preflight"
pytestmark = pytest.mark.quality


def yaml_files():
    return sorted((ROOT / "playbooks").rglob("*.yml")) + sorted((ROOT / "roles").rglob("tasks/**/*.yml"))


def tasks_of(data):
    """Every task of a playbook or tasks file, blocks and plays opened."""
    for item in data or []:
        if not isinstance(item, dict):
            continue
        for key in ("tasks", "pre_tasks", "post_tasks", "handlers", "block", "rescue", "always"):
            yield from tasks_of(item.get(key))
        if not any(key in item for key in ("block", "tasks", "hosts", "import_playbook")):
            yield item


def actions(path):
    """(action, task) of each task of ``path``: the module or include it calls."""
    out = []
    for task in tasks_of(yaml.safe_load(path.read_text())):
        names = [k for k in task if "." in k or k in ("include_tasks", "include_role", "import_tasks")]
        out.append((names[0] if names else None, task))
    return out


def where(action, test=lambda task: True):
    return sorted(str(path.relative_to(ROOT)) for path in yaml_files()
                  for name, task in actions(path) if name == action and test(task))


def test_every_attempt_starts_its_agents_and_its_backend_in_start_yml():
    assert where("multinode.deepspeed.agent_start") == ["playbooks/tasks/start.yml"]
    starts = where("ansible.builtin.include_role",
                   lambda task: ".launch.steps.start" in str(task["ansible.builtin.include_role"].get("tasks_from")))
    assert starts == ["playbooks/tasks/start.yml"]
    secrets = where("ansible.builtin.include_tasks", lambda task: "secrets.yml" in str(task["ansible.builtin.include_tasks"]))
    assert secrets == ["playbooks/tasks/start.yml"]
    # Included by the first attempt (train.yml) and by every next one.
    callers = where("ansible.builtin.include_tasks", lambda task: str(task["ansible.builtin.include_tasks"]).endswith(
        "start.yml") and "before_start" not in str(task["ansible.builtin.include_tasks"]))
    assert callers == ["playbooks/tasks/next_attempt.yml", "playbooks/train.yml"]


def test_recovery_only_judges_and_places():
    text = RECOVER.read_text()
    assert len(text.splitlines()) <= 80, "playbooks/tasks/recover.yml is %d lines" % len(text.splitlines())
    used = set(name for name, _task in actions(RECOVER))
    assert used <= {"multinode.deepspeed.run_recovery", "ansible.builtin.debug", "ansible.builtin.set_fact",
                    "ansible.builtin.include_role"}, used
    steps = [task[name]["step"] for name, task in actions(RECOVER) if name == "multinode.deepspeed.run_recovery"]
    assert steps == ["judge", "quarantine", "place"]
    roles = [(task[name]["name"], task[name]["tasks_from"]) for name, task in actions(RECOVER)
             if name == "ansible.builtin.include_role"]
    assert roles == [("multinode.deepspeed.backend", "{{ train_job.launch.steps.recover }}"),
                     ("multinode.deepspeed.preflight", "candidates")]


def restated_defaults(paths):
    """Lines of ``paths`` that restate a default of role preflight: ``preflight_x | default(...)`` for any of its
    variables, or the all-reduce test's message sizes (its vars/main.yml)."""
    defaults = yaml.safe_load((PREFLIGHT / "defaults" / "main.yml").read_text())
    values = {"67108864", "1073741824"}
    pattern = re.compile(r"\b(%s)\s*\|\s*default\(" % "|".join(re.escape(k) for k in defaults))
    found = []
    for path in paths:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line) or any(re.search(r"\b%s\b" % v, line) for v in values):
                found.append("%s:%d: %s" % (path.name, number, line.strip()))
    return found


def test_the_checks_of_a_replacement_are_role_preflights():
    """The replacement's checks are the preflight role's tasks, and none of its defaults is restated elsewhere."""
    probes = where("multinode.deepspeed.node_probe")
    assert sorted(set(probes)) == ["roles/preflight/tasks/main.yml", "roles/preflight/tasks/replacement.yml"]
    found = restated_defaults([path for path in yaml_files() if PREFLIGHT not in path.parents])
    assert not found, "role preflight's defaults restated outside it:\n" + "\n".join(found)


def test_a_restated_default_is_found(tmp_path):
    """What the recovery tasks did before: the all-reduce test's defaults written in a playbook."""
    planted = tmp_path / "recover.yml"
    planted.write_text("- ansible.builtin.command:\n    argv: [\"--max-bytes\", \"{{ preflight_max_bytes | "
                       "default('', true) or 67108864 }}\", \"{{ preflight_bandwidth_timeout | default(120) }}\"]\n")
    assert restated_defaults([planted]) == ["recover.yml:2: " + planted.read_text().splitlines()[1].strip()]
    planted.write_text("- ansible.builtin.debug:\n    msg: \"{{ preflight_settings }}\"\n")
    assert restated_defaults([planted]) == []
