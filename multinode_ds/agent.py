"""Per-node run agent: starts a node's share of a run, beats, and stops it for good.

``python -m multinode_ds.agent --run-dir D --host H [--] [CMD ...]``

One agent runs on every node of a run, started detached by the play (module
agent_start or run_prepare), or, with pdsh, by pdsh's command on each rank
node before DeepSpeed's launcher.  The run directory ``D`` lies on storage every
node shares, and serves as the run's control plane:

* ``D/nodes/<host>.json`` -- this agent's heartbeat and state, rewritten every
  ``--interval`` seconds: the PIDs of the run's processes on this node, the
  launcher's exit code once it exited, and why the agent stopped.
* ``D/control/ABORT`` -- written by any agent whose launcher failed, or by the
  controller (a failed rank elsewhere, a silent node, Ctrl-C).  Every agent
  that sees it kills the run's processes on its node: SIGTERM, then SIGKILL.
* ``D/control/lease`` -- touched by the controller while it watches.  When it
  goes stale (the controller died or was interrupted), the agents abort.
* ``D/control/DONE`` -- written by the controller when the run ended well.

The run's processes are found by the ``MULTINODE_DS_RUN_ID`` variable in their
environment (the launcher exports it to every rank), not by a broad ``pkill``
that could hit another job.  With CMD, the agent starts it in its own session
with the run's environment (``D/.deepspeed_env`` plus the marker) and exits
with its exit code; without CMD it only watches (the pdsh backend's workers,
whose ranks the coordinator's launcher starts).  When it exits, it removes the
run's node-local secrets file (``MULTINODE_DS_SECRET_ENV``), if there is one.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from multinode_ds.rank import SECRET_VAR, read_env_file

MARKER = "MULTINODE_DS_RUN_ID"
# File errors a shared disk gives (full, gone stale, failing): retried, then the node's ranks are stopped.
IO_ERRORS = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded", errno.ESTALE: "stale file handle",
             errno.EIO: "I/O error", errno.EROFS: "read-only file system"}
# How often a pause between heartbeats looks for the launcher's exit and the controller's records (seconds).
WAKE = 0.1
EXIT_LINE = re.compile(r"exits with return code = (-?\d+)")
# pdsh's line for a node whose login ended badly ("pdsh@coord: worker2: ssh exited with exit code 255"): the node's
# launcher failed or never started (its SSH login failed); the node's own lines before it ("worker2: ssh: connect
# to host ... Connection refused") say why.
SSH_FAILED = 255
NODE_EXIT_LINE = re.compile(r"^pdsh@[^:\s]+: ([^:\s]+): \S+ exited with exit code (-?\d+)")


def run_pids(run_id: str, exclude=(), uid=None) -> list[int]:
    """PIDs of this account's processes whose environment carries this run's marker: a process of another account
    that carries it (a forged marker) is not the run's, and is never signalled."""
    needle = f"{MARKER}={run_id}".encode()
    uid = os.getuid() if uid is None else uid
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid in exclude:
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
            with open(f"/proc/{pid}/environ", "rb") as fh:
                if needle in fh.read().split(b"\0"):
                    pids.append(pid)
        except OSError:
            continue
    return sorted(pids)


def versions() -> dict:
    """The versions this node runs (read without importing torch)."""
    import importlib.metadata as md
    import platform
    out = {"python": platform.python_version()}
    for pkg in ("torch", "deepspeed", "transformers"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)


def _pgid(pid: int):
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def kill_all(run_id: str, own: set, pgid: int | None, grace: float = 3.0, launcher_signal=signal.SIGTERM) -> None:
    """SIGTERM the run's processes on this node, SIGKILL what is left after ``grace``.

    ``launcher_signal``: what the launcher's process group gets first.  SIGKILL for a launcher whose own SIGTERM
    handler reaches beyond this run: DeepSpeed's runner with pdsh (``deepspeed --launcher pdsh``) runs ``pkill -f
    'python -u -m deepspeed.launcher.launch'`` on every node, every run's launchers (each node's agent stops this
    run's ranks by its marker)."""
    def signal_all(sig, group_sig):
        if pgid:
            try:
                os.killpg(pgid, group_sig)
            except OSError:
                pass
        for pid in run_pids(run_id, exclude=own):
            if pgid and group_sig != sig and _pgid(pid) == pgid:
                continue  # the launcher's group had its own signal
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    signal_all(signal.SIGTERM, launcher_signal)
    deadline = time.time() + grace
    while time.time() < deadline and run_pids(run_id, exclude=own):
        time.sleep(0.2)
    signal_all(signal.SIGKILL, signal.SIGKILL)
    deadline = time.time() + grace
    while time.time() < deadline and run_pids(run_id, exclude=own):
        time.sleep(0.2)


