"""Preflight's master port check (module_utils/preflight/port.py), on the results as Ansible registers them."""
import copy

import pytest

from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.port import normalize_port, port_verdicts

from tests.unit.plugins.module_utils.preflight.preflight_data import LISTENER_OK, LISTENER_TAKEN, PROBES_OK


def test_normalize_port_from_registered_results():
    probes = copy.deepcopy(PROBES_OK)
    probes[1].update(rc=1, stderr="cannot reach 10.89.0.3:29500: [Errno 111] Connection refused\n")
    res = normalize_port({"listener": LISTENER_OK, "probes": probes})
    assert res == {"listener": {"rc": 0, "msg": ""},
                   "probes": {"worker1": {"rc": 0, "msg": ""},
                              "worker2": {"rc": 1, "msg": "cannot reach 10.89.0.3:29500: [Errno 111] Connection refused"}}}
    taken = normalize_port({"listener": LISTENER_TAKEN, "probes": PROBES_OK})
    assert taken["listener"] == {"rc": 1, "msg": "port 29500 is not free: [Errno 98] Address already in use"}


@pytest.mark.parametrize("listener, rc", [({"finished": 1}, 0), ({"finished": 0}, 1), ({"finished": 1, "failed": True}, 1),
                                          ({}, 1), ({"rc": "0"}, 0)])
def test_normalize_port_listener_without_rc(listener, rc):
    assert normalize_port({"listener": listener})["listener"]["rc"] == rc


def test_normalize_port_keeps_a_dict_and_reads_msg():
    probes = {"w1": {"rc": 0, "msg": ""}}
    res = normalize_port({"listener": {"rc": 1, "msg": " boom "}, "probes": probes})
    assert res["probes"] is probes and res["listener"]["msg"] == "boom"
    unreachable = normalize_port({"probes": [{"item": "w2", "unreachable": True, "msg": "timed out"}]})
    assert unreachable["probes"] == {"w2": {"rc": 1, "msg": "timed out"}}


def test_port_verdicts():
    port = normalize_port({"listener": LISTENER_OK, "probes": PROBES_OK})
    res = port_verdicts("worker1", 29500, port["listener"], port["probes"])
    assert [(v["host"], v["status"]) for v in res] == [("worker1", "pass"), ("worker1", "pass"), ("worker2", "pass")]
    assert res[0]["detail"] == "port 29500 free on the master" and res[2]["detail"] == "reaches worker1:29500"
    bad = port_verdicts("worker1", 29500, {"rc": 0}, {"worker2": {"rc": 1, "msg": "timed out"}})
    assert bad[1]["status"] == "fail" and bad[1]["detail"] == "cannot reach worker1:29500: timed out"
    assert "open port 29500 between worker2 and worker1" in bad[1]["fix"]


def test_port_taken_fails_once_on_the_master():
    port = normalize_port({"listener": LISTENER_TAKEN, "probes": PROBES_OK})
    res = port_verdicts("worker1", 29500, port["listener"], port["probes"])
    assert len(res) == 1 and res[0]["status"] == "fail" and res[0]["host"] == "worker1"
    assert "Address already in use" in res[0]["detail"] and "ss -ltnp on worker1" in res[0]["fix"]
