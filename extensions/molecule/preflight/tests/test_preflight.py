"""The preflight role's report and record on the controller, and nothing left running on the nodes."""
import glob
import json
import os

NODES = ["mndsm-pf-coord", "mndsm-pf-w1", "mndsm-pf-w2"]
testinfra_hosts = ["podman://%s" % name for name in NODES]
EPHEMERAL = os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]


def report():
    with open(os.path.join(EPHEMERAL, "runs", "molecule-preflight", "preflight.json")) as fh:
        return json.load(fh)


def verdicts(check):
    return dict((v["host"], v) for v in report()["verdicts"] if v["check"] == check)


def test_the_report_passes_with_a_verdict_per_node():
    doc = report()
    assert doc["status"] == "pass", doc["findings"]
    assert set(verdicts("names")) == set(NODES) and all(v["status"] == "pass" for v in verdicts("names").values())
    assert set(verdicts("versions")) == set(NODES)
    assert "deepspeed 0.19.8" in verdicts("versions")["mndsm-pf-w2"]["detail"]
    assert set(verdicts("clock")) == set(NODES)
    assert [v["status"] for v in verdicts("ssh").values()] == ["skip"]


def test_the_master_port_was_listened_on_and_reached_from_both_workers():
    port = verdicts("master_port")
    assert set(port) == {"mndsm-pf-w1", "mndsm-pf-w2"}
    assert all(v["status"] == "pass" for v in port.values()), port
    assert report()["raw"]["port"]["listener"]["rc"] == 0


def test_the_bandwidth_test_was_skipped_as_asked():
    assert [v["status"] for v in verdicts("bandwidth").values()] == ["skip"]
    assert "preflight_bandwidth=false" in list(verdicts("bandwidth").values())[0]["detail"]


def test_a_pass_is_recorded_for_reuse_and_a_health_check_that_cannot_run_is_named():
    cache = os.path.join(EPHEMERAL, "preflight-cache")
    records = [p for p in glob.glob(os.path.join(cache, "*.json")) if os.path.basename(p) != "health.json"]
    assert len(records) == 1
    # The scenario's venv is a stand-in (pyvenv.cfg and dist-info names, no Python): the health figures cannot be
    # measured there, which each worker's verdict says (a warning, never the failure), and no history is kept.
    health = verdicts("health")
    assert set(health) == {"mndsm-pf-w1", "mndsm-pf-w2"}
    assert all(v["status"] == "warn" and v["detail"].startswith("not measured: ") for v in health.values()), health
    assert not os.path.exists(os.path.join(cache, "health.json"))
    with open(records[0]) as fh:
        record = json.load(fh)
    assert record["status"] == "pass" and record["run_id"] == "molecule-preflight"
    assert os.path.basename(records[0]) == record["key"] + ".json"


def test_nothing_is_left_running_or_written_on_the_node(host):
    assert not host.socket("tcp://0.0.0.0:29500").is_listening
    assert host.run("pgrep -f '[n]ode_probe'").rc != 0  # the bracket keeps pgrep from matching its own shell
    assert not host.file("/srv/multinode-deepspeed/runs").exists
