"""The Makefile's benchmark targets pass the sizes, rounds and steps the docs give (make -n: nothing runs)."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")


def planned(target, *assignments):
    """The benchmark's command line as make would run it."""
    out = subprocess.run(["make", "-n", "-C", str(ROOT), "--no-print-directory", target, *assignments],
                         capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if "scripts/cost/" in line][-1].split()


@pytest.mark.parametrize("target,default,given", [
    # make's $(or a,b,c) takes each comma as an argument separator: a list default must not be cut at its first comma
    ("bench-site", ["--sizes", "2,8", "--rounds", "3"], ["--sizes", "4,16", "--rounds", "7"]),
    ("bench-scale", ["--sizes", "2,4,8,16", "--rounds", "2", "--steps", "5"],
     ["--sizes", "4,16", "--rounds", "7", "--steps", "9"]),
    ("bench-floor", ["--sizes", "2,16", "--rounds", "3"], ["--sizes", "4,16", "--rounds", "7"]),
])
def test_benchmark_defaults_and_overrides(target, default, given):
    argv = planned(target)
    assert argv[argv.index(default[0]):][:len(default)] == default, argv
    argv = planned(target, "SIZES=4,16", "ROUNDS=7", "STEPS=9")
    assert argv[argv.index(given[0]):][:len(given)] == given, argv
