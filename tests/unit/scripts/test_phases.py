"""The suite's time by phase (tests/phases.py): which phase a test is in, what adds up, what is written."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import phases  # noqa: E402  # pylint: disable=wrong-import-position


def test_a_test_belongs_to_its_folder_and_an_e2e_test_to_its_file():
    assert phases.phase_of("tests/unit/plugins/module_utils/run/test_x.py::test_y[a]") == "unit"
    assert phases.phase_of("tests/quality/test_quality.py::test_ansible_test_sanity") == "quality"
    assert phases.phase_of("tests/molecule/test_molecule.py::test_scenario[stack]") == "molecule"
    assert phases.phase_of("tests/e2e/test_faults.py::test_a_killed_rank") == "e2e/test_faults.py"
    assert phases.phase_of("test_top.py::test") == "other"


def test_the_record_adds_durations_counts_calls_and_spans_the_wall(tmp_path):
    p = phases.Phases(started=1000.0)
    for when, duration in (("setup", 2.0), ("call", 5.0), ("teardown", 1.0)):
        p.add("tests/e2e/test_a.py::t1", when, duration, start=1010.0, stop=1018.0)
    p.add("tests/e2e/test_a.py::t2", "call", 3.0, start=1020.0, stop=1023.0, outcome="failed")
    p.add("tests/unit/test_u.py::t", "call", 0.5, start=1001.0, stop=1001.5)
    p.note("molecule stack (scenario)", 600.04)
    record = p.record(setup_seconds=12, now=1100.0)
    assert list(record["phases"]) == ["unit", "e2e/test_a.py"]
    assert record["phases"]["e2e/test_a.py"] == {"tests": 2, "seconds": 11.0, "failed": 1, "wall": [10.0, 23.0]}
    assert record["tests"] == 3 and record["pytest_seconds"] == 100.0 and record["total_seconds"] == 112.0
    assert record["background"] == {"molecule stack (scenario)": 600.0}
    text = "\n".join(phases.lines(record))
    assert "set-up" in text and "e2e/test_a.py" in text and "1 failed" in text and "(in the background)" in text
    path = phases.write(record, tmp_path / "out" / "test-phases.json")
    assert json.loads(path.read_text()) == record
