"""The watch's loop (plugins/action/watch.py) over a scripted run: its verdict and result, the records it writes
through run_status, and its cleanup when it is interrupted."""
import signal
import time
from unittest.mock import MagicMock

import pytest

from ansible_collections.multinode.deepspeed.plugins.action import watch
from tests.unit.plugins.action_task import action_plugin

NODES = ["coord", "w1", "w2"]


def beat(state="running", age=0.0, role="watcher", exit_code=None):
    return {"state": state, "time": time.time() - age, "role": role, "exit_code": exit_code}


def poll(**beats):
    """One poll's heartbeats: every node running, unless ``beats`` gives a node's arguments to beat()."""
    def nodes():
        return dict((h, beat(**beats.get(h, {}))) for h in NODES)
    return nodes


class Run(object):
    """run_status, scripted: one status per poll (the last one repeats); abort/done/release/probe recorded."""

    def __init__(self, polls, unreachable=(), interrupt_at=None):
        self.polls, self.unreachable, self.interrupt_at = polls, unreachable, interrupt_at
        self.calls, self.abort, self.n = [], None, 0

    def __call__(self, task_vars, **kw):
        self.calls.append(kw)
        if "probe" in kw:
            return {"reachable": dict((h, {"ok": h not in self.unreachable, "error": "No route to host"})
                                      for h in kw["probe"])}
        if kw.get("abort") and self.abort is None:
            self.abort = {"reason": kw["abort"], "host": "controller", "lost": kw.get("lost", [])}
        if not kw or kw.get("done"):  # a done call waits for the watchers' answers, as a poll does
            self.n += 1
            if self.n == self.interrupt_at:
                raise KeyboardInterrupt()
        nodes = self.polls[min(self.n, len(self.polls)) - 1]()
        return {"nodes": nodes, "abort": self.abort, "ranks": {}, "done_ranks": [0, 1], "now": time.time()}


def plugin(run, **args):
    module = action_plugin(watch.ActionModule, "multinode.deepspeed.watch", dict(
        {"run_dir": "/shared/runs/r1", "nodes": NODES, "launchers": ["coord"], "world_size": 2,
         "poll_interval": 0, "lock": "/shared/locks/ckpt"}, **args))
    module._status = run
    # The status calls as module runs (test_watch_status_direct.py: the same call without the module wrapper).
    module._connection.is_pipelining_enabled.return_value = False
    return module


@pytest.fixture
def shown(monkeypatch):
    lines = []
    monkeypatch.setattr(watch, "display", MagicMock(display=lambda msg, color=None: lines.append(msg)))
    return lines


def test_a_run_that_ends_well(shown):
    launched = {"state": "finished", "role": "launcher", "exit_code": 0}
    run = Run([poll(), poll(coord=launched), poll(coord=launched, w1={"state": "finished"}, w2={"state": "finished"})])
    result = plugin(run).run(task_vars={"inventory_hostname": "coord"})
    assert (result["status"], result["reason"], result["lost"], result["abort"]) == ("success", None, [], None)
    assert result["done_ranks"] == [0, 1] and result["follow"] is None
    # The lock goes back in the call that writes DONE, which waits for the watchers' final beats; the verdict
    # comes from its answer (no call of its own after it).
    assert [c for c in run.calls if c] == [{"done": True, "wait": 0, "release": "/shared/locks/ckpt", "finish": {
        "nodes": NODES, "launchers": ["coord"], "world_size": 2, "release": None}}]
    assert len(run.calls) == 3
    assert shown[0].startswith("[coord] starting | nodes: coord running 0s")


def test_a_silent_node_is_stopped_and_named_lost(shown):
    stopped = poll(coord={"state": "aborted"}, w1={"state": "aborted"}, w2={"age": 31})
    run = Run([poll(w2={"age": 30}), stopped], unreachable=("w1", "w2"))
    result = plugin(run, addresses={"w1": "10.0.0.1", "w2": "10.0.0.2"}).run(task_vars={"inventory_hostname": "coord"})
    assert result["status"] == "failed" and result["reason"] == "node w2 stopped answering (no heartbeat for 30s)"
    # The abort record names w2; the probe after the failure adds the node the coordinator cannot reach either.
    assert result["abort"]["lost"] == ["w2"] and result["lost"] == ["w1", "w2"]
    assert run.calls[1] == {"abort": "node w2 stopped answering (no heartbeat for 30s)", "lost": ["w2"]}
    assert "[coord] stopping the run on every node: node w2 stopped answering (no heartbeat for 30s)" in shown


