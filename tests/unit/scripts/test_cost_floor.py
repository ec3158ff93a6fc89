"""scripts/cost/floor.py: the node names spread over the workers, and their SSH configuration (host keys checked
under the worker's own name; kept connections only where asked)."""
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
spec = importlib.util.spec_from_file_location("cost_floor", ROOT / "scripts" / "cost" / "floor.py")
cost_floor = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cost_floor)

WORKERS = {"worker1": {"hostname": "10.89.0.11", "user": "deepspeed", "identityfile": "/home/deepspeed/.ssh/k"},
           "worker2": {"hostname": "10.89.0.12", "user": "deepspeed", "identityfile": "/home/deepspeed/.ssh/k"}}


def blocks(text):
    """Host -> its settings (lower-case keyword -> value)."""
    out, host = {}, None
    for line in text.splitlines():
        key, value = line.strip().split(None, 1)
        if key == "Host":
            host = value
            out[host] = {}
        else:
            out[host][key.lower()] = value
    return out


def test_names_go_to_the_workers_in_turn():
    names = cost_floor.names_for(5, ["worker1", "worker2"])
    assert names == [("mnds-floor-1", "worker1"), ("mnds-floor-2", "worker2"), ("mnds-floor-3", "worker1"),
                     ("mnds-floor-4", "worker2"), ("mnds-floor-5", "worker1")]
    assert len(set(n for n, _w in cost_floor.names_for(16, ["worker1", "worker2"]))) == 16


def test_each_name_reaches_its_worker_with_the_worker_host_key_checked():
    names = cost_floor.names_for(3, ["worker1", "worker2"])
    cfg = blocks(cost_floor.ssh_config(names, WORKERS, kept=False))
    assert sorted(cfg) == ["mnds-floor-1", "mnds-floor-2", "mnds-floor-3"]
    assert cfg["mnds-floor-2"]["hostname"] == "10.89.0.12" and cfg["mnds-floor-2"]["hostkeyalias"] == "worker2"
    for settings in cfg.values():
        assert settings["stricthostkeychecking"] == "yes" and settings["batchmode"] == "yes"
        assert settings["identitiesonly"] == "yes" and settings["user"] == "deepspeed"
        assert "controlmaster" not in settings


def test_kept_connections_are_one_per_name():
    names = cost_floor.names_for(4, ["worker1", "worker2"])
    cfg = blocks(cost_floor.ssh_config(names, WORKERS, kept=True))
    assert all(s["controlmaster"] == "auto" and s["controlpersist"] == "300" for s in cfg.values())
    # %n is the name as given, so two names on one worker keep two connections, as two nodes would
    assert {s["controlpath"] for s in cfg.values()} == {cost_floor.WORK + "/cm-%n"}
