import copy
import json
import re
from pathlib import Path

import pytest

from ansible_collections.multinode.deepspeed.plugins.modules import preflight_report

GLOO = json.loads((Path(__file__).resolve().parents[3] / "fixtures" / "preflight" / "gloo-2node-podman.json")
                  .read_text())
T0 = 1767225600.0
NODES = ["coord", "worker1", "worker2"]
ADDR = {"coord": "10.89.0.2", "worker1": "10.89.0.3", "worker2": "10.89.0.4"}
STACK = {"python": "3.11.2", "torch": "2.13.0+cpu", "cuda": None, "nccl": None, "deepspeed": "0.19.8",
         "transformers": "4.57.1", "trainer": "0.3.0"}


def data():
    """What playbooks/preflight.yml gathers for coord + worker1 + worker2 (pdsh, cpu, tcp)."""
    probe = dict((h, {"changed": False, "hostname": h, "user": "deepspeed", "time": T0 + 0.1,
                      "controller_before": T0, "controller_after": T0 + 0.2,
                      "resolved": dict((n, {"addresses": [ADDR[n]]}) for n in NODES),
                      "disk": {"/srv/md": {"free_bytes": 50 << 30}, "/opt/md": {"free_bytes": 50 << 30}},
                      "memlock": {"soft": 8192, "hard": 8192}, "ssh": {}}) for h in NODES)
    ok = {"rc": 0, "stdout": "8192", "stderr": "", "seconds": 0.05}
    return {
        "job": {"run_id": "preflight-1", "backend": "pdsh", "accelerator": "cpu", "profile": "tcp",
                "coordinators": ["coord"], "rank_hosts": {"worker1": 1, "worker2": 1}, "world_size": 2,
                "master": "worker1", "master_addr": "10.89.0.3", "master_port": 29500,
                "shared_dir": "/srv/md", "local_dir": "/opt/md",
                # The plan's launch as pdsh describes it: the coordinator logs in to every node, ranks start over SSH.
                "launch": {"ssh_pairs": [["coord", n] for n in NODES], "ranks_over_ssh": True}},
        "versions": dict((h, dict(STACK)) for h in NODES),
        "probes": probe,
        "ssh": {"coord": {"changed": False, "ssh": dict((t, dict(ok)) for t in NODES)},
                "worker1": {"changed": False, "ssh": {"worker1": dict(ok)}},
                "worker2": {"changed": False, "ssh": {"worker2": dict(ok)}}},
        "port": {"listener": {"finished": 1, "rc": 0, "stderr": ""},
                 "probes": [{"item": "worker1", "rc": 0, "stderr": ""}, {"item": "worker2", "rc": 0, "stderr": ""}]},
        "gpus": {"worker1": 0, "worker2": 0},
        "expected_addresses": dict(ADDR),
        "own_addresses": dict((h, [a]) for h, a in ADDR.items()),
        "link_gbps": {"worker1": 10.0, "worker2": 10.0},
        "bandwidth": {"primary": {"label": "tcp", "ok": True, "error": "", "raw": GLOO}, "fallback": None},
        "version_table": "HOST     DEEPSPEED\ncoord    0.19.8",
    }


def test_writes_json_and_text(tmp_path, run_module):
    dest = tmp_path / "runs" / "preflight-1"
    res = run_module(preflight_report, {"data": data(), "dest": str(dest)})
    assert res["changed"] is True and res["status"] == "pass" and res["findings"] == []
    assert res["path"] == str(dest / "preflight.json")
    doc = json.loads((dest / "preflight.json").read_text())
    assert doc["status"] == "pass" and doc["job"]["run_id"] == "preflight-1"
    assert doc["verdicts"] == res["verdicts"] and len(doc["verdicts"]) > 10
    assert doc["settings"]["max_clock_skew"] == 2.0
    assert doc["raw"]["bandwidth"]["primary"]["raw"]["results"] == GLOO["results"]
    assert set(doc["raw"]) == {"versions", "ssh", "port", "gpus", "link_gbps", "bandwidth", "health"}
    assert doc["bandwidth"]["primary"]["status"] == "pass" and doc["created"].endswith("Z")
    text = (dest / "preflight.txt").read_text()
    assert text == res["text"]
    assert text.startswith("Preflight preflight-1: PASS\n")
    assert "ranks worker1=1, worker2=1" in text and "master worker1:29500" in text
    for part in ("HOST     DEEPSPEED", "from\\to", "all_reduce tcp (gloo, 2 ranks on 2 nodes): PASS", "check"):
        assert part in text
    assert "Failures:" not in text and "Advice:" not in text
    assert set(res["tables"]) == {"ssh", "bandwidth", "verdicts"}


