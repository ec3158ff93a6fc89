"""The end-to-end tests in two lanes, each on a local cluster of its own, so that their waiting overlaps.

Most of an end-to-end test's time is waiting (for a fault's timeout, a recovery's wait, a compile on the other
node), so the suite's single line of them left this machine's two cores idle for a third of its length and more.
A session that has end-to-end tests of both lanes (``make test``) runs the files of ``LANE_B`` in a second pytest
process of their own, started once this session's cluster has had its first ``site.yml`` (the node image and the
controller's wheelhouse are then there to share, and the busiest minutes are past): its cluster is a second
``scripts/localcluster.py`` cluster (``MNDS_CLUSTER_PREFIX=mndsb``: containers ``mndsb-*``, its own network, volume,
keys and inventory), provisioned by its own first ``site.yml``.  Every test runs, in one lane or the other;
``test_second_lane.py``, at the session's end, waits for the second lane and fails with its failures.

``MNDS_E2E_LANES=1`` keeps every test in one lane (as does a session without the early start, or with tests of one
lane only: a single file runs as before).  The files of the second lane are those whose cluster changes are their
own (a spare, a stopped node, a killed compile, Slurm's node states) and whose waits are longest; both lanes take
about the same time on this machine (docs/testing.md)."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from e2e_nodes import cluster_paths

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = ROOT / "tests" / "output"
PREFIX = "mndsb"
LANE_B = ("test_restarts.py", "test_faults.py", "test_first_config.py", "test_slurm_cluster.py",
          "test_coordinator_outage.py", "test_hangs.py", "test_stragglers.py")
RESULT_TEST = "test_second_lane.py"
LOG = OUTPUT / "lane-b.log"
PHASES = OUTPUT / "test-phases-b.json"
JUNIT = OUTPUT / "lane-b.xml"

_state = {}
_lock = threading.Lock()


def in_second_lane():
    """Whether this process is the second lane."""
    return os.environ.get("MNDS_LANE") == "b"


def wanted():
    return (os.environ.get("MNDS_E2E_LANES", "2") != "1" and not in_second_lane()
            and os.environ.get("MNDS_E2E_EARLY", "1") != "0")


def lane_of(item):
    """``b`` for an end-to-end test of the second lane's files, ``a`` for one of the others, None otherwise."""
    if item.get_closest_marker("e2e") is None or Path(str(item.path)).name == RESULT_TEST:
        return None
    return "b" if Path(str(item.path)).name in LANE_B else "a"


def split(config, items):
    """Take the second lane's tests out of ``items`` (they run in the second process), when the session has tests
    of both lanes; else take out the test that waits for a second lane.  Returns the second lane's node ids."""
    result = [item for item in items if Path(str(item.path)).name == RESULT_TEST]
    lanes = [lane_of(item) for item in items]
    second = [item for item, lane in zip(items, lanes) if lane == "b"]
    if not (wanted() and second and "a" in lanes):
        second = []
    out = second + ([] if second else result)
    if out:
        config.hook.pytest_deselected(items=out)
        items[:] = [item for item in items if item not in out]
        # The test that waits for the second lane comes after every other end-to-end test.
        items[:] = [item for item in items if item not in result] + [item for item in result if second]
    ids = [item.nodeid for item in second]
    _state["ids"] = ids
    return ids


def start(after):
    """Start the second lane in a thread once ``after`` (a threading.Event: this session's first site.yml ended) is
    set; nothing when ``split`` kept every test here."""
    ids = _state.get("ids")
    if not ids:
        return
    with _lock:
        if "thread" in _state:
            return
        _state["done"] = threading.Event()
        _state["thread"] = threading.Thread(target=_run, args=(ids, after), name="e2e-lane-b", daemon=True)
        _state["thread"].start()


def environment():
    """The second lane's environment: its cluster's prefix and inventory, and neither molecule nor the gates."""
    inventory, _keys = cluster_paths(PREFIX)
    return dict(os.environ, MNDS_LANE="b", MNDS_CLUSTER_PREFIX=PREFIX, ANSIBLE_INVENTORY=str(inventory),
                MNDS_MOLECULE_EARLY="0", MNDS_PHASES_FILE=str(PHASES))


def _run(ids, after):
    try:
        after.wait()
        OUTPUT.mkdir(parents=True, exist_ok=True)
        for stale in (PHASES, JUNIT):
            if stale.exists():
                stale.unlink()
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE",
                "--junitxml", str(JUNIT), *ids]
        _state["started"] = time.time()
        # The same process group as this session: Ctrl-C on make test stops both lanes.
        with open(LOG, "w") as log:
            proc = subprocess.Popen(argv, cwd=ROOT, env=environment(), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
            _state["proc"] = proc
            _state["rc"] = proc.wait()
        _state["ended"] = time.time()
    except Exception as exc:  # pylint: disable=broad-except
        _state["error"] = "%s: %s" % (type(exc).__name__, exc)
    finally:
        _state["done"].set()


def active():
    return bool(_state.get("ids"))


def wait(timeout=3600):
    """The second lane's ``(rc, output)`` once it ended (rc None: it did not start, or not end within ``timeout``
    seconds and was stopped; the output says why)."""
    done = _state.get("done")
    if done is None:
        return None, "the second lane was not started"
    if not done.wait(timeout):
        stop()
        done.wait(60)
        return None, "the second lane did not end within %ds: stopped\n%s" % (
            timeout, LOG.read_text(errors="replace") if LOG.exists() else "")
    text = LOG.read_text(errors="replace") if LOG.exists() else ""
    if _state.get("error"):
        return None, "the second lane could not run: %s\n%s" % (_state["error"], text)
    return _state.get("rc"), text


def record():
    """The second lane's phase record (tests/phases.py) and when it started, in epoch seconds; None before it
    ended."""
    if _state.get("ended") is None or not PHASES.exists():
        return None, None
    try:
        return json.loads(PHASES.read_text()), _state["started"]
    except ValueError:
        return None, None


def stop():
    """Stop the second lane (this session ends before it did)."""
    proc = _state.get("proc")
    if proc is not None and proc.poll() is None:
        proc.terminate()
