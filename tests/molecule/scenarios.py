"""The molecule scenarios of a pytest session, run in the background from the moment the tests are collected
(tests/conftest.py), beside everything else: the unit tests, the quality checks, the local cluster's first
site.yml and the end-to-end tests.  They run at a low CPU weight (tests/background.py: their processes on the
controller in the cpu cgroup ``mnds-background``, their containers with the same cpu.shares), so they take the
cycles the tests leave idle and next to nothing from a test that needs both cores: a fault test's timing is its
own, and no test waits for them.  The molecule tests at the end of the session wait for their results.
"""
import concurrent.futures
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import background

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
OUTPUT = ROOT / "tests" / "output"
SCENARIOS = sorted(p.parent.name for p in (ROOT / "extensions" / "molecule").glob("*/molecule.yml"))
# Scenarios run MNDS_MOLECULE_JOBS at a time (default 2: each is mostly waiting on podman and ssh), the longest
# first; every scenario has its own containers and network, so they never meet.
JOBS = max(1, int(os.environ.get("MNDS_MOLECULE_JOBS", "2")))
LONGEST_FIRST = ("stack", "image", "ssh_mesh", "slurm", "nccl", "nfs", "benchmark", "preflight", "cluster_hosts",
                 "shared_dir")

# The scenarios that install the stack from the controller's wheelhouse (the one site.yml builds): while it is not
# built, they start only after the end-to-end tests' first site.yml built it (``wheelhouse_ready``), so that two
# pip runs never write it at once.
NEEDS_WHEELHOUSE = ("stack", "preflight", "image")
WHEELHOUSE = Path(os.path.expanduser("~/.cache/multinode-deepspeed/wheelhouse"))

_started = {}
_image_ready = threading.Event()
wheelhouse_ready = threading.Event()
_lock = threading.Lock()


def wheelhouse_built():
    return any(WHEELHOUSE.glob("*/.complete-*"))


def node_image():
    """The local cluster's node image (built once, cached), which the scenarios run."""
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "localcluster.py"), "image"], cwd=ROOT,
                         check=True, stdout=subprocess.PIPE, text=True)
    return res.stdout.strip().splitlines()[-1]


def run_scenario(image, scenario):
    env = dict(os.environ, MNDS_NODE_IMAGE=image, PATH=f"{BIN}:{os.environ.get('PATH', '')}",
               CONTAINERS_CONF=str(ROOT / ".cache" / "podman" / "containers.conf"),
               ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".collections"), ANSIBLE_FORCE_COLOR="0", NO_COLOR="1",
               PY_COLORS="0", ANSIBLE_NOCOLOR="1")
    env.pop("ANSIBLE_CONFIG", None)
    log = OUTPUT / f"molecule-{scenario}-{int(time.time())}.log"
    return background.run([str(BIN / "molecule"), "test", "-s", scenario], log, cwd=ROOT / "extensions", env=env)


def start(chosen, e2e=False):
    """Start the ``chosen`` scenarios (once per session), JOBS at a time, the longest first, after the node image is
    built (in this thread: the local cluster needs the same image, see ``wait_for_image``); with ``e2e`` (end-to-end
    tests in the session) and no wheelhouse yet, those that need it come last and wait for it.  Returns
    ``{scenario: future}``; each future's result is ``(CompletedProcess, seconds, log)``."""
    with _lock:
        if _started:
            return _started
        if not e2e or wheelhouse_built():
            wheelhouse_ready.set()
        order = [s for s in LONGEST_FIRST if s in chosen] + sorted(set(chosen) - set(LONGEST_FIRST))
        if not wheelhouse_ready.is_set():
            order = [s for s in order if s not in NEEDS_WHEELHOUSE] + [s for s in order if s in NEEDS_WHEELHOUSE]
        # At a low CPU weight: their processes here, and the containers they create (podman labels them
        # owner=molecule).
        if background.group() is not None:
            background.ContainerWeight("owner=molecule", background.WEIGHT).start()
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=JOBS)
        image = concurrent.futures.Future()

        def build():
            try:
                image.set_result(node_image())
            except Exception as exc:  # pylint: disable=broad-except
                image.set_exception(exc)
            finally:
                _image_ready.set()

        threading.Thread(target=build, daemon=True).start()

        def run(scenario):
            if scenario in NEEDS_WHEELHOUSE:
                wheelhouse_ready.wait()
            return run_scenario(image.result(), scenario)

        for scenario in order:
            _started[scenario] = background.track("molecule %s (scenario)" % scenario, pool.submit(run, scenario))
        pool.shutdown(wait=False)
        return _started


def wait_for_scenario(scenario, timeout=3600):
    """Wait until ``scenario`` ended when it has begun (its future is running), so that work that would do the same
    thing again finds it done: the end-to-end tests' image.yml builds the image the ``image`` scenario built, from
    podman's layer cache, instead of a second time beside it.  A scenario not started, or still queued behind the
    others, is not waited for.  Returns whether it waited."""
    future = _started.get(scenario)
    if future is None or not future.running():
        return False
    concurrent.futures.wait([future], timeout=timeout)
    return True


def wait_for_image(timeout=3600):
    """Block until the scenarios' node image is built (when they were started): the local cluster's ``up`` uses
    the same image and must not build it at the same time."""
    if _started:
        _image_ready.wait(timeout)


def results():
    """The started scenarios' futures, for the molecule tests to wait on: the wheelhouse is built by then (an
    end-to-end test's fixtures ran site.yml), or the scenarios that need it build it alone."""
    wheelhouse_ready.set()
    return _started
