"""The suite's time by phase (issue 45): set-up, unit, quality, molecule and end-to-end per file, so that what each
new test costs shows in every ``make test``.  tests/conftest.py feeds it pytest's reports; at the end it prints one
line per phase and writes ``tests/output/test-phases.json``.

A phase's ``seconds`` add up its tests' own durations (set-up, call and tear-down); ``wall`` is from its first test's
start to its last test's end, counted from the session's start; phases overlap where work runs in the background
(the molecule scenarios and the local cluster's first ``site.yml`` start while the unit tests run), and that
background work is listed apart, with its own seconds."""
import json
import os
import time
from pathlib import Path

# The second lane of end-to-end tests (tests/e2e/lanes.py) writes its own file, which the first merges.
OUTPUT = Path(os.environ.get("MNDS_PHASES_FILE") or Path(__file__).resolve().parent / "output" / "test-phases.json")


def phase_of(nodeid):
    """``tests/e2e/test_x.py::test_y`` -> ``e2e/test_x.py``; ``tests/unit/...`` -> ``unit``; else the folder."""
    parts = nodeid.split("::", 1)[0].split("/")
    if parts and parts[0] == "tests":
        parts = parts[1:]
    if not parts:
        return "other"
    if parts[0] == "e2e" and len(parts) > 1:
        return "e2e/" + parts[-1]
    return parts[0] if len(parts) > 1 else "other"


class Phases:
    """What the reports said, by phase."""

    def __init__(self, started=None):
        self.started = time.time() if started is None else started
        self.phases = {}
        self.background = {}

    def add(self, nodeid, when, duration, start=None, stop=None, outcome="passed"):
        entry = self.phases.setdefault(phase_of(nodeid), {"tests": 0, "seconds": 0.0, "failed": 0,
                                                          "first": None, "last": None})
        entry["seconds"] += float(duration or 0.0)
        if when == "call":
            entry["tests"] += 1
        if outcome == "failed":
            entry["failed"] += 1
        if start is not None:
            first = start - self.started
            entry["first"] = first if entry["first"] is None else min(entry["first"], first)
        if stop is not None:
            last = stop - self.started
            entry["last"] = last if entry["last"] is None else max(entry["last"], last)

    def note(self, name, seconds):
        """Work that ran beside the tests (a molecule scenario, the cluster's start): its own seconds."""
        if seconds is not None:
            self.background[name] = round(float(seconds), 1)

    def record(self, setup_seconds=None, now=None):
        now = time.time() if now is None else now
        phases = {}
        for name, entry in sorted(self.phases.items(), key=lambda kv: (_order(kv[0]), kv[0])):
            phases[name] = {"tests": entry["tests"], "seconds": round(entry["seconds"], 1), "failed": entry["failed"],
                            "wall": [round(entry["first"] or 0.0, 1), round(entry["last"] or 0.0, 1)]}
        return {"setup_seconds": None if setup_seconds is None else round(float(setup_seconds), 1),
                "pytest_seconds": round(now - self.started, 1),
                "total_seconds": round(now - self.started + float(setup_seconds or 0.0), 1),
                "tests": sum(p["tests"] for p in phases.values()), "phases": phases,
                "background": dict(sorted(self.background.items()))}


def merge(record, other, offset, label):
    """``record`` with the phases and background work of ``other`` (another process's record, started ``offset``
    seconds after this session), each name followed by `` (label)``, and its tests counted."""
    for name, p in other.get("phases", {}).items():
        wall = [round(p["wall"][0] + offset, 1), round(p["wall"][1] + offset, 1)]
        record["phases"]["%s (%s)" % (name, label)] = dict(p, wall=wall)
    record["phases"] = dict(sorted(record["phases"].items(), key=lambda kv: (_order(kv[0]), kv[0])))
    for name, seconds in other.get("background", {}).items():
        record["background"]["%s (%s)" % (name, label)] = seconds
    record["background"] = dict(sorted(record["background"].items()))
    record["tests"] = sum(p["tests"] for p in record["phases"].values())
    return record


def _order(name):
    for i, prefix in enumerate(("unit", "quality", "molecule", "e2e")):
        if name.startswith(prefix):
            return i
    return 9


def lines(record):
    """One line per phase, as ``make test`` prints them at the end."""
    out = ["set-up %8.1fs" % record["setup_seconds"]] if record.get("setup_seconds") is not None else []
    for name, p in record["phases"].items():
        out.append("%-40s %8.1fs  %4d tests  (from %.0fs to %.0fs of the session)%s" % (
            name, p["seconds"], p["tests"], p["wall"][0], p["wall"][1], "  %d failed" % p["failed"] if p["failed"]
            else ""))
    for name, seconds in record["background"].items():
        out.append("%-40s %8.1fs  (in the background)" % (name, seconds))
    out.append("total %8.1fs (pytest %.1fs), %d tests" % (
        record["total_seconds"], record["pytest_seconds"], record["tests"]))
    return out


def write(record, path=OUTPUT):
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)
    return path
