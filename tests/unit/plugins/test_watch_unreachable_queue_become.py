"""Issue 26, 9, 10 and 12, through the watch's loop (plugins/action/watch.py): one bad poll does not end a run, a
watch that gives up returns a result, a job waiting in the queue is not a stall, and the dead man's switch goes
through the task's become and says when it fails."""
import time
from unittest.mock import MagicMock

import pytest

from ansible_collections.multinode.deepspeed.plugins.action import watch
import test_watch_switch
from test_watch_loop import Run, plugin, poll
from test_watch_switch import FakeConnection, action, run_dir

fake_ssh = test_watch_switch.fake_ssh  # the fixture

FINISHED = {"state": "finished", "role": "launcher", "exit_code": 0}


@pytest.fixture
def shown(monkeypatch):
    lines, warnings = [], []
    monkeypatch.setattr(watch, "display", MagicMock(display=lambda msg, color=None: lines.append(msg),
                                                    warning=warnings.append))
    monkeypatch.setattr(watch.time, "sleep", lambda s: None)
    return lines, warnings


class Flaky(Run):
    """run_status that fails ``failures`` times (the coordinator unreachable) before it answers."""

    def __init__(self, polls, failures, **kw):
        super(Flaky, self).__init__(polls, **kw)
        self.failures = failures

    def __call__(self, task_vars, **kw):
        if self.failures:
            self.failures -= 1
            raise watch.StatusFailed("unreachable: ssh: connect to host coord port 22: Connection refused")
        return super(Flaky, self).__call__(task_vars, **kw)


def test_two_failed_polls_then_the_run_goes_on(shown):
    run = Flaky([poll(), poll(coord=FINISHED, w1={"state": "finished"}, w2={"state": "finished"})], failures=2)
    result = plugin(run).run(task_vars={"inventory_hostname": "coord"})
    assert result["status"] == "success" and result["unreachable"] is False
    assert len(shown[1]) == 2 and "Connection refused" in shown[1][0] and "trying again in 1s" in shown[1][0]


def test_a_watch_that_gives_up_returns_a_failed_result(shown):
    run = Flaky([poll()], failures=10 ** 6)
    result = plugin(run, status_retry=0).run(task_vars={"inventory_hostname": "coord"})
    assert result["status"] == "failed" and result["unreachable"] is True
    assert result["reason"].startswith("the coordinator coord could not be reached or read for ")
    assert "Connection refused" in result["reason"]
    # The summary, written with what the play could collect, names it first (issue 44, point 6).
    assert result["cause"] == result["reason"]
    # No lock given back and no probe through a coordinator that does not answer.
    assert run.calls == []


def test_a_status_call_that_hangs_is_a_failed_call(monkeypatch):
    module = plugin(Run([poll()]))
    del module._status  # the real one, over a module call that never returns
    module._status_timeout = 0.2
    monkeypatch.setattr(module, "_execute_module", lambda **kw: time.sleep(30))
    with pytest.raises(watch.StatusFailed, match="no answer within 0s"):
        module._status({})
    monkeypatch.setattr(module, "_execute_module", lambda **kw: {"unreachable": True, "msg": "port 22"})
    with pytest.raises(watch.StatusFailed, match="unreachable: port 22"):
        module._status({})


class Clock(object):
    """The watch's clock (its ``time`` module): a minute passes at each poll."""

    def __init__(self):
        self.now = 1000.0

    def time(self):
        return self.now

    def sleep(self, seconds):
        pass


class Queued(Run):
    """A job that waits in the queue for ``waiting`` polls (a minute each), then starts and ends well."""

    def __init__(self, waiting, clock, **kw):
        ended = poll(coord=FINISHED, w1={"state": "finished"}, w2={"state": "finished"})
        super(Queued, self).__init__([poll()] * waiting + [ended], **kw)
        self.waiting, self.clock, self.t0 = waiting, clock, clock.now

    def __call__(self, task_vars, **kw):
        if not kw:
            self.clock.now += 60
        res = super(Queued, self).__call__(task_vars, **kw)
        res["now"] = self.clock.now
        for beat in res["nodes"].values():
            beat["time"] = res["now"]
        res["queue"] = {"state": "queued", "label": "PENDING", "reason": "Resources", "job_id": "42",
                        "since": self.t0, "fix": "wait"} if self.n <= self.waiting else None
        return res


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(watch, "time", clock)
    return clock


def test_time_in_the_queue_is_not_a_stall(shown, clock):
    run = Queued(5, clock)
    result = plugin(run, startup_timeout=30, start_timeout=30).run(task_vars={"inventory_hostname": "coord"})
    assert result["status"] == "success", result["reason"]
    assert shown[0][0].startswith("[coord] queued: PENDING (Resources) 1m00s | nodes: ")


def test_without_a_queue_record_the_same_wait_is_a_stall(shown, clock):
    run = Queued(5, clock)
    run.waiting = 0
    result = plugin(run, startup_timeout=30, start_timeout=30).run(task_vars={"inventory_hostname": "coord"})
    assert result["status"] == "failed" and "no rank finished its first step" in result["reason"]


def test_past_queue_timeout_the_run_is_stopped_naming_the_job(shown, clock):
    run = Queued(50, clock)
    result = plugin(run, queue_timeout=150).run(task_vars={"inventory_hostname": "coord"})
    assert result["status"] == "failed"
    assert result["reason"].startswith("job 42 waited in the queue for 3m00s (queue_timeout 150s), still PENDING "
                                       "(Resources); wait")


class Become(object):
    prompt = ""

    def build_become_command(self, cmd, shell):
        return "sudo -H -S -n -u mnds /bin/sh -c %s" % watch.shlex.quote(cmd)


def test_the_switch_goes_through_the_tasks_become(tmp_path):
    conn = FakeConnection("ssh")
    conn.become, conn._shell = Become(), None
    module = action(conn)
    module._play_context = MagicMock(become=True)
    command, password = module._switch_command("/shared/runs/r1")
    assert command.startswith("sudo -H -S -n -u mnds /bin/sh -c ") and "/shared/runs/r1/control" in command
    assert password is None
    module._play_context = MagicMock(become=False)
    assert module._switch_command("/shared/runs/r1")[0].startswith("sh -c ")


def test_a_switch_that_cannot_write_abort_says_so(tmp_path, fake_ssh):
    missing = str(tmp_path / "gone")
    switch = action(FakeConnection(fake_ssh))._dead_man_switch(missing)
    said = watch.ActionModule._release_switch(switch, wait=10, reason="interrupted on the controller")
    assert said.startswith("watch: the dead man's switch failed (exit code 3): ")
    assert "gone/control" in said
    ok = action(FakeConnection(fake_ssh))._dead_man_switch(run_dir(tmp_path))
    assert watch.ActionModule._release_switch(ok, wait=10, reason="interrupted on the controller") is None


def test_a_watch_whose_main_process_went_away_stops_the_run(shown, monkeypatch):
    """Ansible's worker runs in a session of its own: when its main process is killed it must not watch on."""
    run = Run([poll()])
    module = plugin(run)
    parents = iter([10] + [1] * 100)
    monkeypatch.setattr(watch.os, "getppid", lambda: next(parents))
    with pytest.raises(watch.Interrupted):
        module.run(task_vars={"inventory_hostname": "coord"})
    assert run.abort["reason"] == "interrupted on the controller"
