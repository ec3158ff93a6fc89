"""Issue 47, point 1: the agent names the run's processes that do not run - a rank stopped by SIGSTOP (state T) at
once, one in an uninterruptible wait (state D) after a while - with its rank, in every heartbeat (``frozen``)."""
import os
import signal
import subprocess
import sys
import time

from multinode_ds import agent


def wait_state(pid, want, seconds=10.0):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if agent.proc_state(pid) == want:
            return True
        time.sleep(0.02)
    return False


def test_a_stopped_rank_is_named_with_its_rank_and_a_running_one_is_not():
    env = dict(os.environ, RANK="3")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert wait_state(proc.pid, "S")
        got, seen = agent.frozen([proc.pid, other.pid], {}, time.time())
        assert got == [] and seen == {}
        os.kill(proc.pid, signal.SIGSTOP)
        assert wait_state(proc.pid, "T")
        now = time.time()
        got, seen = agent.frozen([proc.pid, other.pid], {}, now)
        assert got == [{"pid": proc.pid, "rank": 3, "state": "T", "for": 0.0}]
        # The next beat counts from the first one that saw it stopped.
        got, seen = agent.frozen([proc.pid, other.pid], seen, now + 7.0)
        assert got[0]["for"] == 7.0 and seen == {proc.pid: ("T", now)}
        os.kill(proc.pid, signal.SIGCONT)
        assert wait_state(proc.pid, "S")
        assert agent.frozen([proc.pid], seen, now + 8.0) == ([], {})
    finally:
        for p in (proc, other):
            p.kill()
            p.wait()


def test_an_uninterruptible_wait_counts_only_once_it_lasts(monkeypatch):
    states = {11: "D", 12: "R", 13: "t"}
    monkeypatch.setattr(agent, "proc_state", states.get)
    monkeypatch.setattr(agent, "proc_rank", {11: 0, 13: None}.get)
    got, seen = agent.frozen([11, 12, 13], {}, 100.0)
    assert got == [{"pid": 13, "rank": None, "state": "t", "for": 0.0}] and seen[11] == ("D", 100.0)
    got, seen = agent.frozen([11, 12, 13], seen, 109.0)
    assert [g["pid"] for g in got] == [13]
    got, seen = agent.frozen([11, 12, 13], seen, 110.5)
    assert got[0] == {"pid": 11, "rank": 0, "state": "D", "for": 10.5}
    # A wait that ended and began again counts from its new start.
    states[11] = "S"
    got, seen = agent.frozen([11], seen, 111.0)
    states[11] = "D"
    got, seen = agent.frozen([11], seen, 112.0)
    assert got == [] and seen[11] == ("D", 112.0)


def test_the_state_is_read_after_a_command_name_with_spaces_and_parentheses(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    stat.write_text("4242 (my (odd) name) T 1 4242 4242 0 -1 4194560 0\n")
    real_open = open

    def fake_open(path, *args, **kwargs):
        return real_open(stat if str(path) == "/proc/4242/stat" else path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", fake_open)
    assert agent.proc_state(4242) == "T"
    assert agent.proc_state(999999999) is None