def test_an_interrupted_watch_stops_the_run_and_gives_the_lock_back(shown):
    before = signal.getsignal(signal.SIGINT)
    run = Run([poll()], interrupt_at=2)
    with pytest.raises(KeyboardInterrupt):
        plugin(run).run(task_vars={"inventory_hostname": "coord"})
    assert [c for c in run.calls if c] == [{"abort": "interrupted on the controller"},
                                           {"release": "/shared/locks/ckpt"}]
    assert shown[-1] == "[coord] stopped the run on every node: interrupted on the controller"
    assert signal.getsignal(signal.SIGINT) == before


class FullDisk(Run):
    """run_status on a run whose disk fills after the first poll; the heartbeats then stop (they cannot be
    written), and a rank fails (it could not log)."""

    def __call__(self, task_vars, **kw):
        res = super(FullDisk, self).__call__(task_vars, **kw)
        res["disk"] = {"path": "/shared/runs/r1", "free": 0 if self.n > 1 else 10 << 20, "total": 48 << 20}
        return res


def test_a_full_disk_stops_the_run_and_is_named_before_what_it_caused(shown):
    failed = {"state": "finished", "role": "launcher", "exit_code": 1, "age": 25}
    run = FullDisk([poll(), poll(coord=failed, w1={"age": 25}, w2={"age": 25})])
    result = plugin(run).run(task_vars={"inventory_hostname": "coord"})
    cause = "disk full on coord: /shared/runs/r1 has 0 B free of 48.0 MiB"
    assert result["status"] == "failed" and result["reason"].startswith(cause)
    assert result["cause"].startswith(cause)
    aborts = [c for c in run.calls if c.get("abort")]
    assert aborts == [{"abort": result["cause"], "lost": [], "cause": result["cause"]}]
    assert any(line.startswith("[coord] stopping the run on every node: " + cause) for line in shown)


def test_the_long_poll_that_sees_the_end_marks_it_done_and_brings_the_run_back(shown, tmp_path, monkeypatch):
    """The status call writes DONE itself (finish), waits for the watchers, and packs the run directory: the watch
    judges SUCCESS from its answer, makes no done call, gives the lock back no second time, and writes the files
    into collect_dir (the play then copies nothing)."""
    from ansible_collections.multinode.deepspeed.plugins.module_utils.run.bundle import pack
    run_dir = tmp_path / "cluster" / "r1"
    (run_dir / "nodes").mkdir(parents=True)
    (run_dir / "hostfile").write_text("w1 slots=1\n")
    (run_dir / "nodes" / "coord.json").write_text('{"state": "finished"}')
    calls = []

    def module_call(module_name, module_args, task_vars):
        calls.append(dict(module_args))
        assert module_name == "multinode.deepspeed.run_status"
        if len(calls) == 1:
            return {"nodes": dict((h, beat()) for h in NODES), "abort": None, "ranks": {}, "done_ranks": [],
                    "now": time.time(), "moment": [1]}
        done = dict((h, beat("finished", role="launcher" if h == "coord" else "watcher", exit_code=0))
                    for h in NODES)
        return {"nodes": done, "abort": None, "ranks": {}, "done_ranks": [0, 1], "now": time.time(), "moment": [2],
                "finished_here": True, "bundle": pack(str(run_dir), module_args["bundle"])[0],
                "bundle_skipped": None}

    module = plugin(None, poll_interval=0.01, collect_dir=str(tmp_path / "controller" / "r1"))
    del module._status
    monkeypatch.setattr(module, "_execute_module", module_call)
    result = module.run(task_vars={"inventory_hostname": "coord"})
    assert result["status"] == "success" and result["collected"] is True and result["collected_files"] == 2
    assert (tmp_path / "controller" / "r1" / "hostfile").read_text() == "w1 slots=1\n"
    assert "bundle" not in result and "bundle" not in str(result.get("nodes"))
    assert len(calls) == 2 and not any(c.get("done") for c in calls)
    assert calls[1]["finish"] == {"nodes": NODES, "launchers": ["coord"], "world_size": 2,
                                  "release": "/shared/locks/ckpt"}
    assert calls[1]["bundle"] == 16 * 1024 * 1024 and calls[1]["wait"] == 0.01


def test_a_failed_run_is_not_unpacked_and_says_nothing_of_it(shown, tmp_path):
    failed = {"state": "finished", "role": "launcher", "exit_code": 3}
    run = Run([poll(coord=failed)])
    result = plugin(run, collect_dir=str(tmp_path / "c")).run(task_vars={"inventory_hostname": "coord"})
    assert result["status"] == "failed" and result["collected"] is False and result["collect_note"] is None
    assert not (tmp_path / "c").exists()


