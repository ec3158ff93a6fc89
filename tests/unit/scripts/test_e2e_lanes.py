"""The end-to-end tests' two lanes (tests/e2e/lanes.py): which tests go to the second lane and when, what its
process is given, and how its time by phase joins the session's (tests/phases.py)."""
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

TESTS = Path(__file__).resolve().parents[2]
for where in (TESTS, TESTS / "e2e"):
    if str(where) not in sys.path:
        sys.path.insert(0, str(where))
import lanes  # noqa: E402  # pylint: disable=wrong-import-position
import phases  # noqa: E402  # pylint: disable=wrong-import-position

SCRIPT = TESTS.parent / "scripts" / "localcluster.py"


class Item:
    def __init__(self, path, e2e=True):
        self.path = Path(path)
        self.nodeid = "tests/e2e/%s::test_x" % self.path.name if e2e else "tests/unit/%s::t" % self.path.name
        self.e2e = e2e

    def get_closest_marker(self, name):
        return object() if name == "e2e" and self.e2e else None


class Config:
    def __init__(self):
        self.deselected = []
        self.hook = SimpleNamespace(pytest_deselected=self.deselect)

    def deselect(self, items):
        self.deselected.extend(items)


@pytest.fixture(name="fresh")
def fixture_fresh(monkeypatch):
    monkeypatch.setattr(lanes, "_state", {})
    for name in ("MNDS_E2E_LANES", "MNDS_LANE", "MNDS_E2E_EARLY"):
        monkeypatch.delenv(name, raising=False)
    return lanes


def session(*names):
    items = [Item(TESTS / "e2e" / name) for name in names]
    return items + [Item(TESTS / "unit" / "test_u.py", e2e=False)]


def test_a_session_with_both_lanes_sends_the_second_lanes_files_to_it_and_waits_for_it_last(fresh):
    items = session("test_second_lane.py", "test_restarts.py", "test_launch.py", "test_faults.py", "test_values.py")
    config = Config()
    ids = fresh.split(config, items)
    assert ids == ["tests/e2e/test_restarts.py::test_x", "tests/e2e/test_faults.py::test_x"]
    assert [i.path.name for i in items] == ["test_launch.py", "test_values.py", "test_u.py", "test_second_lane.py"]
    assert [i.path.name for i in config.deselected] == ["test_restarts.py", "test_faults.py"]
    assert fresh.active()


