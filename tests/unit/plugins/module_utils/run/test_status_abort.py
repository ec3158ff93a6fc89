"""The controller's ABORT record (module_utils/run/status.py) is created exclusively: an ABORT an agent wrote first,
which names the real cause, is never overwritten - not when the agent writes it just after the controller looked,
and not through a link left in its place."""
import json
import os

from ansible_collections.multinode.deepspeed.plugins.module_utils.run import status

AGENT = {"reason": "rank 1 on worker2 exited with 1", "host": "worker2", "time": 1.0}


def params(run_dir, **more):
    p = dict((k, v.get("default")) for k, v in status.ARGUMENT_SPEC.items())
    p.update(run_dir=str(run_dir), abort="interrupted on the controller")
    p.update(more)
    return p


def test_an_agents_abort_written_after_the_controller_looked_is_kept(tmp_path, monkeypatch):
    control = tmp_path / "r1" / "control"
    control.mkdir(parents=True)
    abort = str(control / "ABORT")
    real_open = os.open

    def racing_open(path, flags, *args, **kw):
        # The agent writes its record just before the controller's own open of the same name.
        if str(path) == abort and not os.path.lexists(abort):
            fd = real_open(abort, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, json.dumps(AGENT).encode())
            os.close(fd)
        return real_open(path, flags, *args, **kw)

    monkeypatch.setattr(os, "open", racing_open)
    res = status.status(params(tmp_path / "r1"))
    monkeypatch.undo()
    assert json.loads((control / "ABORT").read_text()) == AGENT
    assert res["changed"] is False and res["abort"] == AGENT


def test_a_link_in_the_place_of_abort_is_not_written_through(tmp_path):
    control = tmp_path / "r1" / "control"
    control.mkdir(parents=True)
    target = tmp_path / "elsewhere"
    os.symlink(str(target), str(control / "ABORT"))
    res = status.status(params(tmp_path / "r1"))
    assert not target.exists() and res["changed"] is False


def test_with_no_abort_there_the_controllers_is_written(tmp_path):
    res = status.status(params(tmp_path / "r1", lost=["worker2"]))
    record = json.loads((tmp_path / "r1" / "control" / "ABORT").read_text())
    assert res["changed"] is True and record["reason"] == "interrupted on the controller"
    assert (record["host"], record["lost"]) == ("controller", ["worker2"])