def test_failures_are_reported_not_failed(tmp_path, run_module):
    d = data()
    d["versions"]["worker2"]["deepspeed"] = "0.19.7"
    res = run_module(preflight_report, {"data": d, "dest": str(tmp_path)})
    assert not res.get("failed") and res["status"] == "fail"
    assert len(res["findings"]) == 1 and res["findings"][0].startswith("versions on worker2:")
    text = (tmp_path / "preflight.txt").read_text()
    assert text.startswith("Preflight preflight-1: FAIL") and "Failures:\n  versions on worker2:" in text
    assert json.loads((tmp_path / "preflight.json").read_text())["findings"] == res["findings"]


def test_settings_are_applied(tmp_path, run_module):
    res = run_module(preflight_report, {"data": data(), "settings": {"min_free_gib_local": 100, "max_clock_skew": None}})
    assert res["status"] == "fail"
    assert sorted(f.split(":")[0] for f in res["findings"]) == ["disk on coord", "disk on worker1", "disk on worker2"]


def test_advice_is_in_the_text(run_module):
    d = data()
    d["job"].update(accelerator="cuda", profile="ib")
    d["versions"] = dict((h, dict(STACK, torch="2.13.0+cu128", cuda="12.8", nccl="2.27.3")) for h in NODES)
    d["gpus"] = {"worker1": 1, "worker2": 1}
    d["ssh"]["coord"]["ssh"]["worker1"]["stdout"] = "unlimited"
    d["ssh"]["coord"]["ssh"]["worker2"]["stdout"] = "unlimited"
    d["link_gbps"] = {"worker1": 400.0, "worker2": 400.0}
    d["tcp_link_gbps"] = {"worker1": 10.0, "worker2": 10.0}
    d["bandwidth"] = {"primary": {"label": "ib", "ok": False, "raw": None,
                                  "error": "worker1: NCCL WARN Call to ibv_modify_qp failed"},
                      "fallback": {"label": "tcp", "ok": True, "error": "", "raw": GLOO}}
    res = run_module(preflight_report, {"data": d})
    assert res["status"] == "fail" and res["advice"]["variable"] == "nccl_profile"
    assert "Advice: " + res["advice"]["message"] in res["text"]
    assert "all_reduce tcp (fallback test): PASS" in res["text"]


def test_check_mode_writes_nothing(tmp_path, run_module):
    dest = tmp_path / "out"
    res = run_module(preflight_report, {"data": data(), "dest": str(dest), "_ansible_check_mode": True})
    assert res["changed"] is False and res["path"] is None and res["status"] == "pass"
    assert not dest.exists()
    assert res["text"].startswith("Preflight preflight-1: PASS")


def test_without_dest_nothing_is_written(tmp_path, run_module, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = run_module(preflight_report, {"data": data()})
    assert res["changed"] is False and res["path"] is None and res["status"] == "pass"
    assert list(tmp_path.iterdir()) == []


def test_rewrite_replaces_the_files(tmp_path, run_module):
    run_module(preflight_report, {"data": data(), "dest": str(tmp_path)})
    d = data()
    d["probes"]["worker2"] = {"skipped": True}
    res = run_module(preflight_report, {"data": d, "dest": str(tmp_path)})
    assert res["status"] == "fail"
    assert json.loads((tmp_path / "preflight.json").read_text())["status"] == "fail"
    assert "probe on worker2: the node did not answer the probe" in (tmp_path / "preflight.txt").read_text()


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.pop("job"), "KeyError: 'job'"),
    (lambda d: d["job"].pop("backend"), "KeyError: 'backend'"),
    (lambda d: d["probes"]["worker1"].update(controller_after=T0 - 5), "PreflightError: controller_after < "),
    (lambda d: d["bandwidth"]["primary"]["raw"].update(world_size=0), "PreflightError: .*at least one rank"),
    (lambda d: d["job"].update(rank_hosts={"worker1": "many"}), "ValueError"),
])
def test_bad_data_fails_with_a_clear_message(tmp_path, run_module, mutate, match):
    d = copy.deepcopy(data())
    mutate(d)
    res = run_module(preflight_report, {"data": d, "dest": str(tmp_path / "out")})
    assert res["failed"] is True
    assert res["msg"].startswith("cannot judge the preflight data: ")
    assert re.search(match, res["msg"]), res["msg"]
    assert not (tmp_path / "out").exists()


def test_data_is_required(run_module):
    res = run_module(preflight_report, {})
    assert res["failed"] is True and "data" in res["msg"]