@pytest.mark.parametrize("names, env", [
    (("test_restarts.py", "test_faults.py", "test_second_lane.py"), {}),       # one lane's files only
    (("test_launch.py", "test_second_lane.py"), {}),                            # the other's only
    (("test_launch.py", "test_restarts.py", "test_second_lane.py"), {"MNDS_E2E_LANES": "1"}),
    (("test_launch.py", "test_restarts.py", "test_second_lane.py"), {"MNDS_E2E_EARLY": "0"}),
    (("test_launch.py", "test_restarts.py", "test_second_lane.py"), {"MNDS_LANE": "b"}),  # the second lane itself
])
def test_otherwise_every_test_stays_and_nothing_waits_for_a_second_lane(fresh, monkeypatch, names, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    items = session(*names)
    config = Config()
    assert fresh.split(config, items) == []
    kept = [n for n in names if n != "test_second_lane.py"]
    assert [i.path.name for i in items] == kept + ["test_u.py"]
    assert [i.path.name for i in config.deselected] == ["test_second_lane.py"]
    assert not fresh.active()
    fresh.start(threading.Event())  # nothing to start
    assert "thread" not in fresh._state  # pylint: disable=protected-access


def test_the_second_lane_has_its_own_cluster_inventory_and_phase_file_and_no_molecule(fresh, monkeypatch):
    monkeypatch.setenv("MNDS_MOLECULE_EARLY", "1")
    env = fresh.environment()
    assert env["MNDS_LANE"] == "b" and env["MNDS_CLUSTER_PREFIX"] == "mndsb" and env["MNDS_MOLECULE_EARLY"] == "0"
    assert env["ANSIBLE_INVENTORY"] == str(TESTS.parent / "inventories" / "local-mndsb" / "hosts.yml")
    assert env["MNDS_PHASES_FILE"] == str(lanes.PHASES) and lanes.PHASES != phases.OUTPUT
    # localcluster.py puts that cluster's keys, inventory and mounts apart, and keeps the one node image.
    code = ("import importlib.util, json, sys; s = importlib.util.spec_from_file_location('lc', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); "
            "print(json.dumps([str(m.CLUSTER), str(m.INVENTORY_DIR), str(m.MOUNTS), m.NETWORK, m.VOLUME, "
            "m.container('coord'), m.image_name().split(':')[0]]))")
    got = {}
    for prefix in ("mnds", "mndsb"):
        out = subprocess.run([sys.executable, "-c", code, str(SCRIPT)], capture_output=True, text=True, check=True,
                             env=dict(os.environ, MNDS_CLUSTER_PREFIX=prefix)).stdout
        got[prefix] = __import__("json").loads(out)
    root = TESTS.parent
    assert got["mnds"][:3] == [str(root / ".cluster"), str(root / "inventories" / "local"),
                               str(root / ".cache" / "mounts")]
    assert got["mndsb"][:3] == [str(root / ".cluster-mndsb"), str(root / "inventories" / "local-mndsb"),
                                str(root / ".cache" / "mounts-mndsb")]
    assert got["mndsb"][3:6] == ["mndsb-net", "mndsb-shared", "mndsb-coord"]
    assert got["mnds"][6] == got["mndsb"][6] == "localhost/mnds-node"


def test_the_second_lane_runs_once_the_first_site_ended_and_its_result_and_log_come_back(
        fresh, monkeypatch, tmp_path):
    monkeypatch.setattr(lanes, "LOG", tmp_path / "lane-b.log")
    monkeypatch.setattr(lanes, "PHASES", tmp_path / "phases-b.json")
    monkeypatch.setattr(lanes, "JUNIT", tmp_path / "lane-b.xml")
    seen = {}

    class Proc:
        def __init__(self, argv, **kw):
            seen.update(argv=argv, env=kw["env"], stdin=kw["stdin"])
            kw["stdout"].write("FAILED tests/e2e/test_faults.py::test_x - assert 1\n1 failed, 3 passed\n")

        def wait(self):
            return 1

        def poll(self):
            return 1

    monkeypatch.setattr(lanes.subprocess, "Popen", Proc)
    fresh.split(Config(), session("test_faults.py", "test_launch.py"))
    after = threading.Event()
    fresh.start(after)
    assert not fresh._state["done"].wait(0.2) and "argv" not in seen  # pylint: disable=protected-access
    after.set()
    rc, text = fresh.wait(timeout=30)
    assert rc == 1 and "1 failed, 3 passed" in text
    assert seen["argv"][-1] == "tests/e2e/test_faults.py::test_x" and seen["stdin"] == subprocess.DEVNULL
    assert seen["env"]["MNDS_CLUSTER_PREFIX"] == "mndsb"
    assert fresh.record() == (None, None)  # it wrote no phase file


def test_the_second_lanes_phases_join_the_sessions_at_their_times():
    mine = phases.Phases(started=1000.0)
    mine.add("tests/e2e/test_launch.py::t", "call", 5.0, start=1010.0, stop=1015.0)
    mine.add("tests/unit/test_u.py::t", "call", 1.0, start=1001.0, stop=1002.0)
    other = phases.Phases(started=1300.0)
    other.add("tests/e2e/test_restarts.py::t", "call", 40.0, start=1320.0, stop=1360.0, outcome="failed")
    other.note("first site.yml (early)", 200.0)
    record = phases.merge(mine.record(now=1400.0), other.record(now=1400.0), 300.0, "lane b")
    assert list(record["phases"]) == ["unit", "e2e/test_launch.py", "e2e/test_restarts.py (lane b)"]
    expected = {"tests": 1, "seconds": 40.0, "failed": 1, "wall": [320.0, 360.0]}
    assert record["phases"]["e2e/test_restarts.py (lane b)"] == expected
    assert record["background"] == {"first site.yml (early) (lane b)": 200.0} and record["tests"] == 3
