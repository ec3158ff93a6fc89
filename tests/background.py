"""Work the suite runs beside its tests, at a lower CPU weight than the tests: the molecule scenarios (weight 128)
and the Kubernetes control plane's first build (weight 2).

``nice`` is not enough on this machine: it ranks a process only against the processes of its own cgroup, and the
local cluster's containers and the scenarios' containers are cgroups of their own (``libpod_parent/libpod-<id>``,
weight 1024 each).  So a background job's processes on the controller start in a cpu cgroup of their own (v1:
``/sys/fs/cgroup/cpu/<name>``), and the containers a background job creates get the same weight
(``podman update --cpu-shares``).  Weights are work-conserving: a background job gets every cycle the tests leave
idle (a fault test waits on timeouts most of its time), and a test that needs both cores gets nearly all of them.
Where the machine allows none of this, the work runs at the normal weight, as before.

The jobs of that weight (the molecule scenarios, tests/molecule/scenarios.py; ansible-lint and ansible-test sanity,
tests/quality/gates.py) run with ``run`` in the cgroup ``mnds-background`` and are listed with ``track``, so that
the suite's time by phase shows their seconds (``durations``)."""
import concurrent.futures
import contextlib
import os
import subprocess
import threading
import time
from pathlib import Path

CPU = Path("/sys/fs/cgroup/cpu")
CONTAINERS = CPU / "libpod_parent"
ROOT = Path(__file__).resolve().parents[1]

# The background jobs' CPU weight: a tenth of a test's under contention (the cluster's containers and the
# controller have 1024 each), enough that an SSH login or a podman call of a scenario never waits for seconds.
GROUP = "mnds-background"
WEIGHT = int(os.environ.get("MNDS_BACKGROUND_WEIGHT", "128"))
_lock = threading.Lock()
_group = {}
_jobs = {}


def cgroup(name, shares):
    """The cpu cgroup ``name`` with ``shares``, or None where this machine does not allow one."""
    path = CPU / name
    try:
        path.mkdir(exist_ok=True)
    except OSError:
        return None
    return path if weight(path, shares) else None


def weight(path, shares):
    """Set the cgroup's cpu.shares; False where it cannot be set."""
    try:
        (path / "cpu.shares").write_text(str(shares))
        return True
    except OSError:
        return False


def joiner(path):
    """A ``preexec_fn`` that puts the child (and so everything it starts) into the cgroup ``path`` (None: nothing)."""
    def join():
        if path is not None:
            try:
                (path / "cgroup.procs").write_text(str(os.getpid()))
            except OSError:
                pass
    return join


def _podman(*args):
    env = dict(os.environ, CONTAINERS_CONF=str(ROOT / ".cache" / "podman" / "containers.conf"),
               PATH="/usr/sbin:/usr/bin:/sbin:/bin")
    return subprocess.run(["podman", *args], env=env, capture_output=True, text=True, check=False)


class ContainerWeight:
    """While running, gives every new container labelled ``label`` (``key=value``) the cpu weight ``shares``.  It
    looks for new container cgroups (a directory listing every ``every`` seconds; podman is asked only about a new
    one), so it costs next to nothing while nothing is created."""

    def __init__(self, label, shares, every=1.0):
        self.label, self.shares, self.every = label, shares, every
        self.seen = set()
        self.lowered = []
        self._stop = threading.Event()
        self._thread = None

    def start(self):
        if self._thread is None and CONTAINERS.is_dir():
            self.seen = set(self._ids())  # those that exist now are not the background's
            self._thread = threading.Thread(target=self._run, name="container-weight", daemon=True)
            self._thread.start()
        return self

    def stop(self):
        self._stop.set()

    @staticmethod
    def _ids():
        try:
            return [p.name[len("libpod-"):] for p in CONTAINERS.iterdir() if p.name.startswith("libpod-")]
        except OSError:
            return []

    def _run(self):
        key, value = self.label.split("=", 1)
        while not self._stop.wait(self.every):
            for cid in self._ids():
                if cid in self.seen:
                    continue
                self.seen.add(cid)
                res = _podman("inspect", "--format", '{{index .Config.Labels "%s"}}' % key, cid)
                if res.returncode == 0 and res.stdout.strip() == value \
                        and weight(CONTAINERS / ("libpod-" + cid), self.shares):
                    self.lowered.append((cid, time.time()))


def group():
    """The background jobs' cpu cgroup (``GROUP`` at ``WEIGHT``, made on first use), or None where not allowed."""
    with _lock:
        if "path" not in _group:
            _group["path"] = cgroup(GROUP, WEIGHT)
        return _group["path"]


@contextlib.contextmanager
def awaited():
    """While the session waits for its background jobs with nothing else left to run (the tests that read their
    results come last): the jobs at the normal weight, so that they get the share of the CPU the tests had."""
    path = group()
    if path is not None:
        weight(path, 1024)
    try:
        yield
    finally:
        if path is not None:
            weight(path, WEIGHT)


def _text(out):
    return out.decode("utf-8", "replace") if isinstance(out, bytes) else (out or "")


def run(argv, log, timeout=3600, merge=True, **kwargs):
    """``argv`` to its end in the background cgroup: ``(CompletedProcess, seconds, log)``.  Its output goes to the
    file ``log`` too (stdout, then stderr unless ``merge`` sent stderr to stdout); on a timeout, what it printed
    until then, and TimeoutExpired is raised."""
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    # Each job reads a /dev/null of its own, never the session's stdin: a job that makes the stdin it shares
    # non-blocking (the flag is on the shared open file) would make every other job's ansible-playbook refuse to start
    # ("Ansible requires blocking IO on stdin").
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    t0 = time.time()
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                              text=True, check=False, timeout=timeout,
                              preexec_fn=joiner(group()), **kwargs)  # pylint: disable=W1509
    except subprocess.TimeoutExpired as exc:
        # The output is bytes here even with text=True.
        Path(log).write_text(_text(exc.stdout) + _text(exc.stderr))
        raise
    Path(log).write_text(proc.stdout + (proc.stderr or ""))
    return proc, time.time() - t0, log


def track(name, future):
    """List ``future`` (whose result is ``run``'s) under ``name`` in the suite's time by phase."""
    _jobs[name] = future
    return future


def submit(name, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a thread of its own from now: its Future, tracked under ``name``."""
    future = concurrent.futures.Future()

    def work():
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # pylint: disable=broad-except
            future.set_exception(exc)

    threading.Thread(target=work, name=name, daemon=True).start()
    return track(name, future)


def durations():
    """``{name: seconds}`` of the tracked jobs that ended with a result (passed or failed)."""
    return {name: future.result()[1] for name, future in sorted(_jobs.items())
            if future.done() and not future.cancelled() and future.exception() is None}
