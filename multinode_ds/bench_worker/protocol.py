"""What the node process and its slots share with the driver: the error they report, where each file of the
run directory lies, how a file is written (whole, by rename) and seen (by listing, for NFS), and the lines
printed on stdout.  The protocol itself is described in the package's docstring."""
from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path


class BenchError(Exception):
    """The slot or node cannot run as asked; the message says why and what to do."""


def slot_name(phase: str, slot: int) -> str:
    return f"{phase}-slot{slot}"


@dataclass(frozen=True)
class Paths:
    """Where the worker reads and writes, all under the run's ``out_dir``."""

    out_dir: Path
    phase: str
    slot: int = 0

    @property
    def name(self) -> str:
        return slot_name(self.phase, self.slot)

    @property
    def log(self) -> Path:
        return self.out_dir / "logs" / f"{self.name}.log"

    @property
    def ready(self) -> Path:
        return self.out_dir / "ready" / self.name

    @property
    def go(self) -> Path:
        return self.out_dir / f"go-{self.phase}"

    @property
    def progress(self) -> Path:
        return self.out_dir / "progress" / f"{self.name}.json"

    @property
    def result(self) -> Path:
        return self.out_dir / "slots" / f"{self.name}.json"

    @property
    def loadgen_dir(self) -> Path:
        return self.out_dir / "loadgen" / self.name


def write_json(path: Path, data: dict) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True) + "\n")
    os.replace(tmp, path)


def file_appeared(path: Path) -> bool:
    """Whether ``path`` exists, by listing its directory (see the package docstring on NFS)."""
    try:
        return path.name in os.listdir(path.parent)
    except FileNotFoundError:
        return False


def say(msg: str) -> None:
    """A line on stdout; a vanished reader (the ssh connection went away) does not stop the caller."""
    try:
        print(msg, flush=True)
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
