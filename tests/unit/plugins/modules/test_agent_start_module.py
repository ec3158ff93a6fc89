import os
import signal
import sys
import time

from ansible_collections.multinode.deepspeed.plugins.modules import agent_start


def test_starts_detached_in_its_own_session_with_its_output_in_the_log(tmp_path, run_module):
    log = tmp_path / "agent.log"
    script = "import os, sys, time; print(os.getcwd(), os.environ['MARK'], os.getsid(0) == os.getpid(), flush=True); time.sleep(30)"
    res = run_module(agent_start, {"argv": [sys.executable, "-c", script], "chdir": str(tmp_path), "log": str(log),
                                   "environment": {"MARK": "run-7"}})
    pid = res["pid"]
    try:
        assert res["changed"] is True
        os.kill(pid, 0)  # still running after the module returned
        deadline = time.time() + 10
        while time.time() < deadline and not log.read_text().strip():
            time.sleep(0.05)
        assert log.read_text().split() == [str(tmp_path), "run-7", "True"]
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def test_an_agent_that_exits_at_once_fails_with_its_last_lines(tmp_path, run_module):
    log = tmp_path / "agent.log"
    script = "import sys; sys.stderr.write('no run directory here\\n'); sys.exit(3)"
    res = run_module(agent_start, {"argv": [sys.executable, "-c", script], "log": str(log), "settle": 5})
    assert res["failed"] is True and res["rc"] == 3
    assert "exited at once with code 3" in res["msg"] and "no run directory here" in res["msg"]


def test_a_missing_program_fails(tmp_path, run_module):
    res = run_module(agent_start, {"argv": [str(tmp_path / "nope")], "log": str(tmp_path / "a.log"), "settle": 5})
    assert res["failed"] is True and res["rc"] == 127 and "cannot start" in res["msg"]
