"""Supervision: the node process starts one child per slot of its host, watches them, and stops them all
(their whole process groups) when one fails, when stdin closes, or on SIGTERM or SIGHUP."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..agent import MARKER
from .engines import resolve_device
from .protocol import BenchError, Paths, say
from .work import host_slots, read_work

KILL_GRACE_S = 5.0
TAIL_LINES = 15
STOPPED_EXIT = 143


@dataclass
class Child:
    slot: int
    proc: subprocess.Popen
    log: Path
    started: float


class Stop:
    """Why the node process must stop its children; set by a signal handler or the stdin watcher."""

    def __init__(self):
        self.event = threading.Event()
        self.reason = ""

    def set(self, reason: str) -> None:
        if not self.event.is_set():
            self.reason = reason
            self.event.set()


def watch_stdin(stop: Stop, fd: int | None = None) -> threading.Thread:
    """A daemon thread that reads stdin to its end, then asks the node process to stop."""
    fd = sys.stdin.fileno() if fd is None else fd

    def watch():
        try:
            while os.read(fd, 4096):
                pass
        except OSError:
            pass
        stop.set("stdin closed (the driver's ssh connection went away)")

    thread = threading.Thread(target=watch, name="watch-stdin", daemon=True)
    thread.start()
    return thread


def child_env(run_id: str, device: str, local_slot: int, threads: int) -> dict:
    env = dict(os.environ)
    env[MARKER] = run_id
    env["OMP_NUM_THREADS"] = str(threads)
    env["PYTHONUNBUFFERED"] = "1"
    # The child imports multinode_ds from where this process found it, whatever its working directory.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = str(local_slot)
    return env


def child_command(args, slot: int) -> list[str]:
    return [sys.executable, "-m", "multinode_ds.bench_worker", "--work", os.path.abspath(args.work),
            "--host", args.host, "--phase", args.phase, "--slot", str(slot)]


def start_child(args, work: dict, entry: dict, device: str, threads: int) -> Child:
    """One slot's process, in its own session (so its whole process group can be stopped), logging to a file."""
    log = Paths(Path(work["out_dir"]), args.phase, entry["slot"]).log
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as fh:
        proc = subprocess.Popen(child_command(args, entry["slot"]), stdin=subprocess.DEVNULL, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                env=child_env(work["run_id"], device, entry["local_slot"], threads))
    return Child(entry["slot"], proc, log, time.monotonic())


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit {code}"


def tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, os.fstat(fh.fileno()).st_size - 65536))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return [f"(cannot read {path}: {exc.strerror})"]
    return text.rstrip("\n").splitlines()[-lines:]


def signal_group(child: Child, sig: int) -> None:
    try:
        os.killpg(child.proc.pid, sig)
    except OSError:
        pass


def stop_children(children: list[Child], grace: float = KILL_GRACE_S) -> None:
    """SIGTERM the children's process groups, SIGKILL them after ``grace`` seconds; reap the children."""
    running = [c for c in children if c.proc.poll() is None]
    if not running:
        return
    say(f"stopping slot(s) {', '.join(str(c.slot) for c in running)}")
    for c in running:
        signal_group(c, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(c.proc.poll() is None for c in running):
        time.sleep(0.1)
    for c in running:
        signal_group(c, signal.SIGKILL)  # also what the slot started itself (vLLM's engine processes)
    for c in running:
        say(f"slot {c.slot} stopped ({describe_exit(c.proc.wait())})")


def supervise(children: list[Child], stop: Stop) -> int:
    """Wait for the children: 0 when all exit 0, 1 as soon as one fails, 143 when stopped from outside."""
    pending = list(children)
    while pending:
        if stop.event.is_set():
            say(f"{stop.reason}: stopping")
            stop_children(pending)
            return STOPPED_EXIT
        for c in list(pending):
            code = c.proc.poll()
            if code is None:
                continue
            pending.remove(c)
            say(f"slot {c.slot} finished: {describe_exit(code)} after {time.monotonic() - c.started:.1f} s")
            if code != 0:
                say(f"slot {c.slot} failed; last lines of {c.log}:")
                for line in tail(c.log):
                    say(f"  | {line}")
                stop_children(pending)
                return 1
        stop.event.wait(0.2)
    return 0


def node_main(args) -> int:
    where = f"bench_worker: host {args.host} phase {args.phase}"
    try:
        work = read_work(args.work)
        slots = host_slots(work, args.host, args.phase)
        device = resolve_device(work["device"])
    except BenchError as exc:
        print(f"{where}: {exc}", file=sys.stderr, flush=True)
        return 1
    stop = Stop()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: stop.set(f"got {signal.Signals(signum).name}"))
    if args.watch_stdin:
        watch_stdin(stop)
    threads = max(1, (os.cpu_count() or 1) // len(slots))
    children: list[Child] = []
    try:
        for entry in slots:
            if stop.event.is_set():
                break
            children.append(start_child(args, work, entry, device, threads))
            say(f"{args.host} {args.phase}: started slot {entry['slot']} (local slot {entry['local_slot']}, "
                f"{len(entry['samples'])} samples, device {device}, {threads} threads, pid {children[-1].proc.pid}, "
                f"log {children[-1].log})")
        return supervise(children, stop)
    finally:
        stop_children(children)
