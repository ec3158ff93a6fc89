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
  goes stale (older than ``--lease-timeout``, which the plan derives from the watch's retry window: the controller
  died, or cannot reach the coordinator for longer than the watch keeps trying), the agents abort.
* ``D/control/DONE`` -- written by the controller when the run ended well.

The run's processes are found by the ``MULTINODE_DS_RUN_ID`` variable in their
environment (the launcher exports it to every rank), not by a broad ``pkill``
that could hit another job.  With CMD, the agent starts it in its own session
with the run's environment (``D/.deepspeed_env`` plus the marker) and exits
with its exit code; without CMD it only watches (the pdsh backend's workers,
whose ranks the coordinator's launcher starts).  When it exits, it removes the
run's node-local secrets file (``MULTINODE_DS_SECRET_ENV``), if there is one.

Once the launcher exited (or, on a watcher, once DONE is there), the run's processes still on the node (a child the
user's script left running) get ``--leftover-grace`` seconds to end by themselves; then they are stopped (SIGTERM,
SIGKILL) and named in the heartbeat (``left_pids``): a run that ended stays ended, and nothing of it runs on.

Every file operation on ``D`` (the shared directory) runs in one worker thread and has a deadline
(``--io-patience``): a hung hard NFS mount cannot hold the agent.  Past the deadline the agent stops the node's
ranks from what it knows without the shared directory (their PIDs, through /proc), says why on its standard error,
and exits.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from multinode_ds import warm
from multinode_ds.rank import ENV_FILE, SECRET_VAR, read_env_file

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
# The longest command line a heartbeat's ``left_pids`` keeps of a process the run left behind.
CMD_CHARS = 200
# Seconds the agent's last records (ABORT, its final heartbeat) may take on the shared directory once it gives up.
LAST_WRITE = 5.0


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
    # Ranks forked by the node's warm process show its environment, not the run's: they are found by their record,
    # and with them whatever they started without exec (a data loader's workers).
    forked = [pid for pid, rec in warm.registered(uid).items() if rec.get("run_id") == run_id and pid not in exclude]
    if forked:
        pids += [pid for pid in descendants(forked, uid) if pid not in exclude]
    return sorted(set(pids))


def descendants(roots, uid) -> list:
    """``roots`` and every process of this account below them (by their parent's PID in /proc/<pid>/stat)."""
    parent = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/stat", "rb") as fh:
                text = fh.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = text[text.rfind(")") + 1:].split()
        if len(fields) > 1 and fields[1].isdigit():
            parent[int(entry)] = int(fields[1])
    out, todo = set(), [p for p in roots if p in parent]
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.add(pid)
        todo += [child for child, ppid in parent.items() if ppid == pid]
    return sorted(out)


# A rank process in an uninterruptible wait (state D) this long counts as frozen (a driver or a file system that
# does not answer); one stopped (T: SIGSTOP, SIGTSTP; t: a debugger) does at once.
D_FROZEN_AFTER = 10.0


def proc_state(pid: int):
    """The process's state letter from /proc/<pid>/stat (R, S, D, T, t, Z...), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces or ")": the state follows the last ")".
    end = text.rfind(")")
    fields = text[end + 1:].split() if end >= 0 else []
    return fields[0] if fields else None


def proc_rank(pid: int):
    """The global rank of a rank process (its RANK variable, or a warm rank's record), or None (a launcher, a
    shell)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            for item in fh.read().split(b"\0"):
                if item.startswith(b"RANK="):
                    value = item[5:].decode("ascii", "replace")
                    return int(value) if value.isdigit() else None
    except OSError:
        return None
    rank = str((warm.registered().get(pid) or {}).get("rank") or "")
    return int(rank) if rank.isdigit() else None


def frozen(pids, seen: dict, now: float, d_after: float = D_FROZEN_AFTER):
    """The run's processes that do not run: ``(list of {"pid", "rank", "state", "for"}, the states to remember)``.
    ``seen``: what the last call remembered, {pid: (state, since)}."""
    out, remember = [], {}
    for pid in pids:
        state = proc_state(pid)
        if state not in ("T", "t", "D"):
            continue
        before = seen.get(pid)
        since = before[1] if before and before[0] == state else now
        remember[pid] = (state, since)
        if state == "D" and now - since < d_after:
            continue
        out.append({"pid": pid, "rank": proc_rank(pid), "state": state, "for": round(now - since, 1)})
    return out, remember


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


