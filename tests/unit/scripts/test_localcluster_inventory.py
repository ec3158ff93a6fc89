import importlib.util
from pathlib import Path

import yaml

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "localcluster.py"
spec = importlib.util.spec_from_file_location("localcluster", SCRIPT)
localcluster = importlib.util.module_from_spec(spec)
spec.loader.exec_module(localcluster)


def test_spares_are_named_on_from_the_workers():
    assert localcluster.node_names(2, 1) == [("coord", "coordinator"), ("worker1", "workers"),
                                             ("worker2", "workers"), ("worker3", "spares")]
    assert localcluster.node_names(2) == [("coord", "coordinator"), ("worker1", "workers"), ("worker2", "workers")]


def test_the_inventory_has_a_spares_group_with_a_workers_slots_only_when_there_are_spares(tmp_path, monkeypatch):
    monkeypatch.setattr(localcluster, "INVENTORY_DIR", tmp_path)
    hosts = {"coord": {"group": "coordinator", "addr": "10.1.0.2"}, "worker1": {"group": "workers", "addr": "10.1.0.3"},
             "worker2": {"group": "spares", "addr": "10.1.0.4"}}
    localcluster.write_inventory(hosts, tmp_path / "id_ed25519")
    inv = yaml.safe_load((tmp_path / "hosts.yml").read_text())["all"]["children"]
    assert inv["spares"] == {"hosts": {"worker2": {"ansible_host": "10.1.0.4"}}, "vars": {"deepspeed_slots": 1}}
    assert inv["workers"]["vars"] == {"deepspeed_slots": 1} and "vars" not in inv["coordinator"]
    del hosts["worker2"]
    localcluster.write_inventory(hosts, tmp_path / "id_ed25519")
    assert "spares" not in yaml.safe_load((tmp_path / "hosts.yml").read_text())["all"]["children"]


def test_preflight_health_only_warns_on_nodes_that_share_this_machines_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(localcluster, "INVENTORY_DIR", tmp_path)
    hosts = {"coord": {"group": "coordinator", "addr": "10.1.0.2"}, "worker1": {"group": "workers", "addr": "10.1.0.3"}}
    localcluster.write_inventory(hosts, tmp_path / "id_ed25519")
    assert yaml.safe_load((tmp_path / "hosts.yml").read_text())["all"]["vars"]["preflight_health_action"] == "warn"
