"""The preflight_cache action on the controller: its verdict, printed as the task runs, and the reused record it
gives the run's summary (the role's decide step is this one task)."""
import json
import time
from unittest.mock import patch

from ansible_collections.multinode.deepspeed.plugins.action import preflight_cache
from ansible_collections.multinode.deepspeed.plugins.module_utils.preflight.evaluate import reuse_key
from tests.unit.plugins.action_task import action_plugin

JOB = {"coordinators": ["coord"], "rank_hosts": ["worker1", "worker2"], "slots": {"worker1": 1, "worker2": 1},
       "master": "worker1", "master_addr": "10.0.0.11", "master_port": 29500, "backend": "pdsh",
       "accelerator": "cpu", "env": {}, "shared_dir": "/shared", "home": "/home/deepspeed"}
HOSTVARS = dict((h, {"ansible_host": "10.0.0.%d" % n, "multinode_node": {"ipv4": ["10.0.0.%d" % n],
                                                                         "fingerprint": "f%d" % n}})
                for n, h in enumerate(["coord", "worker1", "worker2"], start=10))


def decide(tmp_path, **args):
    plugin = action_plugin(preflight_cache.ActionModule, "multinode.deepspeed.preflight_cache",
                           dict(dict(job=JOB, settings={}, max_age=3600, force=False, cache_dir=str(tmp_path)), **args))
    with patch.object(preflight_cache.display, "display") as shown:
        res = plugin.run(task_vars={"hostvars": HOSTVARS})
    return res, [c.args[0] for c in shown.call_args_list]


def record(tmp_path, age, status="pass"):
    key = reuse_key(JOB, HOSTVARS, {})
    rec = {"key": key, "status": status, "time": time.time() - age, "run_id": "pf-1", "report": "r.json"}
    (tmp_path / (key + ".json")).write_text(json.dumps(rec))
    return rec


def test_a_recent_pass_stands_and_is_the_runs_record(tmp_path):
    rec = record(tmp_path, 30)
    res, shown = decide(tmp_path)
    assert res["reuse"] is True and res["record"] == rec
    assert res["result"] == dict(rec, reused=True, reason=res["reason"])
    assert shown == ["Preflight reused: " + res["reason"]] and "(pf-1)" in res["reason"]


def test_no_record_an_old_one_or_force_runs_the_checks_and_says_why(tmp_path):
    res, shown = decide(tmp_path)
    assert res["reuse"] is False and res["result"] is None and res["record"] is None
    assert shown == ["Preflight runs: no passing preflight recorded for this job layout, stack and addresses"]
    record(tmp_path, 7200)
    res, shown = decide(tmp_path)
    assert res["result"] is None and shown[0].startswith("Preflight runs: the last passing preflight is 7200 s old")
    record(tmp_path, 30)
    res, shown = decide(tmp_path, force=True)
    assert res["result"] is None and shown == ["Preflight runs: preflight=force: checking again"]


def test_a_bad_setting_fails_before_any_verdict(tmp_path):
    res, shown = decide(tmp_path, max_age="soon")
    assert res["failed"] is True and "preflight_max_age='soon'" in res["msg"] and shown == []
