"""Run one launch-cost benchmark and keep its result as a dated file under docs/benchmarks/.

    .venv/bin/python scripts/cost/record.py TARGET [--out DIR] -- COMMAND...

The Makefile's bench-* targets run their script through this: the script prints as it always does
(its output passes through as it comes), and when it ends well its output is also written to
docs/benchmarks/<YYYY-MM-DD>-<TARGET>.md, with the command, the machine and the commit, and the JSON
file the script wrote (its --json argument) is copied beside it as <YYYY-MM-DD>-<TARGET>.json (a
plot next to that JSON, <name>.png, as well). A second result of the same target on the same day
gets -2, -3... A benchmark that fails leaves no file. The prose pages (docs/launch-overhead.md) state
the current figure and the command; these files are the record.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "benchmarks"


def json_argument(command: list[str]) -> Path | None:
    """The path the benchmark writes its JSON to: its ``--json FILE`` or ``--json=FILE``, or None."""
    for i, word in enumerate(command):
        if word == "--json" and i + 1 < len(command):
            return Path(command[i + 1])
        if word.startswith("--json="):
            return Path(word.split("=", 1)[1])
    return None


def machine() -> str:
    """The machine in words: its CPUs and memory, the kernel (what the figures depend on)."""
    mem = ""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
        mem = ", %.0f GiB of memory" % (kib / 2 ** 20)
    except (OSError, StopIteration, ValueError):
        pass
    return "%d CPUs%s, %s %s" % (os.cpu_count() or 0, mem, platform.system(), platform.release())


def commit() -> str:
    """The repository's commit (with ``+changes`` when the tree differs from it), or ``unknown``."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" +changes" if dirty else "")


def free_name(out_dir: Path, date: str, target: str) -> str:
    """``<date>-<target>``, or ``<date>-<target>-<n>`` when that day already has a result of the target."""
    stem, n = "%s-%s" % (date, target), 1
    while (out_dir / (stem + ".md")).exists():
        n += 1
        stem = "%s-%s-%d" % (date, target, n)
    return stem


def record(target: str, command: list[str], printed: str, data=None, plot: Path | None = None,
           when: datetime.date | None = None, out_dir: Path = OUT, where: str | None = None,
           revision: str | None = None) -> list[Path]:
    """Write the result files of one benchmark run; returns their paths (the .md first)."""
    date = (when or datetime.date.today()).isoformat()
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = free_name(out_dir, date, target)
    written = [out_dir / (stem + ".md")]
    lines = ["# %s, %s" % (target, date), "",
             "`make %s`: `%s`, on %s; commit %s." % (target, " ".join(command), where or machine(),
                                                     revision or commit())]
    if data is not None:
        written.append(out_dir / (stem + ".json"))
        written[-1].write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        lines += ["", "The data: [%s](%s)." % (written[-1].name, written[-1].name)]
    if plot is not None and plot.is_file():
        written.append(out_dir / (stem + ".png"))
        shutil.copyfile(plot, written[-1])
        lines += ["", "![%s](%s)" % (target, written[-1].name)]
    lines += ["", "What it printed:", "", "```", printed.rstrip("\n"), "```", ""]
    written[0].write_text("\n".join(lines))
    return written


def run(command: list[str]) -> tuple[int, str]:
    """Runs the benchmark with its output passing through line by line; (exit code, what it printed)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    printed = []
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            printed.append(line)
    return proc.returncode, "".join(printed)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv or argv.index("--") < 1 or argv.index("--") == len(argv) - 1:
        raise SystemExit("usage: record.py TARGET [--out DIR] -- COMMAND...")
    mine, command = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    target, out_dir = mine[0], OUT
    if len(mine) == 3 and mine[1] == "--out":
        out_dir = Path(mine[2])
    elif len(mine) != 1:
        raise SystemExit("usage: record.py TARGET [--out DIR] -- COMMAND...")
    started = datetime.datetime.now().timestamp()
    rc, printed = run(command)
    if rc != 0:
        print("[%s] the benchmark failed (exit code %d): no result written to %s" % (target, rc, out_dir))
        return rc
    data_file = json_argument(command)
    data = json.loads(data_file.read_text()) if data_file and data_file.is_file() else None
    plot = data_file.with_suffix(".png") if data_file else None
    if plot is not None and not (plot.is_file() and plot.stat().st_mtime >= started):
        plot = None  # an older run's plot, not this one's
    written = record(target, command, printed, data, plot, out_dir=out_dir)
    print("[%s] the result: %s" % (target, ", ".join(str(p) for p in written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