class Shrunk(Run):
    """run_status on an attempt on fewer nodes: its ranks step, w3 (a node it lacks) answers from the third look,
    and once the watch asks for a checkpoint the ranks save it at their next step."""

    def __init__(self, polls):
        super(Shrunk, self).__init__(polls)
        self.looks, self.asked = 0, None

    def __call__(self, task_vars, **kw):
        if "probe" in kw:
            self.calls.append(kw)
            self.looks += 1
            return {"reachable": {"w3": {"ok": self.looks >= 3, "error": None}}, "spares_held": None}
        if kw.get("save"):
            self.asked = 11 + len(self.calls)
        res = super(Shrunk, self).__call__(task_vars, **kw)
        step = 10 + len(self.calls)
        saved = {"saved_step": step} if self.asked and step > self.asked else {}
        res["ranks"] = dict((r, dict({"event": "step", "step": step, "time": time.time()}, **saved)) for r in "01")
        return res


def test_a_shrunken_attempt_grows_back_once_its_node_answers_at_a_checkpoint(shown, monkeypatch):
    monkeypatch.setattr(watch.grow, "due", lambda last, now, every=5: True)
    stopped = poll(coord={"state": "aborted"}, w1={"state": "aborted"}, w2={"state": "aborted"})
    run = Shrunk([poll()] * 8 + [stopped])
    spec = {"nodes": ["w3"], "spares": [], "width": 3, "missing": 1, "addresses": {"w3": "10.0.0.3"}}
    result = plugin(run, grow=spec).run(task_vars={"inventory_hostname": "coord"})
    looks = [c for c in run.calls if "probe" in c]
    assert len(looks) == 3 and looks[0] == {"probe": {"w3": "10.0.0.3"}, "probe_timeout": 0.5}
    assert [c["save"] for c in run.calls if c.get("save")] == ["grow back: w3 answers again"]
    assert result["status"] == "failed" and result["reason"].startswith(
        "grow back: w3 answers again; the run was checkpointed at step ")
    assert result["reason"].endswith(" and grows back to 3 nodes")
    assert "[coord] grow back: w3 answers again; checkpointing, then growing the run back to 3 nodes" in shown
    # Nothing looked for once the checkpoint was asked for.
    assert run.calls.index(looks[-1]) < next(i for i, c in enumerate(run.calls) if c.get("save"))


class Answered(Shrunk):
    """As Shrunk, but the ranks' save records are never among the lines a poll reads: only the trainer's answer
    (control/SAVED) says the checkpoint was saved; ``final`` makes it the run's last step's."""

    final = False

    def __call__(self, task_vars, **kw):
        res = super(Answered, self).__call__(task_vars, **kw)
        for rec in (res.get("ranks") or {}).values():
            rec.pop("saved_step", None)
        if self.asked:
            res["saved"] = {"step": 40 if self.final else self.asked + 1, "time": time.time()}
        return res


def test_the_trainers_answer_is_the_checkpoint_the_grow_back_waits_for(shown, monkeypatch):
    monkeypatch.setattr(watch.grow, "due", lambda last, now, every=5: True)
    stopped = poll(coord={"state": "aborted"}, w1={"state": "aborted"}, w2={"state": "aborted"})
    spec = {"nodes": ["w3"], "spares": [], "width": 3, "missing": 1, "addresses": {"w3": "10.0.0.3"}}
    run = Answered([poll()] * 8 + [stopped])
    result = plugin(run, grow=spec).run(task_vars={"inventory_hostname": "coord"})
    assert result["reason"].startswith("grow back: w3 answers again; the run was checkpointed at step %d" % (
        run.asked + 1))


def test_the_final_checkpoint_does_not_stop_a_run_to_grow(shown, monkeypatch):
    monkeypatch.setattr(watch.grow, "due", lambda last, now, every=5: True)
    launched = {"state": "finished", "role": "launcher", "exit_code": 0}
    done = poll(coord=launched, w1={"state": "finished"}, w2={"state": "finished"})
    spec = {"nodes": ["w3"], "spares": [], "width": 3, "missing": 1, "addresses": {"w3": "10.0.0.3"}}
    run = Answered([poll()] * 6 + [done])
    run.final = True
    result = plugin(run, grow=spec, total_steps=40).run(task_vars={"inventory_hostname": "coord"})
    assert result["status"] == "success" and not [c for c in run.calls if c.get("abort")]
    assert len([c for c in run.calls if c.get("save")]) == 1