def cmdline(pid: int) -> str:
    """A process's command line for a person (``sleep 300``), at most CMD_CHARS characters; ``[name]`` when it has
    none (a zombie); "" when it is gone.  Read from /proc: local, whatever the shared directory does."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            words = fh.read().split(b"\0")
        text = " ".join(w.decode("utf-8", "replace") for w in words if w)
        if not text:
            with open(f"/proc/{pid}/comm", "rb") as fh:
                text = "[%s]" % fh.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""
    return text if len(text) <= CMD_CHARS else text[:CMD_CHARS - 3] + "..."


def stopped(left, still) -> list:
    """``left`` (``[{"pid", "cmd"}]``), each marked whether it is gone now (``still``: the run's PIDs left)."""
    return [dict(e, stopped=e["pid"] not in still) for e in left]


def say(text: str, wait: float = 2.0) -> None:
    """``text`` on standard error, which may be a file on the shared directory (the agent's log): written by a thread
    of its own, straight to the descriptor (no lock of Python's that the interpreter's exit would wait on), and not
    waited for longer than ``wait`` seconds."""
    def write():
        try:
            os.write(2, (text.rstrip("\n") + "\n").encode("utf-8", "replace"))
        except OSError:
            pass
    writer = threading.Thread(target=write, name="agent-say", daemon=True)
    writer.start()
    writer.join(wait)


class GiveUp(Exception):
    """The agent cannot go on (its files keep failing, or it was told to stop): the message says why."""


class Hung(GiveUp):
    """A file operation on the shared directory did not return within its deadline (a hung hard NFS mount): nothing
    more may be asked of that directory."""


class SharedIO:
    """The agent's file operations on the run directory, each run by one worker thread and waited for at most
    ``patience`` seconds.  An operation that does not return by then (a hard NFS mount whose server is gone blocks
    it in the kernel, where no signal or timeout reaches it) leaves the worker stuck in it: ``stuck`` says which,
    and every later call raises Hung at once.  The agent's own thread never blocks on the shared directory."""

    def __init__(self, host, patience):
        self.host, self.patience = host, patience
        self.stuck = None
        self.calls = queue.Queue()
        threading.Thread(target=self._work, name="agent-io", daemon=True).start()

    def _work(self):
        while True:
            fn, args, box, done = self.calls.get()
            try:
                box["value"] = fn(*args)
            except BaseException as exc:  # pylint: disable=broad-except  # handed to the caller as it is
                box["error"] = exc
            done.set()

    def call(self, what, fn, *args, timeout=None):
        """``fn(*args)`` in the worker (``what``: the operation, for the reason); its value, or its exception;
        Hung when it has not returned within ``timeout`` (default: the patience)."""
        if self.stuck:
            raise Hung(self.stuck)
        box, done = {}, threading.Event()
        self.calls.put((fn, args, box, done))
        limit = self.patience if timeout is None else timeout
        if not done.wait(limit):
            self.stuck = f"{what} on {self.host} did not return within {limit:.0f}s (a hung shared directory?)"
            raise Hung(self.stuck)
        if "error" in box:
            raise box["error"]
        return box.get("value")


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


def _write_abort(path, data):
    """The ABORT record, created exclusively (first writer wins); a message for the log when it cannot be."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return None
    except OSError as exc:
        return f"multinode_ds.agent: cannot write {path}: {exc}"
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, sort_keys=True)
    except OSError as exc:  # the record exists (empty): every node still stops
        return f"multinode_ds.agent: {path} is empty: {exc}"
    return None


def _read_from(path, pos):
    """The text of ``path`` from ``pos`` on, and the position after it."""
    with open(path, errors="replace") as fh:
        fh.seek(pos)
        chunk = fh.read()
        return chunk, fh.tell()


def _start(cmd, cwd, env, log_path):
    """The launcher, in a session of its own, its output appended to ``log_path``."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


class Agent:
    def __init__(self, args):
        self.run_dir = Path(args.run_dir)
        self.run_id = args.run_id or self.run_dir.name
        self.host = args.host or socket.gethostname()
        self.cmd = args.cmd
        self.interval = args.interval
        self.lease_timeout = args.lease_timeout
        self.grace = args.grace
        self.leftover_grace = args.leftover_grace
        self.max_time = args.max_time
        self.sweep_after = args.sweep_after
        self.stop_signal = args.stop_signal
        self.ready_fd = args.ready_fd
        self.warm = getattr(args, "warm", False)
        self.trouble = FileTrouble(self.host, args.io_patience)
        self.io = SharedIO(self.host, args.io_patience)
        self.terminated = None
        self.control = self.run_dir / "control"
        self.nodes = self.run_dir / "nodes"
        self.log_path = self.run_dir / "nodes" / f"{self.host}.launcher.log"
        self.status_path = self.nodes / f"{self.host}.json"
        self.own = {os.getpid()}
        self.child = None
        self.run_env = {}  # .deepspeed_env, read once: the launcher's variables, the secrets file's path
        self.started = time.time()
        self.seen_pids = False
        self.states = {}  # the run's processes that did not run at the last beat: {pid: (state, since)}
        self.log_pos = 0
        self.node_lines = {}  # each node's last line in the launcher's output (pdsh prefixes them "node: ")
        self.state = {"host": self.host, "machine": socket.gethostname(), "run_id": self.run_id,
                      "agent_pid": os.getpid(),
                      "role": "launcher" if self.cmd else "watcher", "state": "starting",
                      "started": self.started, "exit_code": None, "reason": None, "pids": [], "left_pids": [],
                      "failed_line": None, "versions": versions()}

    # -- the shared directory -------------------------------------------
    def beat(self, **updates):
        self.state.update(updates)
        self.state["time"] = time.time()
        try:
            self.io.call("writing the heartbeat", write_json, self.status_path, dict(self.state))
            self.trouble.ok()
        except OSError as exc:
            self.trouble.failed(exc)

    def exists(self, name) -> bool:
        """Whether ``control/<name>`` exists; a file error counts toward giving up and answers False."""
        try:
            self.io.call(f"looking for control/{name}", os.stat, self.control / name)
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            self.trouble.failed(exc)
            return False

    def abort(self, reason: str, timeout=None, **extra) -> None:
        """Ask every node to stop the run (first writer wins)."""
        data = {"reason": reason, "host": self.host, "time": time.time(), **extra}
        said = self.io.call("writing control/ABORT", _write_abort, self.control / "ABORT", data, timeout=timeout)
        if said:
            say(said)

    def lease_stale(self) -> bool:
        if time.time() - self.started < self.grace:
            return False
        try:
            mtime = self.io.call("reading control/lease", lambda: (self.control / "lease").stat().st_mtime)
        except FileNotFoundError:
            return True
        except OSError as exc:  # not the controller's silence: the disk's
            self.trouble.failed(exc)
            return False
        return time.time() - mtime > self.lease_timeout

    def retried(self, what, fn, *args):
        """``fn(*args)`` on the shared directory, tried again each heartbeat period while it fails, until the files
        have failed for the patience (GiveUp, the error named)."""
        while True:
            try:
                value = self.io.call(what, fn, *args)
                self.trouble.ok()
                return value
            except OSError as exc:
                self.trouble.failed(exc)
                say(f"multinode_ds.agent: {what} on {self.host} failed: {exc}; trying again")
                time.sleep(self.interval)

    def scan_log(self):
        """The first failure in the launcher's output: ``(line, code, None)`` for a rank's (DeepSpeed's launch.py:
        'exits with return code = N', N != 0), ``(why, code, node)`` for a node whose login pdsh saw end badly
        (``why``: that node's last line before it, or pdsh's line)."""
        try:
            chunk, self.log_pos = self.io.call("reading the launcher's log", _read_from, self.log_path, self.log_pos)
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
        env.update(self.run_env)
        env[MARKER] = self.run_id
        self.child = self.retried("starting the launcher (its log, the run directory)", _start, self.cmd,
                                  self.run_dir, env, self.log_path)
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
            self.say_ready(False)

    def on_term(self, signum, frame):
        self.terminated = f"the agent on {self.host} was stopped (signal {signum})"

    def give_up(self, reason) -> int:
        """Stop this node's ranks and say why: on standard error first (the shared directory may not take the
        record), then in ABORT and the last heartbeat, each within LAST_WRITE seconds and only while the shared
        directory answers; the ranks are found through /proc, whatever it does."""
        say(f"multinode_ds.agent: {reason}; stopping this node's ranks")
        self.last_write(self.abort, reason, timeout=LAST_WRITE)
        kill_all(self.run_id, self.own, self.child.pid if self.child else None,
                 launcher_signal=signal.Signals["SIG" + self.stop_signal])
        self.state.update(state="aborted", reason=reason, pids=run_pids(self.run_id, exclude=self.own))
        self.last_write(lambda: self.io.call("writing the heartbeat", write_json, self.status_path,
                                             dict(self.state, time=time.time()), timeout=LAST_WRITE))
        return 1

    def last_write(self, fn, *args, **kw):
        """One of the agent's last records, unless the shared directory already hung; its failure is let go."""
        if self.io.stuck:
            return
        try:
            fn(*args, **kw)
        except (GiveUp, OSError):
            pass

    def forget_secrets(self):
        """The run's secrets on this node (written by the play, read by each rank when it starts) go with the run:
        their node-local path was read from .deepspeed_env when the agent started."""
        path = self.run_env.get(SECRET_VAR)
        if path:
            try:
                os.unlink(path)
            except OSError:
                pass

    def say_ready(self, ready=True):
        """Tell whoever started the agent (``--ready-fd``: pdsh's command on a rank node, before it starts the
        ranks) that it watches the run (``ready``), or, closing the descriptor without a word, that it does not."""
        if self.ready_fd is None:
            return
        fd, self.ready_fd = self.ready_fd, None
        try:
            if ready:
                os.write(fd, b"ready\n")
        except OSError:
            pass
        finally:
            try:
                os.close(fd)
            except OSError:
                pass

    def follow(self) -> int:
        self.retried("creating the run's nodes/ and control/", lambda: [
            d.mkdir(parents=True, exist_ok=True) for d in (self.nodes, self.control)])
        self.run_env = self.retried("reading .deepspeed_env", read_env_file, self.run_dir / ".deepspeed_env")
        self.warm_up()
        self.beat()
        if self.exists("ABORT"):
            self.beat(state="aborted", reason="the run was aborted before this node started")
            return 1
        if self.cmd:
            self.start_child()
        else:
            self.beat(state="running")
        self.say_ready()
        reason = self.wait_for_end()
        left = self.settle() if reason == "finished" else self.stop(reason)
        self.beat(state="finished" if reason == "finished" else "aborted", reason=reason,
                  pids=run_pids(self.run_id, exclude=self.own), left_pids=left)
        if self.child is not None:
            return self.state["exit_code"] if self.state["exit_code"] is not None else 1
        return 0 if reason == "finished" else 1

    def warm_up(self):
        """On a rank node of a run with warm ranks (``--warm``), a warm process for this node's ranks: one that serves
        them, or one started now (they wait for its imports); the heartbeat says which (``warm``), or why none."""
        if not self.warm:
            return
        env = self.retried("reading rank.env", read_env_file, self.run_dir / ENV_FILE)
        try:
            # The ranks' environment as their launcher gives it (this login's, then rank.env): the same warm key.
            self.state["warm"] = warm.ensure(sys.executable, dict(os.environ, **env))
        except Exception as exc:  # pylint: disable=broad-except
            self.state["warm"] = "no warm ranks: %s" % exc

    def wait_for_end(self) -> str:
        """Beat until the run ends on this node; returns "finished", or why it stops."""
        while True:
            pids = run_pids(self.run_id, exclude=self.own)
            self.seen_pids = self.seen_pids or bool(pids)
            rc = self.child.poll() if self.child else None
            self.note_failure(rc)
            reason = self.end_reason(rc)
            if reason:
                return reason
            stuck, self.states = frozen(pids, self.states, time.time())
            self.beat(state="running", pids=pids, building=self.building(), frozen=stuck)
            self.pause()

    def building(self) -> list:
        """The DeepSpeed ops being compiled on this node now (a build lock held, or young, under the ranks'
        node-local TORCH_EXTENSIONS_DIR; multinode_ds.ops_ready): the watch shows a rank compiling as compiling, not
        as stalled."""
        root = self.run_env.get("TORCH_EXTENSIONS_DIR") or os.environ.get("TORCH_EXTENSIONS_DIR")
        if not root or not os.path.isdir(root):
            return []
        try:
            from multinode_ds.ops_ready import building  # pylint: disable=import-outside-toplevel
            return [{"op": b["op"], "age": round(float(b["age"]), 1)} for b in building(root)]
        except (OSError, ValueError, KeyError):
            return []

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

    def end_reason(self, rc):
        """Why the run ends on this node now (None: it goes on): an ABORT record, a stale lease or the run's timeout
        (both abort the run everywhere), or "finished": the launcher exited, or the controller wrote DONE for a
        watcher (what the run left running then is settle's)."""
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
        if self.child is not None and rc is not None:
            return "finished"
        if self.child is None and self.exists("DONE"):
            return "finished"
        return None

    def settle(self):
        """The run ended well on this node: what it left running (a child of the user's script that outlives it)
        gets leftover_grace seconds to end by itself, then is stopped as an abort stops the ranks; returns it,
        ``[{"pid", "cmd", "stopped"}]`` (never the run's failure)."""
        pids = run_pids(self.run_id, exclude=self.own)
        deadline = time.time() + self.leftover_grace
        next_beat = time.time() + self.interval
        while pids and time.time() < deadline and not self.terminated:
            time.sleep(WAKE)
            pids = run_pids(self.run_id, exclude=self.own)
            if pids and time.time() >= next_beat:
                self.beat(state="running", pids=pids)
                next_beat = time.time() + self.interval
        if not pids:
            return []
        left = [{"pid": pid, "cmd": cmdline(pid)} for pid in pids]
        reason = "stopping %d process(es) the run left running: %s" % (
            len(left), "; ".join("%d %s" % (e["pid"], e["cmd"]) for e in left))
        say(f"multinode_ds.agent: {reason}")
        self.beat(state="stopping", reason=reason, pids=pids, left_pids=left)
        kill_all(self.run_id, self.own, None)  # by their marker: the launcher's group is gone
        return stopped(left, run_pids(self.run_id, exclude=self.own))

    def stop(self, reason):
        """Stop the run's processes on this node: a watcher first gives a scheduler sweep_after seconds to stop
        them itself; then the launcher's group gets the stop signal, the rest SIGTERM, SIGKILL what is left.
        Returns what the launcher left running when it had exited already, as settle does (else [])."""
        exited = self.child is not None and self.child.poll() is not None
        left = [{"pid": pid, "cmd": cmdline(pid)} for pid in run_pids(self.run_id, exclude=self.own)] if exited else []
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
        return stopped(left, run_pids(self.run_id, exclude=self.own))


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m multinode_ds.agent", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--run-id", default=None, help="default: the run directory's name")
    p.add_argument("--host", default=None, help="this node's name in the inventory (default: its hostname)")
    p.add_argument("--interval", type=float, default=1.0, help="heartbeat period in seconds")
    p.add_argument("--lease-timeout", type=float, required=True,
                   help="abort when the controller's lease (control/lease) is older than this many seconds (the "
                        "plan derives it from the watch's status retry window, which it outlasts)")
    p.add_argument("--grace", type=float, default=0.0,
                   help="seconds after the agent's start before the lease is enforced (train.yml creates "
                        "the lease before it starts the agents)")
    p.add_argument("--leftover-grace", type=float, required=True,
                   help="seconds the run's processes left after the launcher's exit (a watcher: after DONE) get to "
                        "end by themselves before the agent stops them and names them (left_pids); the plan "
                        "passes it")
    p.add_argument("--max-time", type=float, default=0.0, help="abort the run after this many seconds (0: never)")
    p.add_argument("--sweep-after", type=float, default=0.0,
                   help="a watcher (no CMD) waits this long for the run's processes to end by themselves after an "
                        "abort (a scheduler's cancel), then kills what is left")
    p.add_argument("--stop-signal", default="TERM", choices=["TERM", "INT", "KILL"],
                   help="the first signal to the launcher's process group when the run stops (KILL for a "
                        "launcher whose SIGTERM handler reaches beyond this run, as DeepSpeed's runner with pdsh "
                        "pkills every run's launchers)")
    p.add_argument("--io-patience", type=float, default=30.0,
                   help="seconds the run's files may keep failing (disk full, stale NFS handle, I/O error), and the "
                        "longest one file operation on the run directory may take (a hung NFS mount), before the "
                        "agent stops this node's ranks and exits")
    p.add_argument("--ready-fd", type=int, default=None,
                   help="a descriptor to write 'ready' to, then close, once the agent watches the run (closed "
                        "without it when the agent stops before): pdsh's command starts the ranks only then")
    p.add_argument("--warm", action="store_true",
                   help="keep a warm process for this node's ranks (multinode_ds.warm): started when there is none, "
                        "or when the stack changed; the ranks fork from it")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="the node's launcher command")
    args = p.parse_args(argv)
    if args.cmd and args.cmd[0] == "--":
        args.cmd = args.cmd[1:]
    return args


def main(argv=None) -> int:
    return Agent(parse_args(argv)).run()


if __name__ == "__main__":
    ARGS = parse_args()
    ARGS.run_dir = os.path.abspath(ARGS.run_dir)
    # Neither the agent's working directory nor Python's search of it for a module may be on the shared directory
    # (``python -m`` puts the working directory first in sys.path): only the worker thread goes there.
    sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]
    os.chdir("/")
    AGENT = Agent(ARGS)
    RC = AGENT.run()
    if AGENT.io.stuck:
        # A thread is stuck in the shared directory: no interpreter exit that could wait on it (the ranks are
        # stopped, the reason said).
        os._exit(RC)
    sys.exit(RC)
