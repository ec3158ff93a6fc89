"""The two slow quality gates, ansible-lint (scripts/lint) and ansible-test sanity (scripts/sanity), run in the
background from the moment a session that has their tests is collected (tests/conftest.py), as the molecule
scenarios are: at the background jobs' low CPU weight (tests/background.py), beside the unit tests, the local
cluster's first site.yml and the end-to-end tests.  Their tests (test_quality.py) come last in the session and only
wait for the results, so no other test waits for them.  A test whose gate was not started (its module run some
other way) starts it itself.

Neither script reads what the other tests write meanwhile: scripts/lint skips runs/, tests/output/, .cluster/,
.cache/ and inventories/local/ (.ansible-lint's exclude_paths); scripts/sanity copies only the files git would ship
(none of those: .gitignore) and works on the copy."""
import os
import sys
import threading
import time
from pathlib import Path

import background

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
OUTPUT = ROOT / "tests" / "output"
TESTS = Path(__file__).resolve().parent / "test_quality.py"
# test -> (name, command, environment on top of the session's); the commands run in the repo's root.
GATES = {
    "test_ansible_lint_production_profile": ("lint", ["bash", "scripts/lint"], {"NO_COLOR": "1"}),
    "test_ansible_test_sanity": ("sanity", ["bash", "scripts/sanity"], {}),
}

_started = {}
_lock = threading.Lock()


def items(session_items):
    """The session's items that wait for a gate."""
    return [item for item in session_items
            if item.name in GATES and Path(item.path).resolve() == TESTS]


def start(tests):
    """Start the gates of ``tests`` (test names), each once per session: ``{test: future}``; each future's result
    is ``(CompletedProcess, seconds, log)``, the CompletedProcess with stdout and stderr apart."""
    with _lock:
        for test in tests:
            if test in GATES and test not in _started:
                name, argv, extra = GATES[test]
                env = dict(os.environ, PATH=f"{BIN}:{os.environ.get('PATH', '')}", **extra)
                log = OUTPUT / f"quality-{name}-{int(time.time())}.log"
                _started[test] = background.submit("quality %s (%s)" % (name, argv[-1]), background.run, argv,
                                                   log, merge=False, cwd=ROOT, env=env)
        return dict(_started)


def result(test):
    """The gate's ``(CompletedProcess, seconds, log)`` once it ended (started now when it was not yet); what is
    left of it meanwhile runs at the normal weight (this test and the other gate's are the session's last)."""
    future = start([test])[test]
    with background.awaited():
        return future.result()
