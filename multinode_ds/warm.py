"""Warm ranks: a node-local process that has imported the stack's heavy modules and forks each rank on demand.

``python -m multinode_ds.warm serve --key K`` (started by the node's agent, ``ensure``; never by hand)

A rank's start costs a Python and the imports of torch, DeepSpeed and transformers: about 3 CPU-seconds per rank
on a small node, 5-30 s on a node whose 8 ranks import from one disk at once.  The warm process pays that once per
node and stack, then forks each rank: ``multinode_ds.rank`` (the process DeepSpeed's launcher started) hands it the
rank's argv, environment, working directory, umask and standard streams (``SCM_RIGHTS``), and waits for the rank's
exit status, passing on the signals it gets.  The forked rank then runs the program as a cold start would
(``python -u [-m] SCRIPT ARGS``: its own ``sys.argv``, ``sys.path``, environment and working directory; the trainer
or the user's script through ``runpy``); nothing of one run reaches the next, because every rank is forked from a
process that never ran one.

One warm process per account, interpreter and *import environment* (the variables read while torch, DeepSpeed and
transformers import: ``DS_ACCELERATOR``, ``OMP_NUM_THREADS``, ``HF_HOME``...; ``IMPORT_ENV``): its socket's name is
their hash, in a directory of the account's own, mode 0700.  It holds no run's variable, no secret, no open file of
a run.  It exits once idle for ``--idle`` seconds, and when the venv or the node package changed (the stack's
fingerprint) it refuses every rank and exits: those ranks start cold and say why.

Fork safety is a rule checked before every fork (``hazards``): one thread only (no thread pool started: the
import environment has ``OMP_NUM_THREADS``), no CUDA context (``torch.cuda.is_initialized()``).  A process that
breaks it serves no rank.

The node's agent finds a warm rank by its record (``ranks/<pid>.json``: run id, rank, the process's start time), not
by the run's variable in ``/proc/<pid>/environ`` (a forked process shows the environment it was exec'd with): see
``registered``.
"""
from __future__ import annotations

import array
import fcntl
import hashlib
import json
import os
import select
import signal
import socket
import stat
import struct
import sys
import time

# Modules imported once by the warm process (those the venv has).
IMPORTS = ("torch", "deepspeed", "transformers")
# Variables read while those modules import: the warm process's key holds their values, so a rank whose
# environment differs in one of them gets another warm process (or starts cold).
IMPORT_ENV_PREFIXES = ("DS_", "DEEPSPEED_", "TORCH_", "PYTORCH_", "HF_", "HUGGINGFACE_", "TRANSFORMERS_",
                       "TOKENIZERS_", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "CUDA_", "LD_")
IMPORT_ENV_NAMES = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "HOME")
# ...but not those only read after the fork (CUDA's device choice at its first call; the run's .deepspeed_env,
# which DeepSpeed's runner reads), nor a secret.
AFTER_FORK_ENV = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "DS_ENV_FILE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# ...nor those the imports set themselves, at the value they set (DeepSpeed's launcher imported DeepSpeed too, so a
# rank inherits them from it; the warm process gets them from its own import).
IMPORT_SETS = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1"}
# Python's own variables a forked rank applies as a cold interpreter would; any other PYTHON* variable means cold.
PYTHON_ENV = ("PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING")
IDLE = 1800.0
DIR_VAR = "MULTINODE_DS_WARM_DIR"
# How long a rank waits for a warm process that is importing (started by the node's agent for this run).
WAIT = 60.0
MAX_MESSAGE = 1 << 20
# The wire's version, part of the warm process's name: an agent never talks to a warm process of another one.
PROTOCOL = 1
# Bytes of the warm process's own command line kept for a forked rank's (what ps and pkill -f read).
TITLE_ROOM = 4096
PR_SET_PDEATHSIG = 1


class Refused(Exception):
    """Why a rank starts cold."""


# -- where -------------------------------------------------------------------------------------------------

def home_dir(uid=None, env=None) -> str:
    """The account's directory of warm processes, ``/tmp/multinode-ds-warm-<uid>`` (``MULTINODE_DS_WARM_DIR``
    when set): the same for the agent and for every rank, whatever their logins set (a directory another account
    made there is refused: ``private_dir``)."""
    return (os.environ if env is None else env).get(DIR_VAR) or "/tmp/multinode-ds-warm-%d" % (os.getuid() if uid is None else uid)


