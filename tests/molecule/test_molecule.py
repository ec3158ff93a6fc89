"""Every role's molecule scenario (extensions/molecule/<role>): podman driver, converge, idempotence, testinfra verify.
The scenarios run in the background from the start of the session, at a low CPU weight (scenarios.py); each test
waits for its own."""
import re
from pathlib import Path

import pytest
import scenarios
from scenarios import SCENARIOS

pytestmark = pytest.mark.molecule
ROOT = Path(__file__).resolve().parents[2]


def test_every_role_has_a_scenario():
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "tasks" / "main.yml").exists())
    assert SCENARIOS == roles


@pytest.fixture(scope="session")
def scenario_runs(request):
    """Every selected scenario, started when the session's tests were collected (tests/conftest.py), or now."""
    chosen = set(item.callspec.params["scenario"] for item in request.session.items
                 if getattr(item, "callspec", None) is not None and "scenario" in item.callspec.params)
    scenarios.start(chosen)
    return scenarios.results()


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