class GiveUp(Exception):
    """The agent cannot go on (its files keep failing, or it was told to stop): the message says why."""


class FileTrouble:
    """File errors in a row: tolerated for ``patience`` seconds (a full disk freed, an NFS server back), then the
    agent gives up."""

    def __init__(self, host, patience):
        self.host, self.patience = host, patience
        self.since, self.last = None, None

    def ok(self):
        self.since, self.last = None, None

    def failed(self, exc, now=None):
        """Record ``exc``; raises GiveUp once errors have lasted longer than the patience."""
        now = time.time() if now is None else now
        if self.since is None:
            self.since = now
        self.last = exc
        if now - self.since > self.patience:
            raise GiveUp(self.reason())

    def reason(self):
        exc = self.last
        what = IO_ERRORS.get(getattr(exc, "errno", None), "file error")
        return f"{what} on {self.host}: {exc} (for {self.patience:.0f}s)"


class Agent:
    def __init__(self, args):
        self.run_dir = Path(args.run_dir)
        self.run_id = args.run_id or self.run_dir.name
        self.host = args.host or socket.gethostname()
        self.cmd = args.cmd
        self.interval = args.interval
        self.lease_timeout = args.lease_timeout
        self.grace = args.grace
        self.max_time = args.max_time
        self.sweep_after = args.sweep_after
        self.stop_signal = args.stop_signal
        self.trouble = FileTrouble(args.host or socket.gethostname(), args.io_patience)
        self.terminated = None
        self.control = self.run_dir / "control"
        self.nodes = self.run_dir / "nodes"
        self.log_path = self.run_dir / "nodes" / f"{self.host}.launcher.log"
        self.status_path = self.nodes / f"{self.host}.json"
        self.own = {os.getpid()}
        self.child = None
        self.started = time.time()
        self.seen_pids = False
        self.log_pos = 0
        self.node_lines = {}  # each node's last line in the launcher's output (pdsh prefixes them "node: ")
        self.state = {"host": self.host, "machine": socket.gethostname(), "run_id": self.run_id,
                      "agent_pid": os.getpid(),
                      "role": "launcher" if self.cmd else "watcher", "state": "starting",
                      "started": self.started, "exit_code": None, "reason": None, "pids": [],
                      "failed_line": None, "versions": versions()}

    # -- helpers -------------------------------------------------------
    def beat(self, **updates):
        self.state.update(updates)
        self.state["time"] = time.time()
        try:
            write_json(self.status_path, self.state)
            self.trouble.ok()
        except OSError as exc:
            self.trouble.failed(exc)

    def exists(self, name) -> bool:
        """Whether ``control/<name>`` exists; a file error counts toward giving up and answers False."""
        try:
            os.stat(self.control / name)
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            self.trouble.failed(exc)
            return False

    def abort(self, reason: str, **extra) -> None:
        """Ask every node to stop the run (first writer wins)."""
        path = self.control / "ABORT"
        data = {"reason": reason, "host": self.host, "time": time.time(), **extra}
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return
        except OSError as exc:
            print(f"multinode_ds.agent: cannot write {path}: {exc}", file=sys.stderr, flush=True)
            return
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(data, fh, sort_keys=True)
        except OSError as exc:  # the record exists (empty): every node still stops
            print(f"multinode_ds.agent: {path} is empty: {exc}", file=sys.stderr, flush=True)

    def lease_stale(self) -> bool:
        if time.time() - self.started < self.grace:
            return False
        try:
            age = time.time() - (self.control / "lease").stat().st_mtime
        except FileNotFoundError:
            return True
        except OSError as exc:  # not the controller's silence: the disk's
            self.trouble.failed(exc)
            return False
        return age > self.lease_timeout

    def scan_log(self):
        """The first failure in the launcher's output: ``(line, code, None)`` for a rank's (DeepSpeed's launch.py:
        'exits with return code = N', N != 0), ``(why, code, node)`` for a node whose login pdsh saw end badly
        (``why``: that node's last line before it, or pdsh's line)."""
        try:
            with open(self.log_path, errors="replace") as fh:
                fh.seek(self.log_pos)
                chunk = fh.read()
                self.log_pos = fh.tell()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self.trouble.failed(exc)
            return None
        for line in chunk.splitlines():
            m = EXIT_LINE.search(line)
            if m and int(m.group(1)) != 0:
                return line.strip(), int(m.group(1)), None
            node = NODE_EXIT_LINE.match(line)
            if node and int(node.group(2)) != 0:
                return self.node_lines.get(node.group(1), line.strip()), int(node.group(2)), node.group(1)
            prefix = line.split(": ", 1)[0]
            if prefix and " " not in prefix and not prefix.startswith("pdsh@"):
                self.node_lines[prefix] = line.strip()
        return None

    def start_child(self):
        env = dict(os.environ)
        env.update(read_env_file(self.run_dir / ".deepspeed_env"))
        env[MARKER] = self.run_id
        log = open(self.log_path, "ab")
        self.child = subprocess.Popen(self.cmd, cwd=self.run_dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        self.beat(state="running", launcher_pid=self.child.pid)

    # -- main loop -----------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_term)
        try:
            return self.follow()
        except GiveUp as exc:
            return self.give_up(str(exc))
        finally:
            self.forget_secrets()

    def on_term(self, signum, frame):
        self.terminated = f"the agent on {self.host} was stopped (signal {signum})"

    def give_up(self, reason) -> int:
        """Stop this node's ranks and say why (the shared disk may not take the record: stderr says it too)."""
        print(f"multinode_ds.agent: {reason}; stopping this node's ranks", file=sys.stderr, flush=True)
        self.abort(reason)
        kill_all(self.run_id, self.own, self.child.pid if self.child else None,
                 launcher_signal=signal.Signals["SIG" + self.stop_signal])
        try:
            self.beat(state="aborted", reason=reason, pids=run_pids(self.run_id, exclude=self.own))
        except GiveUp:
            pass
        return 1

    def forget_secrets(self):
        """The run's secrets on this node (written by the play, read by each rank when it starts) go with the run."""
        path = read_env_file(self.run_dir / ".deepspeed_env").get(SECRET_VAR)
        if path:
            try:
                os.unlink(path)
            except OSError:
                pass

    def follow(self) -> int:
        self.nodes.mkdir(parents=True, exist_ok=True)
        self.control.mkdir(parents=True, exist_ok=True)
        self.beat()
        if self.exists("ABORT"):
            self.beat(state="aborted", reason="the run was aborted before this node started")
            return 1
        if self.cmd:
            self.start_child()
        else:
            self.beat(state="running")
        reason = self.wait_for_end()
        if reason != "finished":
            self.stop(reason)
        left = run_pids(self.run_id, exclude=self.own)
        self.beat(state="finished" if reason == "finished" else "aborted", reason=reason, pids=left)
        if self.child is not None:
            return self.state["exit_code"] if self.state["exit_code"] is not None else 1
        return 0 if reason == "finished" else 1

    def wait_for_end(self) -> str:
        """Beat until the run ends on this node; returns "finished", or why it stops."""
        while True:
            pids = run_pids(self.run_id, exclude=self.own)
            self.seen_pids = self.seen_pids or bool(pids)
            rc = self.child.poll() if self.child else None
            self.note_failure(rc)
            reason = self.end_reason(rc, pids)
            if reason:
                return reason
            self.beat(state="running", pids=pids)
            self.pause()

    def pause(self):
        """Wait one heartbeat period, or less: the launcher's exit, an ABORT record and (for a watcher) DONE are
        seen within a tenth of a second, so that the run's end is an event, not the next beat."""
        end = time.time() + self.interval
        seen = self.records()
        while True:
            left = end - time.time()
            if left <= 0:
                return
            if self.child is not None:
                try:
                    self.child.wait(timeout=min(left, WAKE))
                    return
                except subprocess.TimeoutExpired:
                    pass
            else:
                time.sleep(min(left, WAKE))
            if self.records() != seen:
                return

    def records(self):
        """Which of the controller's records this node waits for exist: ABORT, and DONE for a watcher."""
        return self.exists("ABORT"), self.child is None and self.exists("DONE")

    def note_failure(self, rc):
        """The launcher's exit code (``rc``: None while it runs) once it exited, and the first failed rank in its log:
        either failure aborts the run on every node."""
        if rc is not None and self.state["exit_code"] is None:
            self.state["exit_code"] = rc
            if rc != 0:
                self.abort(f"the launcher on {self.host} exited with {rc}", exit_code=rc)
        failed = self.scan_log() if self.cmd else None
        if failed and not self.state["failed_line"]:
            line, code, node = failed
            self.state["failed_line"] = line
            if node is None:
                self.abort(f"a rank on {self.host} exited with {code}", exit_code=code, line=line)
            else:  # 255: ssh's own failure (the login, not the node's command): the node is lost
                self.abort(f"the launch on {node} ended with {code} ({line})", exit_code=code, line=line, node=node,
                           **({"lost": [node]} if code == SSH_FAILED else {}))

    def end_reason(self, rc, pids):
        """Why the run ends on this node now (None: it goes on): an ABORT record, a stale lease or the run's timeout
        (both abort the run everywhere), or "finished" (the launcher exited, or the controller wrote DONE for a
        watcher, and none of the run's processes is left)."""
        if self.terminated:
            self.abort(self.terminated)
            return self.terminated
        if self.exists("ABORT"):
            return "aborted"
        if self.lease_stale():
            reason = "the controller stopped watching (lease expired)"
            self.abort(reason)
            return reason
        if self.max_time and time.time() - self.started > self.max_time:
            reason = f"the run exceeded its timeout of {self.max_time:.0f}s"
            self.abort(reason)
            return reason
        if self.child is not None and rc is not None and not pids:
            return "finished"
        if self.child is None and self.exists("DONE") and not pids:
            return "finished"
        return None

    def stop(self, reason):
        """Stop the run's processes on this node: a watcher first gives a scheduler sweep_after seconds to stop
        them itself; then the launcher's group gets the stop signal, the rest SIGTERM, SIGKILL what is left."""
        self.beat(state="stopping", reason=reason)
        if self.child is None and self.sweep_after:
            # A scheduler stops this node's ranks itself (scancel): give it the time, then sweep what is left.
            deadline = time.time() + self.sweep_after
            while time.time() < deadline and run_pids(self.run_id, exclude=self.own):
                self.beat(state="stopping", reason=reason)
                time.sleep(min(self.interval, 0.5))
        kill_all(self.run_id, self.own, self.child.pid if self.child else None,
                 launcher_signal=signal.Signals["SIG" + self.stop_signal])
        if self.child is not None:
            try:
                self.child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            if self.state["exit_code"] is None:
                self.state["exit_code"] = self.child.returncode


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m multinode_ds.agent", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--run-id", default=None, help="default: the run directory's name")
    p.add_argument("--host", default=None, help="this node's name in the inventory (default: its hostname)")
    p.add_argument("--interval", type=float, default=1.0, help="heartbeat period in seconds")
    p.add_argument("--lease-timeout", type=float, default=45.0,
                   help="abort when the controller's lease (control/lease) is older than this")
    p.add_argument("--grace", type=float, default=0.0,
                   help="seconds after the agent's start before the lease is enforced (train.yml creates "
                        "the lease before it starts the agents)")
    p.add_argument("--max-time", type=float, default=0.0, help="abort the run after this many seconds (0: never)")
    p.add_argument("--sweep-after", type=float, default=0.0,
                   help="a watcher (no CMD) waits this long for the run's processes to end by themselves after an "
                        "abort (a scheduler's cancel), then kills what is left")
    p.add_argument("--stop-signal", default="TERM", choices=["TERM", "INT", "KILL"],
                   help="the first signal to the launcher's process group when the run stops (KILL for a "
                        "launcher whose SIGTERM handler reaches beyond this run, as DeepSpeed's runner with pdsh "
                        "pkills every run's launchers)")
    p.add_argument("--io-patience", type=float, default=30.0,
                   help="seconds the run's files may keep failing (disk full, stale NFS handle, I/O error) before "
                        "the agent stops this node's ranks and exits")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the node's launcher command")
    args = p.parse_args(argv)
    if args.cmd and args.cmd[0] == "--":
        args.cmd = args.cmd[1:]
    return args


def main(argv=None) -> int:
    return Agent(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
