"""Make the collection importable as ansible_collections.multinode.deepspeed in place; start the molecule scenarios
and the slow quality gates early (below)."""
import importlib
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COLLECTIONS = ROOT / ".collections"
link = COLLECTIONS / "ansible_collections" / "multinode" / "deepspeed"
if not link.exists():
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to("../../..")
for p in (str(COLLECTIONS), str(ROOT)):
    if p not in sys.path:
        sys.path.insert(0, p)

# ansible-core 2.19 replaces sys.intern when its module_utils are imported, and
# torch._dynamo refuses to load after that.  The node package's tests import
# torch in the same process as the module tests import ansible: load torch's
# pieces first.
try:
    import torch._dynamo  # noqa: F401  # pylint: disable=unused-import
except ImportError:
    pass


# The suite's time by phase (tests/phases.py): every test's report, one line per phase at the end, and
# tests/output/test-phases.json.
sys.path.insert(0, str(ROOT / "tests"))
import background  # noqa: E402  # pylint: disable=wrong-import-position
import phases as _phases  # noqa: E402  # pylint: disable=wrong-import-position

PHASES = _phases.Phases()


def pytest_runtest_logreport(report):
    PHASES.add(report.nodeid, report.when, report.duration, getattr(report, "start", None),
               getattr(report, "stop", None), report.outcome)


def pytest_terminal_summary(terminalreporter):
    # The background jobs (molecule scenarios, lint, sanity: tests/background.py) and the early cluster's parts.
    timings = dict(background.durations())
    if "early" in sys.modules:
        timings.update(sys.modules["early"].timings())
    for what, seconds in timings.items():
        PHASES.note(what, seconds)
    setup = os.environ.get("MNDS_SETUP_SECONDS")
    record = PHASES.record(float(setup) if setup else None)
    if "lanes" in sys.modules:  # the second lane's phases, from its own file, at their times in this session
        other, started = sys.modules["lanes"].record()
        if other is not None:
            _phases.merge(record, other, started - PHASES.started, "lane b")
    path = _phases.write(record)
    terminalreporter.write_sep("=", "time by phase (%s)" % path.relative_to(ROOT))
    for line in _phases.lines(record):
        terminalreporter.write_line(line)


# The molecule scenarios run in the background from the end of collection, at a low CPU weight
# (tests/molecule/scenarios.py): they overlap every other test; an end-to-end test waits only for the node image
# before its fixtures start the cluster (the two must not build it at once).  ansible-lint and ansible-test sanity
# do the same (tests/quality/gates.py), and their two tests come last, to read the results.
def _helper(folder, name):
    where = str(ROOT / "tests" / folder)
    if where not in sys.path:
        sys.path.insert(0, where)
    return importlib.import_module(name)


def _scenarios():
    return _helper("molecule", "scenarios")


def _early():
    return _helper("e2e", "early")


def _gates():
    return _helper("quality", "gates")


def _lanes():
    return _helper("e2e", "lanes")


def pytest_collection_modifyitems(config, items):
    # The second lane's end-to-end tests run in a process of their own (tests/e2e/lanes.py).
    if any(item.get_closest_marker("e2e") is not None for item in items):
        _lanes().split(config, items)
    # The tests that only wait for a quality gate run last: nothing else waits for the gates meanwhile.
    last = _gates().items(items)
    if last:
        items[:] = [item for item in items if item not in last] + last


def pytest_collection_finish(session):
    if session.config.option.collectonly:
        return  # nothing runs: nothing starts
    # A session with end-to-end tests starts the local cluster and its first site.yml now, in the background
    # (tests/e2e/early.py; MNDS_E2E_EARLY=0 leaves them to the fixtures): they overlap the unit tests.
    e2e = any(item.get_closest_marker("e2e") is not None for item in session.items)
    _start_molecule(session, e2e)
    _gates().start([item.name for item in _gates().items(session.items)])
    if e2e and os.environ.get("MNDS_E2E_EARLY", "1") != "0":
        _early().start()
        # The second lane, if split kept any of its tests, once this session's first site.yml ended.
        _lanes().start(_early().done_event())
        # The stack's image that the Kubernetes pods' tests pull, built in the background once site.yml has ended.
        if any("registry" in getattr(item, "fixturenames", ()) for item in session.items):
            _early().image_start()
    # The Kubernetes tests' control plane, compiled the first time: in the background at the lowest priority.
    if any(item.get_closest_marker("k8s") is not None for item in session.items) \
            and os.environ.get("MNDS_E2E_EARLY", "1") != "0":
        _early().k8s_build_start()


def _start_molecule(session, e2e):
    chosen = set(item.callspec.params["scenario"] for item in session.items
                 if item.get_closest_marker("molecule") is not None and getattr(item, "callspec", None) is not None
                 and "scenario" in item.callspec.params)
    if chosen and os.environ.get("MNDS_MOLECULE_EARLY", "1") != "0":
        _scenarios().start(chosen, e2e=e2e)


def pytest_sessionfinish(session):
    # A session that ends before its second lane did (Ctrl-C, -x) stops it.
    if "lanes" in sys.modules:
        sys.modules["lanes"].stop()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.get_closest_marker("e2e") is not None and "scenarios" in sys.modules:
        sys.modules["scenarios"].wait_for_image()