def private_dir(path: str, create: bool = True) -> str:
    """``path``, a directory of this account's only (mode 0700, not a link): made when absent, else Refused."""
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise Refused("cannot make %s: %s" % (path, exc))
    try:
        st = os.lstat(path)
    except OSError:
        raise Refused("no warm process on this node (no %s)" % path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise Refused("%s is not a directory of this account's only (mode 0700, owner uid %d)" % (path, os.getuid()))
    return path


def import_env(env: dict, skip=()) -> dict:
    """The variables of ``env`` that the heavy imports read (never one of ``skip``: the run's secrets)."""
    return dict((k, v) for k, v in env.items() if k not in AFTER_FORK_ENV and k not in skip and (
        k in IMPORT_ENV_NAMES or k.startswith(IMPORT_ENV_PREFIXES)) and IMPORT_SETS.get(k) != v)


def key_of(python: str, env: dict, skip=()) -> str:
    """The warm process's name: the interpreter and the import environment."""
    text = json.dumps([PROTOCOL, python, sorted(import_env(env, skip).items())])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def fingerprint(python: str = None) -> str:
    """The stack as the warm process imported it: the venv's installed distributions (``*.dist-info``) and the node
    package's files (name, size, mtime).  site.yml adding a package, or a new trainer, changes it."""
    import sysconfig  # pylint: disable=import-outside-toplevel
    parts = []
    purelib = sysconfig.get_paths()["purelib"]
    try:
        parts += sorted(n for n in os.listdir(purelib) if n.endswith(".dist-info"))
    except OSError:
        pass
    package = os.path.dirname(os.path.abspath(__file__))
    for root, dirs, files in os.walk(package):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                try:
                    st = os.stat(os.path.join(root, name))
                except OSError:
                    continue
                parts.append("%s:%d:%d" % (os.path.relpath(os.path.join(root, name), package), st.st_size,
                                           st.st_mtime_ns))
    parts.append(python or sys.executable)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def hazards() -> list:
    """Why forking this process now would be unsafe: more than one thread (a pool that a fork does not copy, a
    lock another thread holds), a CUDA context (it does not survive a fork)."""
    out = []
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:
        threads = 1
    if threads > 1:
        out.append("it runs %d threads (a thread pool started before the fork)" % threads)
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_initialized():
            out.append("it holds a CUDA context")
    except Exception:  # pylint: disable=broad-except
        pass
    return out


def start_time(pid: int):
    """The process's start time (clock ticks since boot; /proc/<pid>/stat field 22), None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            text = fh.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = text[text.rfind(")") + 1:].split()
    return int(fields[19]) if len(fields) > 19 else None


def registered(uid=None, base=None, prune=False) -> dict:
    """The warm ranks running now: ``{pid: {"run_id", "rank", "start"}}``, only records whose process is alive,
    this account's, and the one that was forked (its start time matches: no reused PID).  ``prune``: remove the
    other records (a node restarted under its warm process leaves them: /tmp outlives a container's stop)."""
    uid = os.getuid() if uid is None else uid
    ranks = os.path.join(base or home_dir(uid), "ranks")
    out = {}
    try:
        names = os.listdir(ranks)
    except OSError:
        return out
    for name in names:
        if prune and name.endswith(".json") and name[:-5].isdigit() and not registered_one(ranks, name, uid):
            try:
                os.unlink(os.path.join(ranks, name))
            except OSError:
                pass
            continue
        if not name.endswith(".json") or not name[:-5].isdigit():
            continue
        record = registered_one(ranks, name, uid)
        if record:
            out[int(name[:-5])] = record
    return out


def registered_one(ranks, name, uid):
    """The record ``name`` (``<pid>.json``) while its process runs, this account's, started when recorded."""
    pid = int(name[:-5])
    try:
        fd = os.open(os.path.join(ranks, name), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as fh:
            record = json.loads(fh.read(4096))
        if os.stat("/proc/%d" % pid).st_uid != uid:
            return None
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("start") == start_time(pid) else None


# -- the wire: 4-byte length, JSON; the standard streams as SCM_RIGHTS ---------------------------------------

def send(sock, data: dict, fds=()) -> None:
    body = json.dumps(data).encode()
    msg = struct.pack("!I", len(body)) + body
    if fds:
        sock.sendmsg([msg], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.sendall(msg)


def receive(sock, want_fds: int = 0):
    """``(message, fds)``; ``(None, [])`` at the end of the connection."""
    fds = array.array("i")
    head, ancillary, _flags, _addr = sock.recvmsg(4, socket.CMSG_LEN(want_fds * fds.itemsize) if want_fds else 0)
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - (len(data) % fds.itemsize)])
    while head and len(head) < 4:
        more = sock.recv(4 - len(head))
        if not more:
            break
        head += more
    if len(head) < 4:
        for fd in fds:
            os.close(fd)
        return None, []
    size = struct.unpack("!I", head)[0]
    if size > MAX_MESSAGE:
        raise Refused("a message of %d bytes" % size)
    body = b""
    while len(body) < size:
        more = sock.recv(size - len(body))
        if not more:
            break
        body += more
    return json.loads(body.decode()), list(fds)


def answer_and_close(conn, data: dict):
    """Say ``data`` (a peer already gone hears nothing) and end the connection; None."""
    try:
        send(conn, data)
    except OSError:
        pass
    conn.close()


def peer_uid(sock) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


# -- the rank's side (multinode_ds.rank) ---------------------------------------------------------------------

def refusal(env: dict) -> str:
    """Why a rank with this environment cannot start warm ("" when it can)."""
    others = sorted(k for k in env if k.startswith("PYTHON") and k not in PYTHON_ENV)
    if others:
        return "%s set: a forked interpreter cannot apply it" % ", ".join(others)
    return ""


def connect(key: str, base: str, wait: float):
    """A connection to the warm process ``key``, waiting up to ``wait`` seconds while one is importing (its lock is
    held, its socket not there yet); Refused when there is none."""
    path = os.path.join(base, key + ".sock")
    deadline = time.monotonic() + wait
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            if peer_uid(sock) != os.getuid():
                raise Refused("the socket %s is served by another account" % path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if not starting(base, key) or time.monotonic() > deadline:
                raise Refused("no warm process on this node for this stack and environment (%s)" % key)
            time.sleep(0.05)
        except OSError as exc:
            sock.close()
            raise Refused("cannot reach the warm process: %s" % exc)


def starting(base: str, key: str) -> bool:
    """Whether a warm process ``key`` holds its lock (it is importing, or serving)."""
    try:
        fd = os.open(os.path.join(base, key + ".lock"), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def run(argv: list, env: dict, cwd: str, wait: float = WAIT, secrets=()):
    """Start the rank ``argv`` (``python -u [-m] X ARGS``) in the warm process and wait for it: its exit status
    (a negative number: the signal that ended it), with every signal this process gets passed on; Refused when it
    cannot start warm (nothing was started then).  ``secrets``: the names of the run's secrets in ``env`` (never
    part of the warm process's key)."""
    why = refusal(env)
    if why:
        raise Refused(why)
    python = argv[0]
    base = private_dir(home_dir(env=env), create=False)
    sock = connect(key_of(python, env, secrets), base, wait)
    try:
        send(sock, {"argv": argv, "env": env, "cwd": cwd, "umask": _umask(), "fingerprint": fingerprint(python),
                    "python": python}, fds=(0, 1, 2))
        answer = receive(sock)[0]
        if not answer or not answer.get("pid"):
            raise Refused((answer or {}).get("why") or "the warm process ended before it answered")
        pid = int(answer["pid"])

        def forward(signum, _frame):
            try:
                os.kill(pid, signum)
            except OSError:
                pass

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT):
            signal.signal(sig, forward)
        while True:
            try:
                answer = receive(sock)[0]
                break
            except InterruptedError:
                continue
        if not answer or "exit" not in answer:
            sys.stderr.write("multinode_ds.rank: the warm process ended while rank pid %d ran\n" % pid)
            return 1
        return int(answer["exit"])
    finally:
        sock.close()


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def end_like(status: int):
    """Exit as the rank did: its code, or the signal that ended it (DeepSpeed's launcher reads -N)."""
    if status < 0:
        try:
            signal.signal(-status, signal.SIG_DFL)
        except (OSError, ValueError):
            pass  # SIGKILL and SIGSTOP keep their default action: no handler may be set
        os.kill(os.getpid(), -status)
        time.sleep(1)
        status = 128 - status
    sys.exit(status)


# -- the agent's side --------------------------------------------------------------------------------------

def zygote_env(env: dict) -> dict:
    """The warm process's environment: the import environment of the run's ranks, nothing of the run's own (no run
    id, no secret, no path of the run)."""
    out = import_env(env)
    if env.get(DIR_VAR):
        out[DIR_VAR] = env[DIR_VAR]
    out.setdefault("PATH", os.environ.get("PATH", "/usr/bin:/bin"))
    out.setdefault("HOME", os.environ.get("HOME", "/"))
    return out


def ensure(python: str, env: dict, idle: float = IDLE) -> str:
    """Make sure a warm process serves ranks of ``env`` on this node: ``"ready"`` (one serves), ``"starting"`` (one
    was started now, or is importing), ``"replaced: why"`` (a stale one retired, a new one started), or why there is
    none."""
    try:
        base = private_dir(home_dir(env=env))
        private_dir(os.path.join(base, "ranks"))
    except Refused as exc:
        return "no warm ranks: %s" % exc
    if refusal(env):
        return "no warm ranks: %s" % refusal(env)
    key = key_of(python, env)
    said = "starting"
    if starting(base, key):
        try:
            sock = connect(key, base, 0)
        except Refused:
            return "starting"
        try:
            send(sock, {"ask": "retire if stale"})
            answer = receive(sock)[0]
        except (OSError, ValueError, Refused):
            answer = None
        finally:
            sock.close()
        if answer and not answer.get("stale"):
            return "ready"
        # It retired (its socket and its lock's name given up; it exits once its ranks ended): a new one now.
        said = "replaced: %s" % ((answer or {}).get("stale") or "the warm process did not answer")
    import subprocess  # pylint: disable=import-outside-toplevel
    # The node package from where this one was imported (on a node, the venv's .pth names the same directory).
    zenv = dict(zygote_env(env), PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(base, key + ".log"), "ab") as out:
        proc = subprocess.Popen([python, "-m", "multinode_ds.warm", "serve", "--key", key, "--idle", str(idle),
                                 "--room", "." * TITLE_ROOM],
                                env=zenv, cwd="/", stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True, close_fds=True)
    # Until it holds its lock, a rank would not know to wait for it (an interpreter's start: a tenth of a second).
    deadline = time.monotonic() + 10
    while not starting(base, key) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    return said


# -- the warm process ----------------------------------------------------------------------------------------

def set_title(words) -> bool:
    """Show ``words`` as this process's command line (/proc/<pid>/cmdline: ps, pgrep -f, the agent's left_pids):
    written over the memory of its own argv (/proc/self/stat's arg_start..arg_end), cut to fit, the rest NUL."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            text = fh.read().decode("ascii", "replace")
        fields = text[text.rfind(")") + 1:].split()
        start, end = int(fields[45]), int(fields[46])  # fields 48 and 49 of proc(5)
        import ctypes  # pylint: disable=import-outside-toplevel
    except (OSError, ValueError, IndexError, ImportError):
        return False
    if end - start < 2:
        return False
    data = "\0".join(words).encode("utf-8", "replace")[:end - start - 1]
    ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)
    return True


class Job:
    """A rank, in the forked process: becomes the program as ``python -u [-m] X ARGS`` would start it."""

    def __init__(self, request, fds, base_path):
        self.request, self.fds, self.base_path = request, fds, base_path

    def prepare(self):
        req = self.request
        os.setpgid(0, 0)
        try:
            import ctypes  # pylint: disable=import-outside-toplevel
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for target, fd in enumerate(self.fds[:3]):
            os.dup2(fd, target)
        for fd in self.fds:
            if fd > 2:
                os.close(fd)
        # ps shows the rank's command, as for a rank its launcher started (pkill -f finds it the same way).
        set_title(list(req["argv"]))
        os.umask(int(req["umask"]))
        os.chdir(req["cwd"])
        env = dict(req["env"])
        os.environ.clear()
        os.environ.update(env)
        sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
        import io  # pylint: disable=import-outside-toplevel
        encoding = env.get("PYTHONIOENCODING") or "utf-8"
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding=encoding)
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding=encoding,
                                                       errors="backslashreplace", write_through=True)
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), encoding=encoding,
                                                       errors="backslashreplace", write_through=True)
        # Each rank draws its own entropy, as a fresh interpreter does (torch's generator keeps its fixed default).
        import random  # pylint: disable=import-outside-toplevel
        random.seed()
        numpy = sys.modules.get("numpy")
        if numpy is not None:
            numpy.random.seed()

    def run(self):
        """Run the program; its exceptions and SystemExit end this process as they would end ``python``."""
        import runpy  # pylint: disable=import-outside-toplevel
        self.prepare()
        argv = list(self.request["argv"])[1:]
        while argv and argv[0] == "-u":
            argv = argv[1:]
        extra = [p for p in (os.environ.get("PYTHONPATH") or "").split(os.pathsep) if p]
        if argv[0] == "-m":
            sys.argv = [argv[1]] + argv[2:]
            sys.path[:] = [os.getcwd()] + extra + self.base_path
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            script = argv[0]
            sys.argv = argv
            sys.path[:] = [os.path.dirname(os.path.abspath(script))] + extra + self.base_path
            runpy.run_path(script, run_name="__main__")


class Server:
    """The warm process: imports, then forks a rank per request until idle or stale."""

    def __init__(self, key, idle, base):
        self.key, self.idle, self.base = key, idle, base
        self.sock_path = os.path.join(base, key + ".sock")
        self.children = {}  # pid -> connection of the rank's multinode_ds.rank
        self.conns = []
        self.last = time.monotonic()
        self.fingerprint = None
        self.stale = ""
        self.listener = None
        self.lock_fd = None
        self.wake_r = self.wake_w = None
        self.base_path = []

    def say(self, text):
        sys.stderr.write("%s multinode_ds.warm[%d]: %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), os.getpid(), text))
        sys.stderr.flush()

    def start(self) -> bool:
        self.lock_fd = os.open(os.path.join(self.base, self.key + ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW,
                               0o600)
        try:
            fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # another one serves this key
        began = time.monotonic()
        import importlib  # pylint: disable=import-outside-toplevel
        for name in IMPORTS:
            try:
                importlib.import_module(name)
            except Exception as exc:  # pylint: disable=broad-except
                # Not installed, or broken: a rank that imports it meets the same error itself.
                self.say("not preloaded: %s (%s)" % (name, exc))
        self.fingerprint = fingerprint()
        self.base_path = list(sys.path)
        registered(base=self.base, prune=True)  # what a node's restart left of earlier warm processes' ranks
        try:
            os.unlink(self.sock_path)
        except FileNotFoundError:
            pass
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        tmp = self.sock_path + ".%d" % os.getpid()
        self.listener.bind(tmp)
        os.chmod(tmp, 0o600)
        self.listener.listen(64)
        # A rank's end wakes the loop at once (SIGCHLD through this pipe), not at its next tick.
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
        self.wake_w = wake_w
        os.rename(tmp, self.sock_path)
        self.say("serving %s (imported %s in %.1f s, fingerprint %s)" % (
            self.key, ", ".join(n for n in IMPORTS if n in sys.modules), time.monotonic() - began, self.fingerprint))
        return True

    def retire(self, why):
        """Serve no more ranks: the socket and the lock's name go (a new warm process may take them at once); this
        one exits once its ranks ended."""
        self.stale = self.stale or why
        self.close_socket()
        lock = os.path.join(self.base, self.key + ".lock")
        try:
            if os.stat(lock).st_ino == os.fstat(self.lock_fd).st_ino:
                os.replace(lock, "%s.retired-%d" % (lock, os.getpid()))
        except OSError:
            pass

    def close_socket(self):
        try:
            if os.stat(self.sock_path).st_ino == os.fstat(self.listener.fileno()).st_ino:
                os.unlink(self.sock_path)
        except OSError:
            pass

    def record(self, pid, run_id, rank):
        path = os.path.join(self.base, "ranks", "%d.json" % pid)
        data = json.dumps({"run_id": run_id, "rank": rank, "start": start_time(pid)})
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(data)
        os.rename(path + ".tmp", path)

    def forget(self, pid):
        try:
            os.unlink(os.path.join(self.base, "ranks", "%d.json" % pid))
        except OSError:
            pass

    def check(self, req) -> str:
        """Why this request gets no rank ("" when it does)."""
        if self.stale:
            return self.stale
        now = fingerprint()
        if now != self.fingerprint:
            self.stale = "the venv or the node package changed since the warm process started (fingerprint %s, " \
                         "now %s): this rank starts cold, the next run's agent starts a new warm process" % (
                             self.fingerprint, now)
            return self.stale
        if req.get("fingerprint") not in (None, now):
            return "the rank's stack (fingerprint %s) is not the warm process's (%s)" % (req["fingerprint"], now)
        if req.get("python") != sys.executable:
            return "the rank's interpreter %s is not the warm process's %s" % (req.get("python"), sys.executable)
        why = refusal(req.get("env") or {})
        if why:
            return why
        risks = hazards()
        if risks:
            self.stale = "forking the warm process is unsafe: %s" % "; ".join(risks)
            return self.stale
        return ""

    def serve(self):
        """The loop; returns a Job in a forked rank, None in the warm process when it ends."""
        while True:
            self.reap()
            if self.stale and not self.children and not self.conns:
                self.say("exiting: %s" % self.stale)
                return None
            if not self.children and not self.conns and time.monotonic() - self.last > self.idle:
                self.say("exiting: idle for %d s" % self.idle)
                return None
            waiting = [self.listener, self.wake_r] + self.conns + [c for c in self.children.values() if c is not None]
            try:
                ready = select.select(waiting, [], [], 1.0)[0]
            except InterruptedError:
                continue
            for sock in ready:
                if sock == self.wake_r:
                    try:
                        while os.read(self.wake_r, 512):
                            pass
                    except OSError:
                        pass
                    continue
                job = self.answer(sock)
                if job is not None:
                    return job

    def answer(self, sock):
        if sock is self.listener:
            try:
                conn = self.listener.accept()[0]
            except OSError:
                return None
            if peer_uid(conn) != os.getuid():
                conn.close()
                return None
            self.conns.append(conn)
            return None
        if sock in self.conns:
            self.conns.remove(sock)
            return self.request(sock)
        # A rank's connection spoke or closed: its multinode_ds.rank is gone, so is the rank.
        for pid, conn in list(self.children.items()):
            if conn is sock:
                try:
                    data = sock.recv(1, socket.MSG_PEEK)
                except OSError:
                    data = b""
                if data:
                    sock.recv(4096)  # nothing is expected after the request
                else:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except OSError:
                        pass
                    sock.close()
                    self.children[pid] = None
        return None

    def request(self, conn):
        self.last = time.monotonic()
        try:
            req, fds = receive(conn, want_fds=3)
        except (OSError, ValueError, Refused):
            conn.close()
            return None
        if not req:
            conn.close()
            return None
        if req.get("ask") == "retire if stale":
            # The node's agent, before a run: still the node's stack, or stale (no later rank reaches it).
            why = self.check({"python": sys.executable})
            if why:
                self.retire(why)
            return answer_and_close(conn, {"stale": why})
        why = self.check(req) if len(fds) == 3 else "the rank's standard streams did not arrive"
        if why:
            if self.stale:
                self.retire(self.stale)
            for fd in fds:
                os.close(fd)
            return answer_and_close(conn, {"why": why})
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            # The rank: nothing of the warm process's stays open.
            for other in self.conns + [c for c in self.children.values() if c is not None] + [self.listener, conn]:
                other.close()
            signal.set_wakeup_fd(-1)
            for fd in (self.lock_fd, self.wake_r, self.wake_w):
                os.close(fd)
            return Job(req, fds, self.base_path)
        for fd in fds:
            os.close(fd)
        env = req.get("env") or {}
        try:
            self.record(pid, str(env.get("MULTINODE_DS_RUN_ID", "")), env.get("RANK"))
        except OSError as exc:
            self.say("cannot record rank pid %d: %s" % (pid, exc))
        self.children[pid] = conn
        try:
            send(conn, {"pid": pid})
        except OSError:
            pass
        return None

    def reap(self):
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            self.forget(pid)
            self.last = time.monotonic()
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            if conn is not None:
                try:
                    send(conn, {"exit": code})
                except OSError:
                    pass
                conn.close()

    def stop(self):
        self.close_socket()
        self.listener.close()
        try:
            os.unlink("%s.retired-%d" % (os.path.join(self.base, self.key + ".lock"), os.getpid()))
        except OSError:
            pass


def serve_main(key: str, idle: float):
    sys.path[:] = [p for p in sys.path if p not in ("", os.getcwd())]
    # The node package's directory, given by the agent: a rank's interpreter has it from the venv's .pth only (a
    # second, earlier entry goes), and never as its PYTHONPATH.
    own = os.environ.pop("PYTHONPATH", "")
    if own in sys.path and own in sys.path[sys.path.index(own) + 1:]:
        sys.path.remove(own)
    base = private_dir(home_dir())
    private_dir(os.path.join(base, "ranks"))
    set_title([sys.executable, "-m", "multinode_ds.warm", "serve", "--key", key])
    server = Server(key, idle, base)
    if not server.start():
        return 0
    job = server.serve()
    if job is None:
        server.stop()
        return 0
    job.run()
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) >= 3 and argv[0] == "serve" and argv[1] == "--key":
        idle = float(argv[argv.index("--idle") + 1]) if "--idle" in argv else IDLE
        return serve_main(argv[2], idle)
    sys.stderr.write("usage: python -m multinode_ds.warm serve --key KEY [--idle SECONDS] (the node's agent starts "
                     "it)\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())
